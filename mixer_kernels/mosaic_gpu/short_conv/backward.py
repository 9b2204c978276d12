"""The backward of the "pallas" entry of `gdn_jax.ops.short_conv` (whose forward,
`forward.conv_forward_pass`, saves only its inputs): one Mosaic GPU pass and, around it, XLA's
sum of the taps' gradient over batch and blocks. `backward_kernel.conv_backward` writes
d total in float32, and one XLA pass forms

    dx_u = sum_{s < W} kernel[W-1-s] m_s(u + s) dtotal_{u+s}      (m_s(t) = [doc(t-s) == doc(t)])

from it. (A kernel that formed dx itself, d total never leaving it, was slower on an H100:
docs/benchmarks.md, "dx in the short convolution's backward kernel, again".)
"""

import jax.numpy as jnp

from mixer_core import shard
from mixer_core.padding import pad_time
from mixer_kernels.mosaic_gpu.short_conv.backward_kernel import conv_backward
from mixer_kernels.mosaic_gpu.short_conv.common import kernel_inputs, kernel_program


def conv_backward_pass(x, kernel, segment_ids, dy, *, normalize_heads, eps):
    """(dx [B, T, C] in x's dtype, d kernel [W, C] in kernel's dtype) from the cotangent dy
    of the output ([B, T, C], or [B, T, H, C / H] with normalize_heads = H; eps: the L2
    norm's)."""
    batch, length, channels = x.shape
    width = kernel.shape[0]
    xr, idsp, taps, ids = kernel_inputs(x, kernel, segment_ids, normalize_heads)
    rows, heads, dim = xr.shape[1:]
    normalize = normalize_heads is not None
    dy4 = pad_time(dy.reshape(batch, length, heads, dim).astype(x.dtype), rows)
    program = kernel_program(conv_backward, normalize=normalize, eps=eps)
    first, dw_part = shard.shard_batch_and_heads(
        program, xr, dy4, idsp, taps,
        layouts=("BTHD", "BTHD", "BT", "WHD"), out_layouts=("BTHD", "BNHWD"))
    first = first[:, :length].reshape(batch, length, channels)
    dx = _dx_from_dtotal(first, kernel, ids)
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
