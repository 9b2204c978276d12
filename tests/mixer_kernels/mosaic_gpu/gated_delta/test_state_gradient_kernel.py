"""The state gradient kernel (`state_gradient_kernel.state_gradients`) in GPU interpret mode
against the XLA formulas of dW_c = -dU_c S_c^T, dKw_c = (U_c - W_c S_c) lambda_{c+1}^T and
drho_c = <S_c, lambda_{c+1}>, its CUDA lowering, and the op through each setting of
`vjp.STATE_GRADIENTS`."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from gdn_jax.ops import api
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import state_gradient_kernel, vjp
from tests.mixer_kernels.mosaic_gpu.gated_delta.op_cases import (assert_op_matches_the_oracle,
                                                                op_arguments)
from tests.seeds import case_seed

C = 64


def oracle(states, lambdas, d_u, u, w):
    """(dW, dKw, drho [N, B, HV]) in float32 at full precision."""
    hi = jax.lax.Precision.HIGHEST
    states, lambdas, d_u, u, w = (x.astype(jnp.float32) for x in (states, lambdas, d_u, u, w))
    d_w = -jnp.einsum("nbhcv,nbhkv->nbhck", d_u, states, precision=hi)
    new_values = u - jnp.einsum("nbhck,nbhkv->nbhcv", w, states, precision=hi)
    d_kw = jnp.einsum("nbhcv,nbhkv->nbhck", new_values, lambdas, precision=hi)
    return d_w, d_kw, jnp.sum(states * lambdas, axis=(-2, -1))


def _inputs(seed, num_chunks, batch, value_heads, key_dim, value_dim, dtype):
    rng = np.random.default_rng(seed)
    chunk_major = (num_chunks, batch, value_heads)

    def draw(shape, dtype, scale=1.0):
        return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32).astype(dtype)

    return (draw((*chunk_major, key_dim, value_dim), dtype),              # S
            draw((*chunk_major, key_dim, value_dim), dtype),              # lambda
            draw((*chunk_major, C, value_dim), jnp.float32),              # dU
            draw((*chunk_major, C, value_dim), jnp.float32),              # U
            draw((*chunk_major, C, key_dim), dtype, key_dim ** -0.5))     # W


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


CASES = {   # chunks, batch, value heads, K, V, dtype, bound
    "f32": (2, 1, 2, 64, 64, jnp.float32, 1e-5),
    "f32_k128_v64": (1, 2, 1, 128, 64, jnp.float32, 1e-5),
    "bf16": (2, 1, 1, 64, 64, jnp.bfloat16, 1.5e-2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_the_oracle(name):
    """dW, dKw and drho (the row sums summed over K) against the float32 formulas on the same
    inputs: exact operands in float32, the bf16 bar with 16-bit operands (dU and N rounded)."""
    *shape, dtype, bound = CASES[name]
    args = _inputs(case_seed(540 + list(CASES).index(name)), *shape, dtype)
    with interpret.gpu_interpret():
        d_w, d_kw, rows = jax.jit(state_gradient_kernel.state_gradients)(*args)
    want_w, want_kw, want_rho = oracle(*args)
    assert d_w.dtype == d_kw.dtype == dtype and rows.dtype == jnp.float32
    assert rows.shape == (*want_rho.shape, 1, args[0].shape[-2])
    for label, got, want in (("dW", d_w, want_w), ("dKw", d_kw, want_kw),
                             ("drho", rows[..., 0, :].sum(-1), want_rho)):
        assert got.shape == want.shape, (label, got.shape, want.shape)
        assert _rel(got, want) < bound, (label, _rel(got, want))


@pytest.mark.parametrize("name", ["f32", "f32_k128_v64", "bf16"])
def test_kernel_with_the_outputs_du_sums_du_and_dw(name):
    """With the chunk outputs' dU: dW is -(dU + dU_out) S^T (the outputs' dW folded in) and the
    fourth output is dU + dU_out in the operand dtype; dKw and drho as without it."""
    *shape, dtype, bound = CASES[name]
    args = _inputs(case_seed(545 + list(CASES).index(name)), *shape, dtype)
    d_u_out = jnp.asarray(np.random.default_rng(case_seed(548)).standard_normal(args[2].shape),
                          jnp.float32)
    with interpret.gpu_interpret():
        d_w, d_kw, rows, d_u_total = jax.jit(state_gradient_kernel.state_gradients)(
            *args, d_u_out)
    states, lambdas, d_u, u, w = args
    want_w, want_kw, want_rho = oracle(states, lambdas, d_u + d_u_out, u, w)
    assert d_u_total.dtype == dtype and d_u_total.shape == d_u.shape
    for label, got, want in (("dW", d_w, want_w), ("dKw", d_kw, want_kw),
                             ("drho", rows[..., 0, :].sum(-1), want_rho),
                             ("dU", d_u_total, d_u + d_u_out)):
        assert _rel(got, want) < bound, (label, _rel(got, want))


@pytest.mark.parametrize("key_dim, value_dim", [(64, 64), (128, 128), (128, 64), (64, 128)])
def test_kernel_lowers_to_mosaic_gpu(key_dim, value_dim):
    """CUDA lowering on the CPU (bf16) runs Mosaic GPU's layout inference, which interpret mode
    skips (the row sums, the transposed S and lambda operands, the reused tiles at K = V)."""
    args = _inputs(0, 2, 1, 2, key_dim, value_dim, jnp.bfloat16)
    args = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args)
    run = jax.jit(state_gradient_kernel.state_gradients)
    assert "mosaic_gpu" in run.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    d_u_out = jax.ShapeDtypeStruct(args[2].shape, jnp.float32)
    assert "mosaic_gpu" in run.trace(*args, d_u_out).lower(lowering_platforms=("cuda",)).as_text()


def test_shared_memory_limits_are_stated():
    """K, V in {64, 128} fit; a head dim of 256 does not (not even 256 x 64, which would fit
    shared memory), and the kernel says so by name where shared memory is short."""
    for key_dim, value_dim in ((64, 64), (128, 128), (64, 128), (128, 64)):
        assert state_gradient_kernel.fits(key_dim, value_dim)
    assert not state_gradient_kernel.fits(128, 256)
    assert not state_gradient_kernel.fits(256, 64)
    with pytest.raises(ValueError, match="state gradient kernel.*K = 128, V = 256"):
        state_gradient_kernel.state_gradients(*_inputs(0, 1, 1, 1, 128, 256, jnp.bfloat16))


@pytest.mark.parametrize("setting", [pytest.param("xla", marks=pytest.mark.slow), "pallas"])
def test_op_through_each_state_gradient_path_matches_the_oracle(monkeypatch, setting):
    """The op with the state gradients in XLA and in the kernel (K = V = 64, float32, ragged T,
    a reset, HV = 2H, three chunks): output and gradients of q, k, v, g, beta against the
    token-by-token oracle."""
    monkeypatch.setattr(vjp, "STATE_GRADIENTS", setting)
    args, segment_ids, d_out = op_arguments(case_seed(550), 150, boundary=70)
    assert_op_matches_the_oracle(args, segment_ids, d_out)


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setattr(vjp, "STATE_GRADIENTS", "mosaic")
    args, segment_ids, _ = op_arguments(0, 8)

    def loss(*xs):
        return jnp.sum(api.gated_delta_rule(*xs, segment_ids=segment_ids,
                                            implementation="pallas")[0])
    with interpret.gpu_interpret(), pytest.raises(ValueError, match="STATE_GRADIENTS"):
        jax.grad(loss, argnums=range(5))(*args)
