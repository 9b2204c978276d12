"""The attention kernels' shared helpers (mixer_kernels/mosaic_gpu/attention/common.py) against
loops over their definitions: the block packs, the launch sizes, the reciprocal, the pruning
test's per-position norms, and the no-dead-pair floor that lets an off-diagonal FPA tile skip
its bias (checked against the dense range minimum R_ts = min phi over (s, t] on random fields,
ties and flat stretches)."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from mixer_core.interpret import gpu_interpret
from mixer_kernels.mosaic_gpu.attention.common import (
    BIG, dead_key_bounds, launch_sizes, no_dead_floor, pack_rows, pruning_norms, reciprocal,
    row_dots)
from tests.seeds import case_seed


class _Config:
    block = 8


def test_pack_rows_puts_each_blocks_rows_together():
    rng = np.random.default_rng(case_seed(940))
    n, rows = 4, [rng.standard_normal((2, 3, 12)).astype(np.float32) for _ in range(5)]
    packed = np.asarray(pack_rows([jnp.asarray(r) for r in rows], n))
    assert packed.shape == (2, 3, 3, 5, 4)
    for block in range(3):
        for r, row in enumerate(rows):
            np.testing.assert_array_equal(packed[:, :, block, r],
                                          row[:, :, block * n:(block + 1) * n])


def test_launch_sizes_reads_the_grid_from_q():
    q = jnp.zeros((2, 24, 3, 16))
    assert launch_sizes(_Config(), q) == (2, 3, 16, 8, 3)


def test_pruning_norms_are_per_position_and_heads_major():
    """bf16 q, k [B, T, H, D] -> scale <q_t, k_t>, scale |q_t|, |k_t| at [b, h, t]. The dot
    product is summed in float32, so it is held to its rounding scale, eps32 times the sum of
    the terms' magnitudes, where its terms cancel."""
    rng = np.random.default_rng(case_seed(945))
    q, k = (jnp.asarray(rng.standard_normal((2, 5, 3, 8)), jnp.bfloat16) for _ in range(2))
    diag, qn, kn = (np.asarray(x) for x in pruning_norms(q, k, 0.5))
    q64, k64 = (np.asarray(x, np.float64) for x in (q, k))
    for b, t, h in np.ndindex(2, 5, 3):
        terms = 0.5 * q64[b, t, h] * k64[b, t, h]
        np.testing.assert_allclose(diag[b, h, t], terms.sum(), rtol=1e-6,
                                   atol=4 * np.finfo(np.float32).eps * np.abs(terms).sum())
        np.testing.assert_allclose(qn[b, h, t], 0.5 * np.linalg.norm(q64[b, t, h]), rtol=1e-6)
        np.testing.assert_allclose(kn[b, h, t], np.linalg.norm(k64[b, t, h]), rtol=1e-6)


def test_row_dots_are_per_position_heads_major_and_reduced_before_the_transpose():
    """<a_t, b_t> over D at [b, h, t]; the reduction is fenced off from the move to heads-major
    (an optimization_barrier in the program), so XLA cannot fuse it into a transposing pass."""
    rng = np.random.default_rng(case_seed(946))
    a = jnp.asarray(rng.standard_normal((2, 5, 3, 8)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((2, 5, 3, 8)), jnp.bfloat16)
    dots = np.asarray(row_dots(a, b))
    a64, b64 = (np.asarray(x, np.float64) for x in (a, b))
    for i, t, h in np.ndindex(2, 5, 3):
        # float32 summation error is relative to sum |a_d b_d|, not to the dot (which cancels)
        bound = 1e-6 * np.abs(a64[i, t, h] * b64[i, t, h]).sum()
        assert abs(dots[i, h, t] - a64[i, t, h] @ b64[i, t, h]) <= bound, (i, t, h)
    for fn in (lambda: row_dots(a, b), lambda: pruning_norms(a, a, 0.5)):
        assert "optimization_barrier" in str(jax.make_jaxpr(fn)())


def test_reciprocal_is_one_over_x_across_the_float32_range():
    """The GPU interpreter's form (rsqrt squared); compiled, it is one rcp.approx
    (tests/benchmarks/test_kernel_op_count.py reads it from the lowered kernels)."""
    x = jnp.asarray(np.geomspace(1e-30, 1e30, 601), jnp.float32)
    with gpu_interpret():
        inverse = reciprocal(x)
    np.testing.assert_allclose(np.asarray(inverse), 1.0 / np.asarray(x, np.float64), rtol=1e-6)


def _fields(rng, length, kind):
    if kind == "walk":     # with a deep dip after the first key and at the last query
        phi = np.cumsum(rng.standard_normal(length))
        psi = phi + rng.standard_normal(length)
        phi[1] -= 100.0    # the first tiles' lowest pair is key 0's (A_0 - psi_0)
        phi[-1] -= 100.0   # the last query block's tiles: min(G, C_t) - psi_s decides
    elif kind == "ties":   # few distinct values: exact ties between R_ts and psi_s
        phi = rng.integers(-2, 3, length).astype(float)
        psi = rng.integers(-2, 3, length).astype(float)
    else:                  # "fox": a falling walk with psi = phi (every key dead)
        phi = -np.cumsum(rng.uniform(0.01, 1.0, length))
        psi = phi.copy()
    return phi.astype(np.float32), psi.astype(np.float32)


@pytest.mark.parametrize("kind", ["walk", "ties", "fox"])
def test_no_dead_floor_is_the_lowest_pair_of_an_off_diagonal_tile(kind):
    """floor(j, i) = min over keys s of block j and queries t of block i > j of R_ts - psi_s
    (the minimum over t is each piece's own minimum, so the bound is exact), hence a floor
    >= 0 means the whole tile has bias 0. Both of its terms decide some tile."""
    rng = np.random.default_rng(case_seed(941 + ["walk", "ties", "fox"].index(kind)))
    n, nb = 4, 6
    phi, psi = _fields(rng, n * nb, kind)
    blocks = phi.reshape(nb, n)
    suffix = np.full_like(blocks, BIG)   # A_s: min phi over (s, end of s's block)
    for s in range(n - 1):
        suffix[:, s] = blocks[:, s + 1:].min(-1)
    kap, kpmax = (np.asarray(x).reshape(nb, n)[:, 0] for x in
                  dead_key_bounds(jnp.asarray(suffix.reshape(-1)), jnp.asarray(psi), n))
    np.testing.assert_array_equal(kap, (suffix - psi.reshape(nb, n)).min(-1))
    np.testing.assert_array_equal(kpmax, psi.reshape(nb, n).max(-1))
    deciding = set()
    for i in range(1, nb):
        for j in range(i):
            gap = blocks[j + 1:i].min() if i > j + 1 else np.float32(BIG)
            floor = float(no_dead_floor(kap[j], kpmax[j], gap, blocks[i].min()))
            lowest = min(phi[s + 1:t + 1].min() - psi[s]
                         for s in range(j * n, (j + 1) * n) for t in range(i * n, (i + 1) * n))
            assert floor == lowest, (i, j, floor, lowest)
            deciding.add("keys" if kap[j] < min(gap, blocks[i].min()) - kpmax[j] else "rest")
    if kind == "walk":
        assert deciding == {"keys", "rest"}, deciding
