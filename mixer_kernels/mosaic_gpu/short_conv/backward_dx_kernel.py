"""Pallas Mosaic GPU kernel: the short convolution's backward with dx formed in the kernel.

The math is `backward_kernel`'s (its module docstring): d total, the taps' gradient and

    dx_u = sum_{s < W} B_s[u + s]      B_s[v] = w[W-1-s] m_s(v) dtotal_v

(m_s(v) = [doc(v - s) == doc(v)], so a row's m_s is the mask its own shifted x already takes).
dx_u needs d total on the W - 1 <= PAD rows after u. So each program owns STEP = n - PAD rows
but forms d total on a tile of n rows from its first owned row: the PAD rows past the owned
ones are formed twice, by this program and by the next, 1/7 more d total work and no copy of d
total through memory. Near the end the tile is clipped to the sequence's last n rows, and the
owned rows sit further down in it.

The shift runs on the tensor cores. (S_s B_s)_u = B_s[u + s] with S_s[u, v] = [v = u + s] on the
tile's rows (a 0/1 matrix, exact in bf16), and B_s = hi + lo is split into two bf16 tiles (the
float32 value to about 2^-18 of itself), so dx = B_0 + sum_{s >= 1} S_s (hi_s + lo_s): two
wgmmas per tap, accumulated in float32. S_s is the wgmma's operand from registers when
compiled (no shared-memory tile: a program keeps 68,616 bytes at D = 64, three to an SM) and
from shared memory in the GPU interpreter, which takes only that form. No register load reads
a shared-memory view that starts off a multiple of 8 rows (`shifted_rows`).

`conv_backward_dx`: one program per (head, owned STEP rows, batch) returns dx [B, Tr, H, D] in
x's dtype (rows at and past T unspecified) and the taps' gradient per program, dw_part
[B, tiles, H, W, D] float32 (the caller sums it). x is 16-bit (float32 only in interpret mode);
taps w [W, H, D] float32; W <= PAD + 1; Tr a multiple of n.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_core.interpret import interpret_active
from mixer_kernels.mosaic_gpu.common import matmul_groups, reads_done, swizzled_smem
from mixer_kernels.mosaic_gpu.short_conv.backward_kernel import d_total
from mixer_kernels.mosaic_gpu.short_conv.common import BLOCK, PAD, backward_params
from mixer_kernels.mosaic_gpu.short_conv.shifted_rows import (columns, copy_taps_and_ids,
                                                              document_masks, pre_activation)

STEP = BLOCK - PAD


def tile_rows(k, rows, minimum=min):
    """(start, offset, count) of program k for Tr = rows: its n-row tile starts at row `start`
    (STEP k, clipped to the last n rows), and its owned rows STEP k .. STEP k + count sit
    `offset` rows into it. minimum: `min` for a Python k, jnp.minimum for a traced one."""
    start = minimum(STEP * k, rows - BLOCK)
    return start, STEP * k - start, minimum(STEP, rows - STEP * k)


def tiles_and_ends(length, rows):
    """(tiles, ends) for T = length and Tr = rows: tiles = ceil(T / STEP) programs along time;
    ends = {k: (offset, count)} of each tile k clipped to the last n rows (`tile_rows`); every
    other tile owns STEP rows from row 0 of its tile."""
    tiles = -(-length // STEP)
    ends = {k: tile_rows(k, rows)[1:] for k in range(tiles) if STEP * k > rows - BLOCK}
    return tiles, ends


def _shifted_sum(shift, hi_s, lo_s, acc_ref):
    """acc += S_s hi_s + S_s lo_s on the tensor cores, S_s (shift) from registers."""
    plgpu.wgmma(acc_ref, shift, hi_s)
    plgpu.wgmma(acc_ref, shift, lo_s)


def conv_backward_dx(x, dy, idsp, taps, *, normalize: bool, eps: float, length: int):
    """(dx [B, Tr, H, D] in x's dtype, dw_part [B, tiles, H, W, D] float32); see the module
    docstring. x, dy [B, Tr, H, D] (dy zero past T); idsp [B, PAD + Tr] float32 as for
    `backward_kernel.conv_backward`; length = T <= Tr."""
    batch, rows, heads, dim = dy.shape
    width = taps.shape[0]
    n = BLOCK
    if (rows % n or x.shape[1] != rows or idsp.shape[1] != rows + PAD or width > PAD + 1
            or not 0 < length <= rows):
        raise ValueError(f"conv_backward_dx: rows {rows} must be a multiple of {n} and x's (got "
                         f"{x.shape[1]}), ids padded by {PAD} in front (got {idsp.shape[1]}), "
                         f"taps <= {PAD + 1} (got {width}), 0 < length <= rows (got {length})")
    tiles, ends = tiles_and_ends(length, rows)
    generic = min(ends, default=tiles)      # tiles before it start at STEP k, unclipped
    shift_in_registers = not interpret_active()

    def kernel(x_ref, dy_ref, ids_ref, taps_ref, dx_ref, dw_ref,
               x_s, dy_s, ids_s, taps_s, dw_s, hi_s, lo_s, loaded, *shift_s):
        h, k, b = lax.axis_index("h"), lax.axis_index("t"), lax.axis_index("b")
        start, offset, count = tile_rows(k, rows, jnp.minimum)
        copy_taps_and_ids(x_ref, ids_ref, x_s, ids_s, loaded.at[0], b=b, start=start, h=h)
        plgpu.copy_gmem_to_smem(dy_ref.at[b, pl.ds(start, n), h], dy_s, loaded.at[0])
        plgpu.copy_gmem_to_smem(taps_ref.at[:, h], taps_s, loaded.at[0])
        plgpu.barrier_wait(loaded.at[0])

        shape = (n, dim)
        total, shifted = pre_activation(x_s, ids_s, taps_s)
        dtotal = d_total(total, dy_s[...].astype(jnp.float32), normalize=normalize, eps=eps)
        row = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
        owned = (row >= offset) & (row < offset + count)
        dtotal_owned = jnp.where(owned, dtotal, 0.0)
        for s in range(width):
            dw_s.at[width - 1 - s][...] = jnp.sum(shifted(s) * dtotal_owned, axis=0)

        u = plgpu.broadcasted_iota(jnp.int32, (n, n), 0, layout=plgpu.Layout.WGMMA)
        v = plgpu.broadcasted_iota(jnp.int32, (n, n), 1, layout=plgpu.Layout.WGMMA)
        same = document_masks(ids_s, shape)
        later = jnp.zeros(shape, jnp.float32)
        for s in range(1, width):
            weighted = jnp.where(same(s),
                                 dtotal * columns(taps_s.at[width - 1 - s], shape), 0.0)
            hi = weighted.astype(jnp.bfloat16)
            shift = jnp.where(v == u + s, 1.0, 0.0).astype(jnp.bfloat16)
            if s > 1:
                reads_done()          # the last tap's products have read their tiles
            hi_s[...] = hi
            lo_s[...] = (weighted - hi.astype(jnp.float32)).astype(jnp.bfloat16)
            if shift_in_registers:
                plgpu.commit_smem()
                later = pl.run_state(functools.partial(_shifted_sum, shift, hi_s, lo_s))(
                    plgpu.ACC.init(later))
            else:
                shift_s[0][...] = shift
                plgpu.commit_smem()
                (product,) = matmul_groups((shape, [(shift_s[0], hi_s), (shift_s[0], lo_s)]))
                later = later + product
        dx = dtotal * columns(taps_s.at[width - 1], shape) + later
        dy_s[...] = dx.astype(dy_s.dtype)                           # dx, in dy's place
        plgpu.commit_smem()

        @pl.when(k < generic)
        def _unclipped():
            plgpu.copy_smem_to_gmem(dy_s.at[pl.ds(0, STEP)],
                                    dx_ref.at[b, pl.ds(k * STEP, STEP), h])

        for end, (end_offset, count) in ends.items():
            @pl.when(k == end)
            def _clipped(end=end, end_offset=end_offset, count=count):
                plgpu.copy_smem_to_gmem(dy_s.at[pl.ds(end_offset, count)],
                                        dx_ref.at[b, pl.ds(end * STEP, count), h])

        plgpu.copy_smem_to_gmem(dw_s, dw_ref.at[b, k, h])
        plgpu.wait_smem_to_gmem(0)

    out_type = (jax.ShapeDtypeStruct((batch, rows, heads, dim), x.dtype),
                jax.ShapeDtypeStruct((batch, tiles, heads, width, dim), jnp.float32))
    # x untiled: its copies start at any row (a tiled copy needs rows in multiples of 8)
    scratch = (plgpu.SMEM((width, n, dim), x.dtype),
               swizzled_smem((n, dim), dy.dtype),          # dy, then dx
               plgpu.SMEM((PAD + n,), jnp.float32),
               plgpu.SMEM((width, dim), jnp.float32),
               plgpu.SMEM((width, dim), jnp.float32),
               swizzled_smem((n, dim), jnp.bfloat16),       # B_s, high half
               swizzled_smem((n, dim), jnp.bfloat16),       # B_s, low half
               plgpu.Barrier(num_arrivals=width + 3, num_barriers=1))
    if not shift_in_registers:
        scratch += (swizzled_smem((n, n), jnp.bfloat16),)  # S_s
    kernel.__name__ = "short_conv_backward_dx"  # the kernel's name in profiles
    return plgpu.kernel(kernel, out_type=out_type, scratch_types=scratch,
                        grid=(heads, tiles, batch), grid_names=("h", "t", "b"),
                        compiler_params=backward_params())(x, dy, idsp, taps)
