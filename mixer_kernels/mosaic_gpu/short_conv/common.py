"""Constants and XLA-side helpers shared by the short convolution's kernels, their XLA passes
and their `supports` (the Mosaic GPU helpers: mixer_kernels/mosaic_gpu/common.py).

    PAD              padding rows in front of the document ids; the kernels take W <= PAD + 1
                     taps
    BLOCK            rows per program
    GROUP            channels per program without normalize_heads
    SUPPORTED_HEAD_DIMS   channels per normalised head the kernels are built for
    head_width(channels, normalize_heads)    channels per program
    kernel_program(kernel, **static)          the kernel behind one jax.jit per configuration
    kernel_inputs(x, kernel, segment_ids, normalize_heads)   the kernels' operands
    forward_params(), backward_params()   the kernels' Mosaic GPU options: approximate exp
                     (the hardware's ex2, relative error near 2^-22, far below the bf16
                     rounding of the outputs; the GPU interpreter of the tests computes it
                     exactly); the backward, whose taps' gradient sums a tile over its rows,
                     also 8 KiB of shared memory for sums across the warps
                     (`REDUCTION_SCRATCH_BYTES`)

Each kernel runs behind one `jax.jit` per configuration, so the layers' convolutions of equal
shapes share one lowered kernel per compiled step.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_core.padding import pad_time
from mixer_kernels.mosaic_gpu.common import REDUCTION_SCRATCH_BYTES, document_start_index

PAD = 8
BLOCK = 64
GROUP = 64
SUPPORTED_HEAD_DIMS = (64, 128)


def forward_params():
    return plgpu.CompilerParams(approx_math=True)


def backward_params():
    return plgpu.CompilerParams(approx_math=True,
                                reduction_scratch_bytes=REDUCTION_SCRATCH_BYTES)


def head_width(channels: int, normalize_heads: int | None) -> int:
    return GROUP if normalize_heads is None else channels // normalize_heads


@functools.cache
def kernel_program(kernel, **static):
    """`kernel` behind one jax.jit (GPU interpret mode is a JAX config state, so jit keeps its
    interpreted and compiled traces apart)."""
    return jax.jit(functools.partial(kernel, **static))


def kernel_inputs(x, kernel, segment_ids, normalize_heads):
    """(x [B, Tr, H, D] padded at the end to whole blocks, ids [B, PAD + Tr] float32 padded in
    front with -1 and at the end with -2, taps [W, H, D] float32, ids [B, T]) for the
    kernels."""
    batch, length, channels = x.shape
    width = kernel.shape[0]
    dim = head_width(channels, normalize_heads)
    heads = channels // dim
    rows = -(-length // BLOCK) * BLOCK
    # each position's document start (contiguous ids, as the layer's contract says), as the
    # attention kernels label documents: exact in float32 whatever the ids' magnitude
    ids = (jnp.zeros((batch, length), jnp.float32) if segment_ids is None
           else document_start_index(segment_ids, length))
    # -1 before t = 0, -2 past T: rows past T never take a tap from before t = 0, whose rows
    # the kernels leave unwritten in the first block
    idsp = jnp.pad(jnp.pad(ids, ((0, 0), (PAD, 0)), constant_values=-1.0),
                   ((0, 0), (0, rows - length)), constant_values=-2.0)
    taps = kernel.astype(jnp.float32).reshape(width, heads, dim)
    return pad_time(x.reshape(batch, length, heads, dim), rows), idsp, taps, ids
