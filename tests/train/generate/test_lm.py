"""Generation through the language model: prefill + decode steps against the parallel forward
for every mixer family and a hybrid, greedy determinism, caches that follow the live keys
(eviction frees slots, growth, a clear error when full), and the CLI on a tiny trained
run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from fpa_jax import fpa_bias
from fpa_jax.baselines.dipsum import dip_sum_bias
from fpa_jax.decode import layers as attention
from fpa_jax.decode import slots
from fpa_jax.layers import FoXAttention, FPAAttention
from fpa_jax.layers.common import attention_scale
from train.cli.entry import main
from train.core.model import build_model
from train.core.presets import load_config
from train.generate import mixers
from train.generate.driver import CacheFullError, Generator, planned_capacity
from train.generate.eviction_study import masked_attention, masked_logits
from train.generate.lm import Decoder
from train.generate.sampling import SamplingConfig
from tests.seeds import case_seed

VOCAB = 64
TINY = ["model.d_model=16", "model.vocab_size=64", "attention.num_heads=2",
        "attention.head_dim=8", "gdn.num_heads=2", "gdn.head_dim=8",
        "attention.implementation=reference", "gdn.implementation=reference"]  # quick compiles
MODELS = {
    "fpa": ("tiny_fpa", ["model.num_layers=1"]),
    "fox": ("tiny_fox", ["model.num_layers=1"]),
    "hybrid": ("tiny_hybrid", ["model.num_layers=2", "model.pattern=GA",
                               "attention.position=alibi"]),
}


def _tokens(seed, shape):
    """Random token ids, drawn with NumPy (jax.random would compile a program per shape)."""
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, shape, np.int32))


def tiny_model(name, seed):
    preset, extra = MODELS[name]
    model = build_model(load_config(preset, [*TINY, *extra]), VOCAB)
    tokens = jnp.zeros((1, 4), jnp.int32)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), tokens, tokens)["params"])
    return model, params


def parallel_logits(model, params, tokens):
    return jax.jit(lambda p, t: model.apply({"params": p}, t, jnp.ones_like(t)))(params, tokens)


@pytest.mark.parametrize("name", ["fpa", "fox", "hybrid"])   # hybrid: GatedDeltaNet + ALiBi
def test_prefill_and_decode_steps_reproduce_the_parallel_logits(name):
    seed = case_seed(20 + list(MODELS).index(name))
    model, params = tiny_model(name, seed)
    length, prefix = 9, 4
    tokens = _tokens(seed, (2, length))
    np.testing.assert_allclose(decode_logits(Decoder(model, evict_below=None), params, tokens,
                                             prefix),
                               parallel_logits(model, params, tokens), atol=1e-4, rtol=1e-4,
                               err_msg=f"{name}, seed {seed}")


def fast_decay(params, rate=-6.0):
    """FPA params whose walk falls by -rate per token: a key dies -10 / rate tokens later."""
    mixer = params["layers_0"]["mixer"]
    mixer["delta_proj"]["bias"] = jnp.full_like(mixer["delta_proj"]["bias"], rate)
    return params


def decode_logits(decoder, params, tokens, prefix):
    """Logits of prefill(tokens[:, :prefix]) then one step per later token (one jit)."""
    length = tokens.shape[1]

    def decode(params, tokens):
        logits, caches = decoder.prefill(params, tokens[:, :prefix])
        caches = tuple(c if mixers.slot_cache(c) is None
                       else {**c, "slots": slots.resize(c["slots"], length)} for c in caches)

        def step(caches, token):
            logits_t, caches = decoder.step(params, token, caches)
            return caches, logits_t

        _, stepped = jax.lax.scan(step, caches, tokens[:, prefix:].T)
        return jnp.concatenate([logits, jnp.moveaxis(stepped, 0, 1)], axis=1)

    return jax.jit(decode)(params, tokens)


def test_decoding_with_eviction_equals_the_dense_study_with_those_keys_masked():
    seed = case_seed(33)
    model, params = tiny_model("fpa", seed)
    params = fast_decay(params, rate=-4.0)
    tokens = _tokens(seed, (2, 10))
    decoder = Decoder(model, evict_below=-10.0)
    decoded = decode_logits(decoder, params, tokens, 1)
    for block in (128, 3):                            # one query block; four, the last short
        study, counts = jax.jit(lambda p, t: masked_logits(
            decoder, p, t, jnp.ones_like(t), "evict", -10.0, 0, block=block))(params, tokens)
        (kept, causal), = counts
        assert int(kept[:, -1].sum()) < int(causal[:, -1].sum())      # keys were evicted
        np.testing.assert_allclose(decoded, study, atol=1e-4, rtol=1e-4,
                                   err_msg=f"seed {seed}, block {block}")


def test_the_full_study_of_a_hybrid_is_the_parallel_forward():
    """masked_logits in "full" mode keeps every causal key of the attention layer and runs the
    recurrent GatedDeltaNet layer's parallel forward: the model's own logits; only the
    attention layer counts keys."""
    seed = case_seed(34)
    model, params = tiny_model("hybrid", seed)
    tokens = _tokens(seed, (2, 7))
    decoder = Decoder(model, evict_below=None)
    study, counts = jax.jit(lambda p, t: masked_logits(
        decoder, p, t, jnp.ones_like(t), "full", None, 0, block=3))(params, tokens)
    np.testing.assert_allclose(study, parallel_logits(model, params, tokens), atol=1e-4,
                               rtol=1e-4, err_msg=f"seed {seed}")
    assert counts == []                         # ALiBi does not evict, GDN has no keys


ORACLE_LAYERS = {
    "fpa": FPAAttention(num_heads=2, head_dim=4, implementation="reference"),
    "fpa_query_level": FPAAttention(num_heads=2, head_dim=4, query_level=True,
                                    implementation="reference"),
    "fpa_dip_sum": FPAAttention(num_heads=2, head_dim=4, dip_sum=True,
                                implementation="reference"),
    "fox": FoXAttention(num_heads=2, head_dim=4, implementation="reference"),
}


def dense_bias(layer, params, x):
    """[B, H, T, T] bias of every (query, key) pair from the dense references (test oracle)."""
    if attention.is_fpa_bias(layer):
        delta, g, h = attention.fpa_scalars(layer, params, x)
        walk = jnp.cumsum(delta, axis=1)
        beta = jax.nn.softplus(params["rho"])
        if layer.dip_sum:
            return dip_sum_bias(walk + g, walk + h, beta)
        return fpa_bias(walk + g, walk + h, beta, query_level=layer.query_level)  # -inf: s > t
    total = jnp.moveaxis(jnp.cumsum(attention.additive_increments(layer, params, x), 1), 2, 1)
    return total[..., :, None] - total[..., None, :]


def dense_masked_attention(layer, params, x, segment_ids, mode, evict_below, window):
    """masked_attention's results with every [B, H, T, T] array materialised (test oracle)."""
    q, k, v = attention.qkv(layer, params, x)
    bias = dense_bias(layer, params, x)
    position = jnp.arange(x.shape[1])
    valid = ((position[:, None] >= position[None, :])
             & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :]))  # [B, 1, T, T]
    keep = jnp.broadcast_to(valid, bias.shape)
    if mode == "evict" and attention.eviction(layer, evict_below) is not None:
        keep = keep & (bias >= evict_below)
    if mode == "window":
        keep = keep & (position[:, None] - position[None, :] < window)
    logits = bias + attention_scale(layer.head_dim) * jnp.einsum("bthd,bshd->bhts", q, k)
    weights = jax.nn.softmax(jnp.where(keep, logits, -jnp.inf), axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", weights, v)
    return attention.output(layer, params, out), (keep.sum((1, 3)),
                                                  bias.shape[1] * valid.sum((1, 3)))


@pytest.mark.parametrize("name", sorted(ORACLE_LAYERS))
def test_blockwise_masked_attention_equals_the_dense_per_head_oracle(name):
    layer, seed = ORACLE_LAYERS[name], case_seed(40 + sorted(ORACLE_LAYERS).index(name))
    batch, length, width, block, window = 2, 37, 8, 8, 6       # 5 blocks, the last one short
    rng = np.random.default_rng(seed)   # NumPy: jax.random would compile per shape
    x = jnp.asarray(rng.standard_normal((batch, length, width), np.float32))
    params = nn.meta.unbox(layer.init(jax.random.PRNGKey(seed + 1), x)["params"])
    # perturbed: the zero-initialised maps depend on x
    params = jax.tree.map(lambda p: jnp.asarray(
        np.asarray(p) + np.float32(0.5) * rng.standard_normal(p.shape, np.float32)), params)
    cut = int(rng.integers(5, length - 5))                              # two documents
    segment_ids = jnp.broadcast_to(1 + (jnp.arange(length) >= cut), (batch, length))
    # a threshold halfway between two neighbouring bias values: no pair sits on it
    causal = np.asarray(dense_masked_attention(layer, params, x, segment_ids, "full", None,
                                               0)[1][1])
    values = np.unique(np.asarray(dense_bias(layer, params, x))[:, :, *np.tril_indices(length)])
    middle = len(values) // 2
    threshold = float(values[middle - 1] + values[middle]) / 2
    for mode in ("full", "evict", "window"):
        blockwise = jax.jit(lambda x: masked_attention(layer, params, x, segment_ids, mode,
                                                       threshold, window, block=block))(x)
        dense = dense_masked_attention(layer, params, x, segment_ids, mode, threshold, window)
        message = f"{name}, {mode}, seed {seed}"
        np.testing.assert_allclose(blockwise[0], dense[0], atol=2e-5, rtol=2e-5, err_msg=message)
        for got, expected in zip(blockwise[1], dense[1]):
            np.testing.assert_array_equal(got, expected, err_msg=message)
        np.testing.assert_array_equal(blockwise[1][1], causal, err_msg=message)
        evicting = mode == "window" or (mode == "evict" and name != "fpa_query_level")
        assert (int(blockwise[1][0].sum()) < int(causal.sum())) == evicting, message
    with pytest.raises(ValueError, match="block"):
        masked_attention(layer, params, x, segment_ids, "full", None, 0, block=0)


def test_greedy_generation_is_deterministic_and_follows_the_parallel_argmax():
    seed = case_seed(30)
    model, params = tiny_model("hybrid", seed)
    prompt = np.asarray(_tokens(seed, (2, 2)))  # < conv
    generator = Generator(Decoder(model), params, SamplingConfig(temperature=0.0), VOCAB - 3)
    first = generator.generate(prompt, 8, seed=1).tokens
    second = generator.generate(prompt, 8, seed=2).tokens
    np.testing.assert_array_equal(first, second)
    assert first.max() < VOCAB - 3                         # ids past the tokenizer never drawn
    logits = parallel_logits(model, params, jnp.asarray(np.concatenate([prompt, first], 1)))
    masked = np.where(np.arange(VOCAB) < VOCAB - 3, np.asarray(logits), -np.inf)
    np.testing.assert_array_equal(masked[:, 1:-1].argmax(-1), first)


def test_evicted_slots_are_reused_so_the_cache_stays_small_and_a_full_cache_is_an_error():
    model, params = tiny_model("fpa", case_seed(31))
    params = fast_decay(params)
    prompt = np.zeros((1, 3), np.int32)
    sampling = SamplingConfig(temperature=1.0)
    evicting = Generator(Decoder(model, evict_below=-10.0), params, sampling, VOCAB)
    result = evicting.generate(prompt, 24)
    assert result.capacities == [16] and result.live_keys[0] <= 4, result
    keeping = Generator(Decoder(model, evict_below=None), params, sampling, VOCAB)
    result = keeping.generate(prompt, 24)
    assert result.capacities == [32] and result.live_keys == [26], result   # grew past 16
    keeping.max_capacity = 16
    with pytest.raises(CacheFullError, match="max_capacity=16"):
        keeping.generate(prompt, 24)


def test_capacity_plan_grows_to_powers_of_two_and_shrinks_with_hysteresis():
    assert planned_capacity(0, 1, fresh=True) == 16 and planned_capacity(1, 1) == 16
    assert planned_capacity(15, 16) == 16 and planned_capacity(16, 16) == 32
    assert planned_capacity(64, 256) == 256 and planned_capacity(40, 256) == 128


def test_mixers_without_a_decoding_step_are_refused_up_front():
    for kind in ("selective", "dcp"):
        config = load_config("tiny_softmax", [f"attention.kind={kind}", "attention.position=nope"])
        model = build_model(config, VOCAB)
        with pytest.raises(ValueError, match="has no decoding cache"):
            Decoder(model)


@pytest.mark.slow
def test_cli_generate_on_a_tiny_trained_run(tiny_fpa_run, tmp_path, capsys):
    capsys.readouterr()
    argv = ["generate", str(tiny_fpa_run), "--prompt", "def", "--max-new-tokens", "6",
            "--temperature", "0"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("def") and "tokens/s" in lines[-1], lines
    assert main([*argv, "--batch", "2", "--temperature", "1", "--top-k", "5",
                 "--evict-below", "none"]) == 0
    assert "--- sample 1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:            # argparse: exit 2, one line
        main([*argv, "--top-p", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--top-p" in err[0], err
    assert main([*argv, "--prompt", ""]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--prompt" in err[0], err
    assert main(["generate", str(tmp_path / "nowhere"), "--prompt", "x"]) == 1
    assert "does not exist" in capsys.readouterr().err
