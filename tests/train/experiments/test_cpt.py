"""Attention positions when extending (train/experiments/cpt.py extended_attention): the softmax
layer's YaRN option (factor 1 = RoPE), ABF's base, DroPE = NoPE outputs, YaRN's factor and
original length from the lengths, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines.rope_scaling import YarnScaling
from fpa_jax.layers.softmax import SoftmaxAttention
from tests.seeds import case_seed
from train.core.config import ConfigError
from train.core.presets import load_config
from train.experiments.cpt import extended_attention

HYBRID = ["model.pattern=GA", "model.num_layers=2", "attention.kind=softmax",
          "attention.position=rope", "attention.num_heads=2", "attention.head_dim=16"]


def test_softmax_layer_with_yarn_option():
    rng = np.random.default_rng(case_seed(1403))
    x = jnp.asarray(rng.normal(size=(2, 9, 32)), jnp.float32)
    rope = SoftmaxAttention(2, 16, position="rope", rope_base=100.0)
    params = rope.init(jax.random.PRNGKey(case_seed(1404)), x)
    plain = rope.apply(params, x)
    at_one = SoftmaxAttention(2, 16, rope_base=100.0, rope_scaling=YarnScaling(1.0, 4)).apply(params, x)
    scaled = SoftmaxAttention(2, 16, rope_base=100.0, rope_scaling=YarnScaling(8.0, 4)).apply(params, x)
    np.testing.assert_allclose(at_one, plain, atol=1e-5)
    assert np.abs(np.asarray(scaled) - np.asarray(plain)).max() > 1e-3
    with pytest.raises(ValueError, match="rope_scaling"):
        SoftmaxAttention(2, 16, position="nope", rope_scaling=YarnScaling(2.0, 4)).apply(params, x)


def _extended(reference_overrides, overrides):
    reference = load_config("tiny_hybrid", HYBRID + reference_overrides)
    config = load_config("tiny_hybrid", HYBRID + ["data.seq_len=1024", "cpt.reference=r"] + overrides)
    return extended_attention(config, reference, 1024 / reference.data.seq_len)


def test_abf_and_drope_configs():
    abf = _extended(["attention.rope_base=20000"], ["cpt.positions=abf"])
    assert abf.attention.rope_base == pytest.approx(20000 * 4.0 ** (16 / 14))   # from the reference's
    assert abf.attention.position == "rope"
    assert _extended([], ["cpt.positions=abf", "cpt.rope_base=5e5"]).attention.rope_base == 5e5
    assert _extended([], ["attention.rope_base=123"]).attention.rope_base == 123   # keep

    drope = _extended([], ["cpt.positions=drope"])
    assert drope.attention.position == "nope"
    from train.core.model import build_mixer

    rng = np.random.default_rng(case_seed(1405))
    x = jnp.asarray(rng.normal(size=(1, 11, 64)), jnp.float32)
    rope = build_mixer(load_config("tiny_hybrid", HYBRID), 1, name=None)
    params = rope.init(jax.random.PRNGKey(case_seed(1406)), x)
    dropped = build_mixer(drope, 1, name=None).apply(params, x)
    nope = SoftmaxAttention(2, 16, position="nope").apply(params, x)
    np.testing.assert_allclose(dropped, nope, atol=1e-6)
    assert np.abs(np.asarray(dropped) - np.asarray(rope.apply(params, x))).max() > 1e-4


def test_yarn_config_chains_factors():
    yarn = _extended([], ["cpt.positions=yarn"])
    assert (yarn.attention.yarn_factor, yarn.attention.yarn_original_length) == (4.0, 256)


@pytest.mark.parametrize("overrides, reference, message", [
    (["cpt.positions=abf", "model.pattern=G"], ["model.pattern=G"], "no attention layers"),
    (["cpt.positions=yarn", "attention.kind=selective"], ["attention.kind=selective"], "RoPE"),
    (["cpt.positions=abf"], ["attention.position=nope"], "RoPE"),
    (["cpt.rope_base=5e5"], [], "positions=abf only"),
    (["cpt.positions=abf", "cpt.rope_base=50"], [], "must exceed"),
])
def test_refusals(overrides, reference, message):
    with pytest.raises(ConfigError, match=message):
        _extended(reference, overrides)
