"""The gated delta rule state kernels in GPU interpret mode against a float64 NumPy recurrence."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import state_kernels
from tests.seeds import case_seed


def _inputs(seed, num_chunks, batch, heads, key_dim, value_dim, dtype):
    rng = np.random.default_rng(seed)
    shape_k = (num_chunks, batch, heads, 64, key_dim)
    kw = jnp.asarray(rng.standard_normal(shape_k) * key_dim ** -0.5, dtype)
    w = jnp.asarray(rng.standard_normal(shape_k) * key_dim ** -0.5, dtype)
    u = jnp.asarray(rng.standard_normal((num_chunks, batch, heads, 64, value_dim)), jnp.float32)
    rho = jnp.asarray(rng.uniform(0.0, 1.0, (batch, heads, state_kernels.padded_chunks(num_chunks))),
                      jnp.float32)
    s0 = jnp.asarray(rng.standard_normal((batch, heads, key_dim, value_dim)), jnp.float32)
    d_states = jnp.asarray(rng.standard_normal((num_chunks, batch, heads, key_dim, value_dim)),
                           jnp.float32)
    d_final = jnp.asarray(rng.standard_normal((batch, heads, key_dim, value_dim)), jnp.float32)
    return kw, w, u, rho, s0, d_states, d_final


def _numpy_recurrences(kw, w, u, rho, s0, d_states, d_final):
    kw, w, u, rho, s0, d_states, d_final = (np.asarray(x, np.float64)
                                            for x in (kw, w, u, rho, s0, d_states, d_final))
    num_chunks = w.shape[0]
    state, states = s0, []
    for c in range(num_chunks):
        states.append(state)
        new_values = u[c] - np.einsum("bhck,bhkv->bhcv", w[c], state)
        state = rho[..., c, None, None] * state + np.einsum("bhck,bhcv->bhkv", kw[c], new_values)
    lam, lambdas, d_u = d_final, [None] * num_chunks, [None] * num_chunks
    for c in reversed(range(num_chunks)):
        lambdas[c] = lam
        d_u[c] = np.einsum("bhck,bhkv->bhcv", kw[c], lam)
        lam = d_states[c] + rho[..., c, None, None] * lam - np.einsum("bhck,bhcv->bhkv", w[c], d_u[c])
    return np.stack(states), state, np.stack(lambdas), np.stack(d_u), lam


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("case, num_chunks, batch, heads, key_dim, value_dim, value_tile, dtype, tol", [
    (0, 3, 1, 2, 64, 64, 64, jnp.float32, 1e-5),
    (1, 2, 2, 1, 128, 64, 32, jnp.float32, 1e-5),     # two value tiles, K != V
    (2, 3, 1, 1, 64, 64, 64, jnp.bfloat16, 3e-2),     # 16-bit operands, float32 state
    (3, 2, 1, 1, 64, 128, 64, jnp.float16, 5e-3),
    (4, 9, 1, 1, 64, 64, 64, jnp.float32, 1e-5),      # rho row in three copies (limit 4 here)
])
def test_state_kernels_match_recurrence(case, num_chunks, batch, heads, key_dim, value_dim,
                                        value_tile, dtype, tol, monkeypatch):
    if case == 4:   # the copy engine's 256-element limit, scaled down to 9 chunks
        monkeypatch.setattr(state_kernels, "TMA_MAX_ELEMENTS", 4)
    kw, w, u, rho, s0, d_states, d_final = _inputs(case_seed(100 + case), num_chunks, batch, heads,
                                                   key_dim, value_dim, dtype)
    tiling = state_kernels.Tiling(64, key_dim, value_dim, value_tile)
    with interpret.gpu_interpret():
        states, final = state_kernels.forward_states(kw, w, u, rho, s0, tiling=tiling)
        lambdas, d_u, d_s0 = state_kernels.backward_states(kw, w, d_states, rho, d_final,
                                                           tiling=tiling)
        jax.block_until_ready((states, final, lambdas, d_u, d_s0))
        assert not interpret.races_found()
    expected = _numpy_recurrences(kw, w, u, rho, s0, d_states, d_final)
    for name, got, want in zip(("states", "final", "lambdas", "d_u", "d_s0"),
                               (states, final, lambdas, d_u, d_s0), expected):
        assert np.isfinite(np.asarray(got)).all(), name
        assert _rel(got, want) < tol, (name, _rel(got, want))


def test_16bit_states_are_the_float32_states_rounded():
    """states_16bit: the entering states leave in the operand dtype, each exactly the float32
    state rounded (what the products read), and the final state is unchanged."""
    kw, w, u, rho, s0, _, _ = _inputs(case_seed(107), 3, 1, 1, 64, 64, jnp.bfloat16)
    tiling = state_kernels.Tiling(64, 64, 64, 64)
    with interpret.gpu_interpret():
        states, final = state_kernels.forward_states(kw, w, u, rho, s0, tiling=tiling)
        states16, final16 = state_kernels.forward_states(kw, w, u, rho, s0, tiling=tiling,
                                                         states_16bit=True)
    assert states.dtype == jnp.float32 and states16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(states16), np.asarray(states.astype(jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(final16), np.asarray(final))


def test_choose_tiling_rejects_unsupported_sizes():
    with pytest.raises(ValueError, match="K and V must be in"):
        state_kernels.choose_tiling(4, 64, 96, 64, jnp.bfloat16)
    with pytest.raises(ValueError, match="chunk_size must be 64"):
        state_kernels.choose_tiling(4, 32, 64, 64, jnp.bfloat16)
    with pytest.raises(ValueError, match="fits shared memory"):
        state_kernels.choose_tiling(40000, 64, 256, 256, jnp.bfloat16)
    assert state_kernels.choose_tiling(256, 64, 128, 128, jnp.bfloat16).value_tile == 64
    assert state_kernels.choose_tiling(64, 64, 256, 256, jnp.bfloat16).value_tile == 16
    assert state_kernels.choose_tiling(64, 64, 64, 128, jnp.bfloat16, value_tile=32).value_tile == 32


@pytest.mark.parametrize("num_chunks, key_dim, value_dim, dtype", [
    (3, 128, 128, jnp.bfloat16), (3, 64, 256, jnp.float16), (3, 256, 64, jnp.bfloat16),
    (513, 128, 128, jnp.bfloat16)])   # T = 32832: a rho row of more than 256 elements
def test_kernels_lower_to_mosaic_gpu(num_chunks, key_dim, value_dim, dtype):
    """Lowering for a CUDA device (done on the CPU) runs Mosaic GPU's layout inference,
    shared-memory check and copy limits, which interpret mode skips (a narrow value tile, and
    T / 64 > 256 chunks, once failed there)."""
    batch, heads = 1, 2
    tiling = state_kernels.choose_tiling(num_chunks, 64, key_dim, value_dim, dtype)
    spec = jax.ShapeDtypeStruct
    keys = spec((num_chunks, batch, heads, 64, key_dim), dtype)
    values = spec((num_chunks, batch, heads, 64, value_dim), jnp.float32)
    rho = spec((batch, heads, state_kernels.padded_chunks(num_chunks)), jnp.float32)
    state = spec((batch, heads, key_dim, value_dim), jnp.float32)
    states = spec((num_chunks, batch, heads, key_dim, value_dim), jnp.float32)
    forward = jax.jit(lambda *a: state_kernels.forward_states(*a, tiling=tiling))
    forward16 = jax.jit(lambda *a: state_kernels.forward_states(*a, tiling=tiling,
                                                                states_16bit=True))
    backward = jax.jit(lambda *a: state_kernels.backward_states(*a, tiling=tiling))
    for text in (forward.trace(keys, keys, values, rho, state).lower(lowering_platforms=("cuda",))
                 .as_text(),
                 forward16.trace(keys, keys, values, rho, state)
                 .lower(lowering_platforms=("cuda",)).as_text(),
                 backward.trace(keys, keys, states, rho, state).lower(lowering_platforms=("cuda",))
                 .as_text()):
        assert "mosaic_gpu" in text
