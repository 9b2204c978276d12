"""In-kernel pieces shared by the short convolution's forward and backward kernels: the rows
of x shifted by each tap, copied from x itself (no padded copy of x), and the pre-activation
of a block of rows.

    x_{t-s} m_s(t)     m_s(t) = [doc(t - s) == doc(t)]; rows before t = 0 carry the id -1
    total_t = sum_{s < W} w[W-1-s] x_{t-s} m_s(t)

A register tile of the rows shifted by s comes from its own TMA copy starting at the shifted
row in global memory (a register load of a shared-memory view starting off a multiple of 8
rows reads wrong rows on the H200). For the rows from 0 the copy of tap s > 0 starts at row 0
and lands s rows into its tile; the s rows above it are never written and always masked (their
ids are the front padding's -1, and rows past T carry -2). The document ids come as one
aligned copy per program, [PAD + n] float32 from ids padded in front by PAD rows, read as
shifted 1-D views.
"""

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.short_conv.common import PAD


def rows(ref, shape):
    """A [n] float32 view of shared memory in registers as [n, D], one value per row."""
    return lax.broadcast_in_dim(plgpu.load(ref, layout=plgpu.Layout.WGMMA.reduce(1)), shape, [0])


def columns(ref, shape):
    """A [D] float32 view of shared memory in registers as [n, D], one value per column."""
    return lax.broadcast_in_dim(plgpu.load(ref, layout=plgpu.Layout.WGMMA.reduce(0)), shape, [1])


def tile(ref):
    """An untiled [n, D] shared-memory tile in float32 registers."""
    return plgpu.load(ref, layout=plgpu.Layout.WGMMA).astype(jnp.float32)


def copy_taps_and_ids(x_ref, ids_ref, x_s, ids_s, loaded, *, b, start, h):
    """Starts the copies of the n rows from row `start` shifted by every tap into x_s [W, n, D]
    (untiled) and of their ids into ids_s [PAD + n]; W + 1 arrivals on `loaded`. x_ref
    [B, Tr, H, D], ids_ref [B, PAD + Tr] (ids padded in front with -1); start + n <= Tr."""
    width, n, dim = x_s.shape
    if dim * x_s.dtype.itemsize % 128:   # the first rows' copies land s rows into the tile
        raise ValueError(f"short_conv kernels: a row of x must be a multiple of 128 bytes (the "
                         f"copy engine's alignment), got {dim} x {x_s.dtype}")
    plgpu.copy_gmem_to_smem(x_ref.at[b, pl.ds(start, n), h], x_s.at[0], loaded)
    for s in range(1, width):
        @pl.when(start == 0)
        def _first_rows(s=s):
            plgpu.copy_gmem_to_smem(x_ref.at[b, pl.ds(0, n - s), h], x_s.at[s, pl.ds(s, n - s)],
                                    loaded)

        @pl.when(start > 0)
        def _later_rows(s=s):
            plgpu.copy_gmem_to_smem(x_ref.at[b, pl.ds(start - s, n), h], x_s.at[s], loaded)
    plgpu.copy_gmem_to_smem(ids_ref.at[b, pl.ds(start, PAD + n)], ids_s, loaded)


def document_masks(ids_s, shape):
    """same(s) = m_s(t) = [doc(t - s) == doc(t)] [n, D] (bool, one value per row) for the
    tile's rows t, from the ids ids_s [PAD + n] of `copy_taps_and_ids` (the rows' own ids are
    read once)."""
    n = shape[0]
    own_doc = rows(ids_s.at[pl.ds(PAD, n)], shape)
    return lambda s: rows(ids_s.at[pl.ds(PAD - s, n)], shape) == own_doc


def pre_activation(x_s, ids_s, taps_s):
    """(total [n, D] float32, shifted) with shifted(s) = x_{t-s} m_s(t) [n, D] float32, from
    the tiles of `copy_taps_and_ids` and the taps taps_s [W, D] float32."""
    width, n, dim = x_s.shape
    shape = (n, dim)
    same = document_masks(ids_s, shape)

    def shifted(s):
        return jnp.where(same(s), tile(x_s.at[s]), 0.0)

    total = shifted(0) * columns(taps_s.at[width - 1], shape)
    for s in range(1, width):
        total = total + shifted(s) * columns(taps_s.at[width - 1 - s], shape)
    return total, shifted
