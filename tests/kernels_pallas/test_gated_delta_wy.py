"""The WY preparation kernel (`wy_kernel.prepare`) in GPU interpret mode against its XLA
version (`wy.prepare_reference`), its CUDA lowering, and the hand-written backward
(`wy.prepare_backward`) against autodiff of `wy.prepare_reference` with the same inverse."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from kernels_pallas import interpret
from kernels_pallas.gated_delta import wy, wy_kernel
from tests.seeds import case_seed


def _inputs(seed, batch, seq_len, heads, group, key_dim, value_dim, gate, resets, correlated,
            dtype):
    rng = np.random.default_rng(seed)
    num_chunks = -(-seq_len // 64)
    padded = num_chunks * 64

    def unit(shape, shared=0.0):
        x = rng.standard_normal(shape) + shared * rng.standard_normal(shape[-1])
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def pad(x):
        return jnp.pad(jnp.asarray(x), [(0, 0), (0, padded - seq_len)] + [(0, 0)] * (x.ndim - 2))

    hv = heads * group
    q = pad(unit((batch, seq_len, heads, key_dim))).astype(dtype)
    k = pad(unit((batch, seq_len, heads, key_dim), 3.0 if correlated else 0.0)).astype(dtype)
    v = pad(rng.standard_normal((batch, seq_len, hv, value_dim))).astype(dtype)
    g = pad(rng.uniform(*gate, (batch, seq_len, hv))).astype(jnp.float32)
    beta = pad(rng.uniform(0.0, 1.0, (batch, seq_len, hv))).astype(jnp.float32)
    segment_ids = None
    if resets:
        segment_ids = jnp.asarray(np.searchsorted(np.asarray(resets), np.arange(seq_len),
                                                  side="right")[None].repeat(batch, 0), jnp.int32)
    rows, _ = wy.chunk_rows(g, beta, segment_ids, num_chunks, 64)
    return q, k, v, rows


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
        got = jax.block_until_ready(wy_kernel.prepare(q, k, v, rows, scale=0.3,
                                                      with_inverse=True))
        assert not interpret.races_found()
    want = wy.prepare_reference(q, k, v, rows, scale=0.3)
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


BACKWARD_CASES = {   # columns as in CASES
    "float32": (1, 128, 2, 1, 64, 64, (-0.3, 0.0), (), False, jnp.float32, 1e-5),
    "float32_resets_grouped": (2, 100, 1, 2, 64, 32, (-0.3, 0.0), (30, 64, 65), False,
                               jnp.float32, 1e-5),
    "float32_strong_decay_correlated": (1, 128, 2, 1, 32, 64, (-6.0, -4.0), (), True,
                                        jnp.float32, 1e-5),
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
    outputs = wy.prepare_reference(q, k, v, rows, scale=0.3)
    inverse = outputs[4]
    rng = np.random.default_rng(seed + 1)
    cotangents = tuple(jnp.asarray(rng.standard_normal(x.shape), d)   # the kernel's dtypes
                       for x, d in zip(outputs[:4], (dtype, jnp.float32, dtype, dtype)))

    _, pull = jax.vjp(lambda *xs: wy.prepare_reference(*xs, scale=0.3, inverse=inverse)[:4],
                      q, k, v, rows)
    want = pull(tuple(c.astype(jnp.float32) for c in cotangents))
    got = jax.jit(lambda *xs: wy.prepare_backward(*xs, scale=0.3))(q, k, v, rows, inverse,
                                                                   cotangents)
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
