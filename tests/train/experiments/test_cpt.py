"""Attention positions when extending (fpa_jax/baselines/rope_scaling.py, train/experiments/cpt.py
extended_attention): YaRN's frequencies against hand-computed values, YaRN with factor 1 = RoPE,
relative positions kept, ABF's base, DroPE = NoPE outputs, and the refusals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines.rope import apply_rope
from fpa_jax.baselines.rope_scaling import (YarnScaling, abf_base, rotate_yarn,
                                            yarn_attention_factor, yarn_frequencies)
from fpa_jax.layers.softmax import SoftmaxAttention
from tests.seeds import case_seed
from train.core.config import ConfigError
from train.core.presets import load_config
from train.experiments.cpt import extended_attention

HYBRID = ["model.pattern=GA", "model.num_layers=2", "attention.kind=softmax",
          "attention.position=rope", "attention.num_heads=2", "attention.head_dim=16"]


def test_yarn_frequencies_by_hand():
    # D = 8, base 1e4: omega = 1, 0.1, 0.01, 0.001; L0 = 64 -> turns = 64 omega / (2 pi)
    # = 10.186, 1.0186, 0.1019, 0.0102; ramp = (turns - 1) / 31 clipped = 0.29633, 0.00060, 0, 0
    got = np.asarray(yarn_frequencies(8, 1e4, YarnScaling(4.0, 64)))
    ramp0 = (64 / (2 * math.pi) - 1) / 31
    ramp1 = (6.4 / (2 * math.pi) - 1) / 31
    expected = [ramp0 + (1 - ramp0) / 4, 0.1 * (ramp1 + (1 - ramp1) / 4), 0.01 / 4, 0.001 / 4]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(expected[:2], [0.472245, 0.025045], rtol=1e-4)
    assert yarn_attention_factor(4.0) == pytest.approx(1.0 + 0.1 * math.log(4.0))
    assert abf_base(1e4, 4.0, 16) == pytest.approx(1e4 * 4.0 ** (16 / 14))


def test_yarn_rotation_is_rope_at_factor_one_and_keeps_relative_positions():
    rng = np.random.default_rng(case_seed(1402))
    q, k = (jnp.asarray(rng.normal(size=(2, 7, 3, 8)), jnp.float32) for _ in range(2))
    positions = jnp.asarray(rng.integers(0, 500, size=(2, 7)), jnp.int32)
    q1, k1 = rotate_yarn(q, k, positions, base=500.0, scaling=YarnScaling(1.0, 32))
    np.testing.assert_allclose(q1, apply_rope(q, positions, base=500.0), atol=1e-5)
    np.testing.assert_allclose(k1, apply_rope(k, positions, base=500.0), atol=1e-5)

    scaling = YarnScaling(float(rng.uniform(2, 16)), int(rng.integers(8, 128)))
    offset = int(rng.integers(1, 1000))
    scores = []
    for shift in (0, offset):
        qr, kr = rotate_yarn(q, k, positions + shift, base=500.0, scaling=scaling)
        scores.append(np.einsum("bthd,bshd->bhts", qr, kr))
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-3, atol=1e-3)
    qr, _ = rotate_yarn(q, k, positions, base=500.0, scaling=scaling)
    np.testing.assert_allclose(np.linalg.norm(qr, axis=-1),
                               yarn_attention_factor(scaling.factor) * np.linalg.norm(q, axis=-1),
                               rtol=1e-5)
    assert np.abs(np.asarray(qr) / yarn_attention_factor(scaling.factor) - q1).max() > 1e-2


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


def test_unknown_position_method_is_a_config_error():
    with pytest.raises(ConfigError, match="cpt.positions"):
        load_config("tiny_hybrid", HYBRID + ["cpt.positions=ntk"])
