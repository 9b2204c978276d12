"""The backward of the "pallas" entry of `gdn_jax.ops.short_conv` (whose forward is XLA's,
saving only its inputs): one Mosaic GPU pass and, around it, XLA's sum of the taps' gradient
over batch and blocks, with

    dx_u = sum_{s < W} kernel[W-1-s] m_s(u + s) dtotal_{u+s}      m_s(t) = [doc(t-s) == doc(t)]

formed by one XLA pass over d total from the kernel (`backward_kernel.conv_backward`, on x
padded in front by PAD rows).

Heads of the kernel: the L2-normalised heads (normalize_heads) or groups of GROUP channels.
Each kernel runs behind one `jax.jit` per configuration (`_kernel_program`), so the layers'
convolutions of equal shapes share one lowered kernel per compiled step.
"""

import functools

import jax
import jax.numpy as jnp

from mixer_core import shard
from mixer_kernels.mosaic_gpu.attention.forward import document_start_index
from mixer_core.padding import pad_time
from mixer_kernels.mosaic_gpu.short_conv.backward_kernel import conv_backward
from mixer_kernels.mosaic_gpu.short_conv.common import BLOCK, GROUP, PAD


def head_width(channels: int, normalize_heads: int | None) -> int:
    return GROUP if normalize_heads is None else channels // normalize_heads


@functools.cache
def _kernel_program(kernel, normalize: bool, eps: float):
    """`kernel` behind one jax.jit (GPU interpret mode is a JAX config state, so jit keeps its
    interpreted and compiled traces apart)."""
    return jax.jit(functools.partial(kernel, normalize=normalize, eps=eps))


def conv_backward_pass(x, kernel, segment_ids, dy, *, normalize_heads, eps):
    """(dx [B, T, C] in x's dtype, d kernel [W, C] in kernel's dtype) from the cotangent dy
    of the output ([B, T, C], or [B, T, H, C / H] with normalize_heads = H; eps: the L2
    norm's)."""
    batch, length, channels = x.shape
    width = kernel.shape[0]
    dim = head_width(channels, normalize_heads)
    heads = channels // dim
    blocks = -(-length // BLOCK)
    # each position's document start (contiguous ids, as the layer's contract says), as the
    # attention kernels label documents: exact in float32 whatever the ids' magnitude
    ids = (jnp.zeros((batch, length), jnp.float32) if segment_ids is None
           else document_start_index(segment_ids, length))
    program = functools.partial(_kernel_program, normalize=normalize_heads is not None, eps=eps)
    x4 = x.reshape(batch, length, heads, dim)
    dy4 = dy.reshape(batch, length, heads, dim).astype(x.dtype)
    taps = kernel.astype(jnp.float32).reshape(width, heads, dim)
    rows = blocks * BLOCK
    xp = jnp.pad(x4, ((0, 0), (PAD, rows - length), (0, 0), (0, 0)))
    idsp = jnp.pad(ids, ((0, 0), (PAD, rows - length)), constant_values=-1.0)
    dtotal, dw_part = shard.shard_batch_and_heads(
        program(conv_backward), xp, pad_time(dy4, rows), idsp, taps,
        layouts=("BTHD", "BTHD", "BT", "WHD"), out_layouts=("BTHD", "BNHWD"))
    dx = _dx_from_dtotal(dtotal[:, :length].reshape(batch, length, channels), kernel, ids)
    d_kernel = dw_part.sum((0, 1)).transpose(1, 0, 2).reshape(width, channels)
    return dx.astype(x.dtype), d_kernel.astype(kernel.dtype)


def _dx_from_dtotal(dtotal, kernel, ids):
    """dx [B, T, C] float32 from d total [B, T, C] float32 and the ids [B, T] (module doc)."""
    width, length = kernel.shape[0], dtotal.shape[1]
    later = jnp.pad(dtotal, ((0, 0), (0, width - 1), (0, 0)))
    later_ids = jnp.pad(ids, ((0, 0), (0, width - 1)), constant_values=-1.0)
    taps32 = kernel.astype(jnp.float32)
    dx = dtotal * taps32[width - 1]
    for s in range(1, min(width, length)):
        same = (later_ids[:, s:s + length] == ids)[..., None]
        dx = dx + jnp.where(same, later[:, s:s + length], 0.0) * taps32[width - 1 - s]
    return dx
