"""Decoding with slot caches: FPA's bias rule against the parallel forward, eviction exactly
where the bias fell below the threshold with the freed slots reused, loud overflow, and every
attention layer's prefill + one-token step against its own parallel forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from fpa_jax import fields, fpa_bias
from fpa_jax.decode import additive, slots
from fpa_jax.decode import layers as layer_decoding
from fpa_jax.fpa.decoding import decode_step, init_cache, live_fraction, prefix_scalars
from fpa_jax.layers import FoXAttention, FPAAttention, SoftmaxAttention
from tests.seeds import case_seed

THRESHOLD = -10.0


_fields = jax.jit(fields)   # one program (op by op, each small op would compile on its own)


def make_inputs(seed, batch=2, length=40, heads=3, dim=8, tilt=0.0, beta_low=-1.0):
    """Drawn with NumPy, so only the fields compile (jax.random: a program per shape)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape, np.float32)
    q, k, v = (jnp.asarray(normal(batch, length, heads, dim)) for _ in range(3))
    delta = jnp.asarray(normal(batch, length, heads) + np.float32(tilt))
    phi, psi = _fields(delta, jnp.asarray(normal(*delta.shape)), jnp.asarray(normal(*delta.shape)))
    beta = jnp.asarray(np.logaddexp(0, np.linspace(beta_low, 1.0, heads)).astype(np.float32))
    return q, k, v, phi, psi, beta


def decode_all(args, capacity, evict_below, **options):
    """Every token through decode_step (one lax.scan): (outs [B, T, H, D], cache, most live)."""
    q, k, v, phi, psi, beta = args
    batch, _, heads, dim = q.shape

    def step(carry, inputs):
        cache, most_live = carry
        out, cache = decode_step(cache, *inputs, beta, evict_below=evict_below, **options)
        return (cache, jnp.maximum(most_live, slots.live_counts(cache).max())), out

    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, phi, psi)]
    (cache, most_live), outs = jax.jit(lambda xs: jax.lax.scan(
        step, (init_cache(batch, capacity, heads, dim), jnp.zeros((), jnp.int32)), xs))(time_major)
    return jnp.moveaxis(outs, 0, 1), cache, int(most_live)


def test_eviction_removes_exactly_the_keys_below_the_threshold_and_reuses_their_slots():
    seed = case_seed(2)
    args = make_inputs(seed, length=64, tilt=-2.0, beta_low=0.0)   # falling walk: keys die
    q, k, v, phi, psi, beta = args
    length = q.shape[1]
    capacity = 24                                      # far fewer slots than tokens
    decoded, cache, most_live = decode_all(args, capacity, THRESHOLD)
    assert not bool(cache.overflow), f"seed {seed}: {most_live} live keys overflowed"
    assert 0.0 < float(live_fraction(cache)) < 0.5
    # the final bias row of every key: alive iff it is still >= the threshold
    bias = jax.jit(fpa_bias)(phi, psi, beta)
    final_bias = np.moveaxis(np.asarray(bias[:, :, -1, :]), 1, 2)      # [B, T, H]
    token, alive = np.asarray(cache.token), np.asarray(cache.alive)
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            expected = set(np.flatnonzero(final_bias[b, :, h] >= THRESHOLD))
            assert set(token[b, :, h][alive[b, :, h]]) == expected, f"seed {seed}, {b}, {h}"
    assert token.max() == length - 1                   # late tokens sit in reused slots
    # every output equals dense attention without the keys whose bias was below the threshold

    @jax.jit
    def dense_attention(q, k, v, bias):
        scores = 8 ** -0.5 * jnp.einsum("bthd,bshd->bhts", q, k) + bias
        weights = jax.nn.softmax(jnp.where(bias >= THRESHOLD, scores, -jnp.inf), axis=-1)
        return jnp.einsum("bhts,bshd->bthd", weights, v)

    dense = dense_attention(q, k, v, bias)
    np.testing.assert_allclose(decoded, dense, atol=2e-5, rtol=1e-5, err_msg=f"seed {seed}")


def test_prefix_scalars_in_blocks_equal_the_dense_formulas():
    seed = case_seed(6)
    for length, block in ((37, 8), (37, 128), (1, 4), (16, 8)):   # short last block; one; T=1; exact
        _, _, _, phi, psi, _ = make_inputs(seed + length + block, length=length)
        phi64, psi64 = np.asarray(phi, np.float64), np.asarray(psi, np.float64)
        later = np.arange(length)[:, None] > np.arange(length)[None, :]            # [u, s]
        dips = np.minimum(0.0, phi64[:, :, None, :] - psi64[:, None, :, :])       # [B, u, s, H]
        dip_sums = np.where(later[None, :, :, None], dips, 0.0).sum(axis=1)
        range_mins = np.where(later[None, :, :, None], phi64[:, :, None, :], np.inf).min(axis=1)
        message = f"T={length}, block={block}, seed {seed}"
        level, running = jax.jit(lambda a, b: prefix_scalars(a, b, dip_sum=True, block=block))(
            phi, psi)
        np.testing.assert_array_equal(level, psi, err_msg=message)
        np.testing.assert_allclose(running, dip_sums, atol=1e-4, rtol=1e-5, err_msg=message)
        _, running = jax.jit(lambda a, b: prefix_scalars(a, b, block=block))(phi, psi)
        last = np.isinf(range_mins)                        # the last key: no later token yet
        np.testing.assert_array_equal(np.where(last, 0.0, running),
                                      np.where(last, 0.0, range_mins), err_msg=message)
        assert last[:, -1].all() and (np.asarray(running)[last] >= 1e29).all(), message
    with pytest.raises(ValueError, match="block"):
        prefix_scalars(phi, psi, dip_sum=True, block=0)


def test_fox_rule_evicts_exactly_below_the_threshold():
    seed = case_seed(3)
    rng = np.random.default_rng(seed)
    batch, length, heads, dim = 2, 48, 2, 4
    q, k, v = (jnp.asarray(rng.standard_normal((batch, length, heads, dim), np.float32))
               for _ in range(3))
    log_forget = jnp.asarray(-np.logaddexp(np.float32(0), -rng.standard_normal(
        (batch, length, heads), np.float32)))   # log sigmoid

    def step(cache, inputs):
        return additive.decode_step(cache, *inputs, scale=0.5, evict_below=THRESHOLD)[1], None

    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, log_forget)]
    cache, _ = jax.jit(lambda xs: jax.lax.scan(
        step, additive.init_cache(batch, 32, heads, dim), xs))(time_major)
    assert not bool(cache.overflow)
    total = np.cumsum(np.asarray(log_forget), axis=1)
    final_bias = total[:, -1:] - total
    token, alive = np.asarray(cache.token), np.asarray(cache.alive)
    for b in range(batch):
        for h in range(heads):
            live = set(token[b, :, h][alive[b, :, h]])
            assert live == set(np.flatnonzero(final_bias[b, :, h] >= THRESHOLD)), f"seed {seed}"


def test_full_cache_sets_the_overflow_flag_instead_of_writing():
    q, k, v, phi, psi, beta = make_inputs(0, length=3)
    with pytest.raises(ValueError, match="k_t: expected shape"):
        decode_step(init_cache(2, 2, 3, 8), q[:, 0], k[:, 0, :2], v[:, 0], phi[:, 0],
                    psi[:, 0], beta)
    with pytest.raises(ValueError, match="query-level"):
        decode_step(init_cache(2, 4, 3, 8), q[:, 0], k[:, 0], v[:, 0], phi[:, 0], psi[:, 0], beta,
                    query_level=True, evict_below=THRESHOLD)
    cache = slots.empty(2, 2, 3, 8, 8, jnp.float32, num_scalars=1)
    write = jax.jit(slots.write)
    for t in range(3):
        cache = write(cache, k[:, t], v[:, t], (phi[:, t],))
    assert bool(cache.overflow) and int(np.asarray(cache.alive).sum()) == 2 * 2 * 3
    assert set(np.asarray(cache.token).ravel()) == {0, 1}    # token 2 was not written over them
    np.testing.assert_array_equal(cache.keys, k[:, :2])


def test_resize_keeps_live_keys_and_refuses_to_cut_them():
    q, k, v, phi, psi, beta = make_inputs(case_seed(4), length=6)
    keep = np.random.default_rng(case_seed(5)).random(phi.shape) < 0.5
    cache = slots.from_sequence(k, v, (phi,), jnp.asarray(keep))
    live = int(keep.sum(axis=1).max())
    for capacity in (16, max(live, 1)):
        resized = jax.device_get(slots.resize(cache, capacity))
        assert resized.alive.shape[1] == capacity
        for b in range(2):
            for h in range(3):
                expected = np.flatnonzero(keep[b, :, h])
                np.testing.assert_array_equal(resized.token[b, :expected.size, h], expected)
                assert not resized.alive[b, expected.size:, h].any()
                np.testing.assert_array_equal(resized.keys[b, :expected.size, h],
                                              np.asarray(k)[b, expected, h])
    if live:
        with pytest.raises(ValueError, match=f"cannot hold the {live} live keys"):
            slots.resize(cache, live - 1)


SMALL = dict(num_heads=2, head_dim=4, implementation="reference")   # the dense oracles
LAYERS = {
    "fpa": FPAAttention(**SMALL),
    "fpa_stack_form": FPAAttention(stack_form=True, **SMALL),
    "fpa_no_key_level": FPAAttention(key_level=False, **SMALL),
    "fpa_query_level": FPAAttention(query_level=True, **SMALL),
    "fpa_no_content": FPAAttention(content=False, **SMALL),
    "fpa_dip_sum": FPAAttention(dip_sum=True, **SMALL),
    "fpa_no_bias": FPAAttention(use_bias=False, **SMALL),
    "fox": FoXAttention(**SMALL),
    "softmax_rope": SoftmaxAttention(position="rope", **SMALL),
    "softmax_nope": SoftmaxAttention(position="nope", **SMALL),
    "softmax_alibi": SoftmaxAttention(position="alibi", **SMALL),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_prefill_and_steps_reproduce_the_parallel_forward(name):
    layer, seed = LAYERS[name], case_seed(10 + sorted(LAYERS).index(name))
    batch, length, prefix, width = 2, 7, 3, 8
    rng = np.random.default_rng(seed)   # NumPy: jax.random would compile per shape
    x = jnp.asarray(rng.standard_normal((batch, length, width), np.float32))
    params = nn.meta.unbox(layer.init(jax.random.PRNGKey(seed + 1), x)["params"])
    # perturb every parameter so the zero-initialised scalar maps depend on x
    params = jax.tree.map(lambda p: jnp.asarray(
        np.asarray(p) + np.float32(0.3) * rng.standard_normal(p.shape, np.float32)), params)

    def decode(x):
        y, cache = layer_decoding.prefill(layer, params, x[:, :prefix], evict_below=None)
        cache = layer_decoding.resize(cache, length)           # growing: jittable

        def step(cache, x_t):
            y_t, cache = layer_decoding.step(layer, params, x_t, cache, evict_below=None)
            return cache, y_t

        cache, ys = jax.lax.scan(step, cache, jnp.moveaxis(x[:, prefix:], 1, 0))
        decoded = jnp.concatenate([y, jnp.moveaxis(ys, 0, 1)], axis=1)
        return decoded, layer.apply({"params": params}, x), cache["slots"].overflow

    decoded, parallel, overflow = jax.jit(decode)(x)
    np.testing.assert_allclose(decoded, parallel, atol=2e-5, rtol=2e-5,
                               err_msg=f"{name}, seed {seed}")
    assert not bool(overflow)


def test_eviction_applies_only_where_the_bias_never_rises():
    assert layer_decoding.eviction(LAYERS["fpa"], THRESHOLD) == THRESHOLD
    assert layer_decoding.eviction(LAYERS["fpa_dip_sum"], THRESHOLD) == THRESHOLD
    assert layer_decoding.eviction(LAYERS["fox"], THRESHOLD) == THRESHOLD
    for name in ("fpa_query_level", "fpa_no_bias", "softmax_rope", "softmax_alibi"):
        assert layer_decoding.eviction(LAYERS[name], THRESHOLD) is None, name
    with pytest.raises(TypeError, match="evict_below"):
        layer_decoding.eviction(LAYERS["fpa"], "low")
