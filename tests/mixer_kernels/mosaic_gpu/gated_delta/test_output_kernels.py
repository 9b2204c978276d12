"""The chunk output kernels (`output_kernels.forward` / `backward`) in GPU interpret mode against
autodiff of an XLA oracle of O_c = scale diag(e) Q_c S_c + P_c (U_c - W_c S_c), their CUDA
lowering, where their shared memory fits, and the op through each setting of `vjp.OUTPUTS`."""

import functools

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from gdn_jax.ops import api
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import output_kernels, vjp
from tests.mixer_kernels.mosaic_gpu.gated_delta.op_cases import (assert_op_matches_the_oracle,
                                                                op_arguments)
from tests.seeds import case_seed

SCALE = 0.3
C = 64


def oracle(q, states, w, u, p, e):
    """O [B, Tp, HV, V] in float32 at full precision (the module docstring's formula)."""
    batch, padded, heads, key_dim = q.shape
    num_chunks, _, value_heads, _, value_dim = states.shape
    group = value_heads // heads
    hi = jax.lax.Precision.HIGHEST
    q, states, w, u, p, e = (x.astype(jnp.float32) for x in (q, states, w, u, p, e))
    new_values = u - jnp.einsum("nbhck,nbhkv->nbhcv", w, states, precision=hi)
    queries = jnp.repeat(q.reshape(batch, num_chunks, C, heads, key_dim), group, axis=3)
    from_states = jnp.einsum("bnchk,nbhkv->nbhcv", queries, states, precision=hi)
    out = (SCALE * e[:, :, :, 0, :, None] * from_states
           + jnp.einsum("nbhij,nbhjv->nbhiv", p, new_values, precision=hi))
    return out.transpose(1, 0, 3, 2, 4).reshape(batch, padded, value_heads, value_dim)


def _inputs(seed, batch, num_chunks, heads, group, key_dim, value_dim, dtype):
    rng = np.random.default_rng(seed)
    value_heads, chunk_major = heads * group, (num_chunks, batch, heads * group)

    def draw(shape, dtype, scale=1.0):
        return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32).astype(dtype)

    q = draw((batch, num_chunks * C, heads, key_dim), dtype, key_dim ** -0.5)
    states = draw((*chunk_major, key_dim, value_dim), dtype)
    w = draw((*chunk_major, C, key_dim), dtype, key_dim ** -0.5)
    u = draw((*chunk_major, C, value_dim), jnp.float32)
    p = draw((*chunk_major, C, C), dtype, C ** -0.5)
    e = jnp.asarray(rng.uniform(0.2, 1.0, (*chunk_major, 1, C)), jnp.float32)
    d_out = draw((batch, num_chunks * C, value_heads, value_dim), dtype)
    return (q, states, w, u, p, e), d_out


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


CASES = {   # batch, chunks, heads, group, K, V, dtype, bound
    "f32_grouped": (1, 2, 1, 2, 64, 64, jnp.float32, 1e-5),
    "f32_k128_v64": (2, 1, 1, 1, 128, 64, jnp.float32, 1e-5),
    "bf16": (1, 2, 2, 1, 64, 64, jnp.bfloat16, 1.5e-2),
}


@functools.partial(jax.jit, static_argnums=0)
def _value_and_pullback(fn, args, d_out):
    """fn(*args) and its vjp at d_out as one program (op by op, each of their small ops
    compiled on its own)."""
    value, pull = jax.vjp(fn, *args)
    return value, pull(d_out)


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_the_oracle_and_its_autodiff(name):
    """Output and all six cotangents (dq summed over the group) against autodiff of the float32
    oracle on the same inputs: exact operands in float32, the bf16 bar with 16-bit operands."""
    *shape, dtype, bound = CASES[name]
    args, d_out = _inputs(case_seed(520 + list(CASES).index(name)), *shape, dtype)
    heads, group = shape[2], shape[3]
    want, want_grads = _value_and_pullback(oracle, args, d_out.astype(jnp.float32))
    with interpret.gpu_interpret():
        got = jax.jit(lambda *a: output_kernels.forward(*a, scale=SCALE))(*args)
        d_q, *rest = jax.jit(lambda *a: output_kernels.backward(*a, scale=SCALE))(*args, d_out)
    assert d_q.dtype == (args[0].dtype if group == 1 else jnp.float32)
    d_q = np.asarray(d_q, np.float32).reshape(*d_q.shape[:2], heads, group, -1).sum(3)
    assert got.shape == want.shape and got.dtype == jnp.float32
    assert _rel(got, want) < bound, _rel(got, want)
    for label, a, b, x in zip(("dq", "dS", "dW", "dU", "dP", "de"), (d_q, *rest), want_grads,
                              (args[0], *args[1:])):
        assert a.shape == x.shape, (label, a.shape, x.shape)
        assert np.isfinite(np.asarray(a, np.float32)).all(), label
        assert _rel(a, b) < bound, (label, _rel(a, b))


def test_backward_without_dw_returns_the_rest_unchanged():
    """with_dw=False drops dW (callers form it from a summed dU) and leaves dq, dS, dU, dP and
    de bit for bit as they are with it."""
    args, d_out = _inputs(case_seed(529), 2, 1, 1, 2, 64, 64, jnp.float32)
    with interpret.gpu_interpret():
        full = jax.jit(lambda *a: output_kernels.backward(*a, scale=SCALE))(*args, d_out)
        short = jax.jit(lambda *a: output_kernels.backward(*a, scale=SCALE, with_dw=False))(
            *args, d_out)
    assert len(short) == 5
    for a, b in zip(short, full[:2] + full[3:]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("key_dim, value_dim, backward, group", [
    (64, 64, False, 2), (64, 64, True, 2), (128, 128, True, 2), (128, 64, True, 2),
    (128, 64, "no dW", 2), (64, 64, "no dW", 2), (64, 64, "no dW", 1), (128, 128, "no dW", 1),
    (128, 64, True, 1)])
def test_kernels_lower_to_mosaic_gpu(key_dim, value_dim, backward, group):
    """CUDA lowering on the CPU (bf16; grouped heads, or group 1 with dq in 16 bits) runs
    Mosaic GPU's layout inference, which interpret mode skips (the e column, the row sums of
    de, transposed operands)."""
    args, d_out = _inputs(0, 1, 2, 1, group, key_dim, value_dim, jnp.bfloat16)
    args = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (*args, d_out))
    if backward:
        run = jax.jit(lambda *a: output_kernels.backward(*a, scale=SCALE,
                                                         with_dw=backward is True))
    else:
        run = jax.jit(lambda *a: output_kernels.forward(*a[:6], scale=SCALE))
    assert "mosaic_gpu" in run.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_shared_memory_limits_are_stated():
    """K, V in {64, 128} fit both kernels, a 256 the forward at most; a block too large for
    shared memory is refused with a message naming the kernel and the head dims."""
    for key_dim, value_dim in ((64, 64), (128, 128), (64, 128)):
        assert output_kernels.fits(key_dim, value_dim, backward=True)
    assert output_kernels.fits(64, 256, backward=False)
    assert not output_kernels.fits(64, 256, backward=True)
    assert not output_kernels.fits(256, 256, backward=False)
    args, d_out = _inputs(0, 1, 1, 1, 1, 64, 256, jnp.bfloat16)
    with pytest.raises(ValueError, match="chunk output backward kernel.*K = 64, V = 256"):
        output_kernels.backward(*args, d_out, scale=SCALE)


def test_forward_kernel_with_xla_backward_where_the_backward_does_not_fit():
    """K = 64, V = 256: `vjp.chunk_outputs_pallas` runs the forward kernel and autodiff of XLA's
    `chunk_outputs` for the backward; both against `chunk_outputs` alone (float32)."""
    (q, states, w, u, p, e), d_out = _inputs(case_seed(528), 1, 2, 1, 2, 64, 256, jnp.float32)
    args = (q, states, w, u, p, e[..., 0, :])
    want, want_grads = _value_and_pullback(
        lambda *xs: vjp.chunk_outputs(*xs, SCALE, jnp.float32), args, d_out)
    with interpret.gpu_interpret():
        got, got_grads = _value_and_pullback(
            lambda *xs: vjp.chunk_outputs_pallas(*xs, SCALE, jnp.float32), args, d_out)
    assert _rel(got, want) < 1e-5, _rel(got, want)
    for label, a, b in zip(("dq", "dS", "dW", "dU", "dP", "de"), got_grads, want_grads):
        assert _rel(a, b) < 1e-5, (label, _rel(a, b))


@pytest.mark.parametrize("outputs, dim", [pytest.param("xla", 64, marks=pytest.mark.slow),
                                          pytest.param("pallas", 128, marks=pytest.mark.slow)])
def test_op_through_each_output_path_matches_the_oracle(monkeypatch, outputs, dim):
    """The op with the outputs in XLA (`vjp.OUTPUTS = "xla"`), and with the kernels at
    K = V = 128: output and gradients of q, k, v, g, beta against the token-by-token oracle
    (float32, ragged T, a reset, HV = 2H)."""
    monkeypatch.setattr(vjp, "OUTPUTS", outputs)
    args, segment_ids, d_out = op_arguments(case_seed(530 + dim), 100, dim=dim, boundary=40)
    assert_op_matches_the_oracle(args, segment_ids, d_out)


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setattr(vjp, "OUTPUTS", "mosaic")
    args, segment_ids, _ = op_arguments(0, 8)
    with interpret.gpu_interpret(), pytest.raises(ValueError, match="OUTPUTS"):
        api.gated_delta_rule(*args, segment_ids=segment_ids, implementation="pallas")
