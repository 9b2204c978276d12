"""The forward of the "pallas" entry of `gdn_jax.ops.short_conv`: one Mosaic GPU pass
(`forward_kernel.conv_forward`) on x padded at the end to whole blocks.
"""

import jax.numpy as jnp

from mixer_core import shard
from mixer_kernels.mosaic_gpu.short_conv.common import kernel_inputs, kernel_program
from mixer_kernels.mosaic_gpu.short_conv.forward_kernel import conv_forward


def conv_forward_pass(x, kernel, segment_ids, *, dtype, normalize_heads, eps):
    """y in `dtype`: [B, T, C], or [B, T, H, C / H] with normalize_heads = H (module doc of
    `gdn_jax.ops.short_conv`; eps: the L2 norm's)."""
    batch, length, channels = x.shape
    xr, idsp, taps, _ = kernel_inputs(x, kernel, segment_ids, normalize_heads)
    program = kernel_program(conv_forward, normalize=normalize_heads is not None, eps=eps,
                             dtype=jnp.dtype(dtype))
    y = shard.shard_batch_and_heads(program, xr, idsp, taps, layouts=("BTHD", "BT", "WHD"),
                                    out_layouts="BTHD")[:, :length]
    return y if normalize_heads is not None else y.reshape(batch, length, channels)
