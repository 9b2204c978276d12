"""FPA decoding with a KV cache against the parallel forward."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.seeds import run_seed
from fpa_jax import fields, fpa_attention
from fpa_jax.fpa.decoding import decode_step, init_cache, live_fraction

SEED = run_seed()  # fresh every session; TEST_SEED reproduces it


def make_inputs(seed, batch=2, length=48, heads=3, dim=8, tilt=0.0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)
    q, k, v = (jax.random.normal(keys[i], (batch, length, heads, dim)) for i in range(3))
    delta = jax.random.normal(keys[3], (batch, length, heads)) + tilt
    phi, psi = fields(delta, jax.random.normal(keys[4], delta.shape), jax.random.normal(keys[5], delta.shape))
    beta = jax.nn.softplus(jnp.linspace(-1.0, 1.0, heads))
    return q, k, v, phi, psi, beta


def decode_all(args, evict_below):
    q, k, v, phi, psi, beta = args
    batch, length, heads, dim = q.shape
    step = jax.jit(lambda cache, *x: decode_step(cache, *x, beta, evict_below=evict_below))
    cache = init_cache(batch, length, heads, dim)
    outs = []
    for t in range(length):
        out, cache = step(cache, q[:, t], k[:, t], v[:, t], phi[:, t], psi[:, t])
        outs.append(out)
    return jnp.stack(outs, axis=1), cache


def test_decoding_without_eviction_equals_parallel_forward():
    args = make_inputs(SEED)
    decoded, cache = decode_all(args, evict_below=-jnp.inf)
    parallel = fpa_attention(*args, implementation="reference")
    np.testing.assert_allclose(np.asarray(decoded), np.asarray(parallel), atol=2e-5, rtol=1e-5,
                               err_msg=f"seed {SEED}")
    assert float(live_fraction(cache)) == 1.0


def test_eviction_drops_only_dead_keys_and_changes_little():
    args = make_inputs(SEED + 1, length=64, tilt=-0.5)  # falling walk: many keys die
    decoded, cache = decode_all(args, evict_below=-10.0)
    parallel = fpa_attention(*args, implementation="reference")
    fraction = float(live_fraction(cache))
    assert 0.0 < fraction < 0.9, fraction
    # an evicted key's weight was at most exp(-10 + content spread) relative to the row
    assert float(jnp.abs(decoded - parallel).max()) < 5e-2
    # the bias never rises, so a key is alive iff its final bias is still above the threshold
    _, _, _, phi, psi, beta = args
    for s in range(0, phi.shape[1] - 1, 7):
        final_bias = beta * jnp.minimum(0.0, phi[:, s + 1:].min(axis=1) - psi[:, s])
        np.testing.assert_array_equal(np.asarray(cache.alive[:, s]), np.asarray(final_bias >= -10.0))


def test_bad_shapes_and_overflow_are_loud():
    import pytest
    q, k, v, phi, psi, beta = make_inputs(0, length=3)
    cache = init_cache(2, 2, 3, 8)
    with pytest.raises(ValueError, match="k_t: expected shape"):
        decode_step(cache, q[:, 0], k[:, 0, :2], v[:, 0], phi[:, 0], psi[:, 0], beta)
    for t in range(3):
        out, cache = decode_step(cache, q[:, t], k[:, t], v[:, t], phi[:, t], psi[:, t], beta)
    assert bool(jnp.isnan(out).all())  # the third token did not fit in a capacity-2 cache
