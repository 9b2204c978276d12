"""The WY preparation kernel (`wy_kernel.prepare`) in GPU interpret mode against its XLA
version (`wy.prepare_reference`), its CUDA lowering, the hand-written backward
(`wy.prepare_backward`) against autodiff of `wy.prepare_reference` with the same inverse, and
the backward kernel (`wy_backward_kernel.backward`) against both, its CUDA lowering and the
op's gradients with it switched on (`vjp.INTRA_BACKWARD`)."""

import functools

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from mixer_core import interpret
from gdn_jax.ops import api
from mixer_kernels.mosaic_gpu.gated_delta import vjp, wy, wy_backward_kernel, wy_kernel
from tests.mixer_kernels.mosaic_gpu.gated_delta.op_cases import op_arguments
from tests.seeds import case_seed


def _inputs(seed, batch, seq_len, heads, group, key_dim, value_dim, gate, resets, correlated,
            dtype):
    rng = np.random.default_rng(seed)
    num_chunks = -(-seq_len // 64)
    padded = num_chunks * 64

    def unit(shape, shared=0.0):
        x = rng.standard_normal(shape) + shared * rng.standard_normal(shape[-1])
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def pad(x, dtype):   # on the host: float32, then rounded to dtype
        x = np.pad(np.asarray(x, np.float32), [(0, 0), (0, padded - seq_len)]
                   + [(0, 0)] * (x.ndim - 2))
        return jnp.asarray(x).astype(dtype)

    hv = heads * group
    q = pad(unit((batch, seq_len, heads, key_dim)), dtype)
    k = pad(unit((batch, seq_len, heads, key_dim), 3.0 if correlated else 0.0), dtype)
    v = pad(rng.standard_normal((batch, seq_len, hv, value_dim)), dtype)
    g = pad(rng.uniform(*gate, (batch, seq_len, hv)), jnp.float32)
    beta = pad(rng.uniform(0.0, 1.0, (batch, seq_len, hv)), jnp.float32)
    segment_ids = None
    if resets:
        segment_ids = jnp.asarray(np.searchsorted(np.asarray(resets), np.arange(seq_len),
                                                  side="right")[None].repeat(batch, 0), jnp.int32)
    rows, _ = _chunk_rows(g, beta, segment_ids, num_chunks, 64)
    return q, k, v, rows


# the XLA functions compiled whole (op by op, each small op would compile on its own)
_chunk_rows = jax.jit(wy.chunk_rows, static_argnums=(3, 4))
_prepare_reference = jax.jit(functools.partial(wy.prepare_reference, scale=0.3))


def _reference_vjp(q, k, v, rows, inverse, cotangents):
    """Autodiff of `wy.prepare_reference`'s (W, U, Kw, P) with the inverse given, at the
    cotangents (in float32)."""
    _, pull = jax.vjp(lambda *xs: wy.prepare_reference(*xs, scale=0.3, inverse=inverse)[:4],
                      q, k, v, rows)
    return pull(tuple(c.astype(jnp.float32) for c in cotangents))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


CASES = {   # batch, T, H, group, K, V, gate range, resets, correlated keys, dtype, tolerance
    "t1": (1, 1, 1, 1, 64, 64, (-0.3, 0.0), (), False, jnp.float32, 1e-5),
    "ragged_resets_grouped": (2, 100, 1, 2, 64, 128, (-0.3, 0.0), (30, 64, 65), False,
                              jnp.float32, 1e-5),
    "strong_decay_correlated": (1, 128, 2, 1, 128, 64, (-6.0, -4.0), (), True, jnp.float32, 1e-5),
    "bf16_correlated": (1, 64, 1, 1, 64, 64, (-0.1, 0.0), (20,), True, jnp.bfloat16, 3e-2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_wy_kernel_matches_xla(name):
    *shape, gate, resets, correlated, dtype, tol = CASES[name]
    q, k, v, rows = _inputs(case_seed(300 + sorted(CASES).index(name)), *shape, gate, resets,
                            correlated, dtype)
    with interpret.gpu_interpret():
        got = jax.block_until_ready(jax.jit(functools.partial(
            wy_kernel.prepare, scale=0.3, with_inverse=True))(q, k, v, rows))
        assert not interpret.races_found()
    want = _prepare_reference(q, k, v, rows)
    for label, a, b in zip(("W", "U", "Kw", "P", "T"), got, want):
        assert a.shape == b.shape, label
        assert np.isfinite(np.asarray(a, np.float32)).all(), label
        assert _rel(a, b) < tol, (label, _rel(a, b))


@pytest.mark.parametrize("key_dim, value_dim, dtype, with_inverse", [
    (128, 128, jnp.bfloat16, False), (64, 256, jnp.float16, True), (256, 256, jnp.bfloat16, True)])
def test_wy_kernel_lowers_to_mosaic_gpu(key_dim, value_dim, dtype, with_inverse):
    """CUDA lowering on the CPU runs Mosaic GPU's layout inference (it once hung on one SMEM
    row loaded in two layouts) and the shared-memory reuse fits K = V = 256."""
    spec = jax.ShapeDtypeStruct
    args = (spec((1, 128, 1, key_dim), dtype), spec((1, 128, 1, key_dim), dtype),
            spec((1, 128, 2, value_dim), dtype), spec((1, 2, 2, len(wy.ROWS), 64), jnp.float32))
    run = jax.jit(lambda *a: wy_kernel.prepare(*a, scale=0.1, with_inverse=with_inverse))
    assert "mosaic_gpu" in run.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _cotangents(seed, outputs, dtype):
    """Random cotangents of (W, U, Kw, P) in the kernel's output dtypes."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(x.shape), d)
                 for x, d in zip(outputs[:4], (dtype, jnp.float32, dtype, dtype)))


def _compare_gradients(got, want, tol):
    for label, a, b in zip(("dq", "dk", "dv", "drows"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, label
        assert np.isfinite(np.asarray(a, np.float32)).all(), label
    for label, a, b in zip(("dq", "dk", "dv"), got, want):
        assert _rel(a, b) < tol, (label, _rel(a, b))
    for slot, label in enumerate(wy.ROWS):      # each row on its own scale
        a, b = got[3][:, :, :, slot], want[3][:, :, :, slot]
        if label.startswith("document"):
            assert not np.asarray(a).any() and not np.asarray(b).any(), label
        else:
            assert _rel(a, b) < tol, (label, _rel(a, b))


BACKWARD_CASES = {   # columns as in CASES
    # float32: the kernel tests below compare `wy.prepare_backward` with autodiff (through the
    # kernel) at 1e-5 on T = 1, ragged T with resets and grouped heads, strong decay with
    # correlated keys; here what only it runs: bf16 operands
    # bf16: the products take bf16 operands (T, dU, the recomputed W and U, dR, dS, dG: each
    # rounded to 2^-9 relative) while the oracle runs float32 on the same bf16 inputs; these
    # roundings add up to at most 5.3e-3 here over 8 seeds, 2e-2 leaves a 4x margin
    "bf16_resets_grouped_correlated": (1, 128, 2, 2, 64, 64, (-0.3, 0.0), (20, 100), True,
                                       jnp.bfloat16, 2e-2),
}


@pytest.mark.parametrize("name", sorted(BACKWARD_CASES))
def test_prepare_backward_matches_autodiff(name):
    *shape, gate, resets, correlated, dtype, tol = BACKWARD_CASES[name]
    seed = case_seed(320 + sorted(BACKWARD_CASES).index(name))
    q, k, v, rows = _inputs(seed, *shape, gate, resets, correlated, dtype)
    outputs = _prepare_reference(q, k, v, rows)
    inverse = outputs[4]
    cotangents = _cotangents(seed + 1, outputs, dtype)

    want = jax.jit(_reference_vjp)(q, k, v, rows, inverse, cotangents)
    got = jax.jit(lambda *xs: wy.prepare_backward(*xs, scale=0.3))(q, k, v, rows, inverse,
                                                                   cotangents)
    _compare_gradients(got, want, tol)


KERNEL_BACKWARD_CASES = {   # columns as in CASES
    "t1": (1, 1, 1, 1, 64, 64, (-0.3, 0.0), (), False, jnp.float32, 1e-5),
    "ragged_resets_grouped": (2, 100, 1, 2, 64, 128, (-0.3, 0.0), (30, 64, 65), False,
                              jnp.float32, 1e-5),
    "strong_decay_correlated": (1, 128, 2, 1, 128, 64, (-6.0, -4.0), (), True, jnp.float32,
                                1e-5),
    # bf16 against the float32 oracle on the same bf16 inputs: the kernel's T comes from bf16
    # products (as the forward kernel's), then T, dU, W, U, dR, dG, dS are rounded to bf16 for
    # the products; up to 5.8e-3 over 8 seeds (`wy.prepare_backward` with the float32 T:
    # 5.1e-3), 2e-2 leaves a 3x margin
    "bf16_resets_grouped_correlated": (1, 128, 2, 2, 64, 64, (-0.3, 0.0), (20, 100), True,
                                       jnp.bfloat16, 2e-2),
}


@pytest.mark.parametrize("name", sorted(KERNEL_BACKWARD_CASES))
def test_backward_kernel_matches_prepare_backward(name):
    """The kernel in GPU interpret mode against autodiff of `wy.prepare_reference` in float32
    (the inputs' values, the float32 inverse given) and, in float32, `wy.prepare_backward`."""
    *shape, gate, resets, correlated, dtype, tol = KERNEL_BACKWARD_CASES[name]
    seed = case_seed(340 + sorted(KERNEL_BACKWARD_CASES).index(name))
    q, k, v, rows = _inputs(seed, *shape, gate, resets, correlated, dtype)
    upcast = tuple(x.astype(jnp.float32) for x in (q, k, v))
    outputs = _prepare_reference(*upcast, rows)
    cotangents = _cotangents(seed + 1, outputs, dtype)
    with interpret.gpu_interpret():
        got = jax.block_until_ready(jax.jit(functools.partial(
            wy_backward_kernel.backward, scale=0.3))(q, k, v, rows, cotangents))
        assert not interpret.races_found()

    want = jax.jit(_reference_vjp)(*upcast, rows, outputs[4], cotangents)
    want = (*(w.astype(x.dtype) for w, x in zip(want[:3], (q, k, v))), want[3])
    _compare_gradients(got, want, tol)
    if dtype == jnp.float32:
        _compare_gradients(got, jax.jit(functools.partial(wy.prepare_backward, scale=0.3))(
            q, k, v, rows, outputs[4], cotangents), tol)


@pytest.mark.parametrize("key_dim, value_dim, group, with_dq_more", [
    (128, 128, 2, False), (64, 64, 2, False), (128, 128, 1, True), (64, 64, 1, True),
    (64, 64, 1, False), (128, 64, 1, True), (64, 128, 2, False)])
def test_backward_kernel_lowers_to_mosaic_gpu(key_dim, value_dim, group, with_dq_more):
    """CUDA lowering (bf16; grouped heads with float32 partials, or group 1 with 16-bit dq and
    dk, with and without dq_more) runs Mosaic GPU's layout inference, which interpret mode
    skips (the column sums and row stores go through it)."""
    spec = jax.ShapeDtypeStruct
    dtype, num_v_heads, num_chunks = jnp.bfloat16, 2, 2
    chunk_major = (num_chunks, 1, num_v_heads, 64)
    qk = spec((1, 128, num_v_heads // group, key_dim), dtype)
    args = (qk, qk, spec((1, 128, num_v_heads, value_dim), dtype),
            spec((1, num_v_heads, num_chunks, len(wy.ROWS), 64), jnp.float32),
            (spec((*chunk_major, key_dim), dtype), spec((*chunk_major, value_dim), jnp.float32),
             spec((*chunk_major, key_dim), dtype), spec((*chunk_major, 64), dtype)),
            qk if with_dq_more else None)
    run = jax.jit(lambda *a: wy_backward_kernel.backward(*a, scale=0.1))
    assert "mosaic_gpu" in run.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert wy_backward_kernel.fits(key_dim, value_dim)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_kernel_adds_dq_more(dtype):
    """Group 1: with dq_more the kernel's dq is its own dq plus dq_more, summed in float32 and
    rounded once (within one rounding of the two rounded parts added); dk, dv and the rows are
    bit for bit those without it. A dq_more of the wrong shape or with grouped heads is
    refused."""
    q, k, v, rows = _inputs(case_seed(350), 1, 100, 2, 1, 64, 64, (-0.3, 0.0), (), True, dtype)
    seed = case_seed(351)
    cotangents = _cotangents(seed, _prepare_reference(q, k, v, rows), dtype)
    dq_more = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(q.shape), dtype)
    run = jax.jit(functools.partial(wy_backward_kernel.backward, scale=0.3))
    with interpret.gpu_interpret():
        alone = jax.block_until_ready(run(q, k, v, rows, cotangents))
        added = jax.block_until_ready(run(q, k, v, rows, cotangents, dq_more))
        assert not interpret.races_found()
    assert added[0].dtype == dtype
    want = np.asarray(alone[0], np.float64) + np.asarray(dq_more, np.float64)
    assert _rel(added[0], want) < (1e-6 if dtype == jnp.float32 else 8e-3), _rel(added[0], want)
    for a, b in zip(added[1:], alone[1:]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(ValueError, match="dq_more: expected"):
        wy_backward_kernel.backward(q, k, v, rows, cotangents, dq_more[:, :64], scale=0.3)
    grouped = _inputs(seed, 1, 64, 1, 2, 64, 64, (-0.3, 0.0), (), False, dtype)
    with pytest.raises(ValueError, match="dq_more: expected .* with group 1, got .* group 2"):
        wy_backward_kernel.backward(*grouped, cotangents, grouped[0], scale=0.3)


@pytest.mark.slow   # compares the two settings of INTRA_BACKWARD; test_vjp.py covers the default
def test_op_gradients_with_backward_kernel(monkeypatch):
    """gated_delta_rule(implementation="pallas") with INTRA_BACKWARD = "pallas" against the
    token-by-token oracle and the "xla" switch: ragged T, a reset inside a chunk, HV = 2H."""
    args, segment_ids, d_out = op_arguments(case_seed(360), 100, boundary=40)

    def gradients(implementation, intra_backward):
        monkeypatch.setattr(vjp, "INTRA_BACKWARD", intra_backward)
        loss = lambda *xs: jnp.sum(d_out * api.gated_delta_rule(
            *xs, segment_ids=segment_ids, implementation=implementation)[0])
        return jax.jit(jax.grad(loss, argnums=range(5)))(*args)

    with interpret.gpu_interpret():
        got = jax.block_until_ready(gradients("pallas", "pallas"))
        assert not interpret.races_found()
        existing = gradients("pallas", "xla")
    oracle = gradients("reference", "xla")
    for label, a, b, c in zip(("dq", "dk", "dv", "dg", "dbeta"), got, oracle, existing):
        assert _rel(a, b) < 1e-4, (label, _rel(a, b))
        assert _rel(a, c) < 1e-5, (label, _rel(a, c))
