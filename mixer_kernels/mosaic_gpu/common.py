"""Mosaic GPU building blocks shared by every kernel family (attention, gated delta rule,
short convolution).

    swizzled_smem(shape, dtype)   an SMEM buffer type, tiled and swizzled for TMA and wgmma
    matmul(a, b, shape)           a @ b on the tensor cores, float32 result
    matmul_groups(*groups)        several sums of products on the tensor cores, every wgmma
                                  issued before the first wait: group = (shape, [(a, b), ...])
    document_start_index(segment_ids, padded)   each row's document start, as the kernels
                                                label documents (XLA side)
    REDUCTION_SCRATCH_BYTES   shared memory for a kernel's sums across its warps (a
                              CompilerParams option)
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_core.padding import pad_time

# A sum across the four warps of a warpgroup (a [64, D] tile summed over its rows) goes
# through shared memory, 1 KiB per register of the result it forms at once. A 64-wide
# result is 8 such registers: Mosaic's default 2 KiB forms it in four rounds, each between
# two warpgroup barriers; 8 KiB forms it in one. It adds to every program's shared memory:
# the attention sweeps keep the default, as 6 KiB more would cost FPA's dk/dv and dq
# sweeps at D = 128 (112,736 bytes a program with the default) their second program per SM.
REDUCTION_SCRATCH_BYTES = 8192


def swizzled_smem(shape, dtype, swizzle=128):
    """SMEM buffer type, swizzled by `swizzle` bytes or the minor dimension if narrower."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = min(swizzle, shape[-1] * itemsize)
    transforms = (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))
    return plgpu.SMEM(shape, dtype, transforms=transforms)


def matmul(a, b, shape):
    """a @ b on the tensor cores (refs in SMEM; a may be a transposed view), float32 result."""
    def body(acc):
        plgpu.wgmma(acc, a, b)
        return acc[...]
    return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))


def matmul_groups(*groups):
    """(sum_k a_k @ b_k for each group), float32 results. group = (shape, [(a, b), ...]) with
    refs in SMEM as for `matmul`; a group's products chain into one accumulator, and every
    wgmma of every group is issued before the first result is read (one wait instead of one
    per product). Each group holds an accumulator tile in registers until the wait."""
    def body(*accs):
        for acc, (_, products) in zip(accs, groups):
            for a, b in products:
                plgpu.wgmma(acc, a, b)
        return tuple(acc[...] for acc in accs)
    return pl.run_scoped(body, *(plgpu.ACC(shape, jnp.float32) for shape, _ in groups))


def document_start_index(segment_ids, padded):
    """[B, T] contiguous document ids -> [B, Tp] float32 index of each row's document start
    (-1 on padding rows)."""
    positions = jnp.arange(segment_ids.shape[1])
    change = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    starts = jax.lax.cummax(jnp.where(change, positions, 0), axis=1).astype(jnp.float32)
    return pad_time(starts, padded, 1, -1.0)
