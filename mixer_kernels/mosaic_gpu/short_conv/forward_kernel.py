"""Pallas Mosaic GPU kernel: the forward of the gated delta layer's short convolution.

Per channel c of a head of D channels (`shifted_rows` forms total from the shifted rows):

    total_t = sum_{j < W} w[W-1-j] x_{t-j} m_j(t)      m_j(t) = [doc(t - j) == doc(t)]
    a_t     = silu(total_t)
    y_t     = a_t / sqrt(sum_c a_t^2 + eps)            (normalize; else y_t = a_t)

One program per (head, block of n rows, batch), in float32 registers; y leaves in `dtype`.
x [B, Tr, H, D] (16-bit; float32 only in interpret mode, Tr a multiple of n), ids [B, PAD + Tr]
float32 padded in front with -1 and past T with -2, taps w [W, H, D] float32
-> y [B, Tr, H, D].
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.common import swizzled_smem
from mixer_kernels.mosaic_gpu.short_conv.common import BLOCK, PAD, forward_params
from mixer_kernels.mosaic_gpu.short_conv.shifted_rows import copy_taps_and_ids, pre_activation


def conv_forward(x, idsp, taps, *, normalize: bool, eps: float, dtype):
    """y [B, Tr, H, D] in `dtype`; see the module docstring."""
    batch, rows, heads, dim = x.shape
    width, n = taps.shape[0], BLOCK
    if rows % n or idsp.shape[1] != rows + PAD or width > PAD + 1:
        raise ValueError(f"conv_forward: rows {rows} must be a multiple of {n}, ids padded by "
                         f"{PAD} in front (got {idsp.shape[1]} for {rows} rows), taps <= "
                         f"{PAD + 1} (got {width})")

    def kernel(x_ref, ids_ref, taps_ref, y_ref, x_s, ids_s, taps_s, y_s, loaded):
        h, i, b = lax.axis_index("h"), lax.axis_index("t"), lax.axis_index("b")
        copy_taps_and_ids(x_ref, ids_ref, x_s, ids_s, loaded.at[0], b=b, start=i * n, h=h)
        plgpu.copy_gmem_to_smem(taps_ref.at[:, h], taps_s, loaded.at[0])
        plgpu.barrier_wait(loaded.at[0])

        total, _ = pre_activation(x_s, ids_s, taps_s)
        act = total * jax.nn.sigmoid(total)
        if normalize:
            inv = lax.rsqrt(jnp.sum(act * act, axis=1) + eps)
            act = act * lax.broadcast_in_dim(inv, act.shape, [0])
        y_s[...] = act.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(y_s, y_ref.at[b, pl.ds(i * n, n), h])
        plgpu.wait_smem_to_gmem(0)

    # x untiled: its copies start at any row (a tiled copy needs rows in multiples of 8)
    scratch = (plgpu.SMEM((width, n, dim), x.dtype),
               plgpu.SMEM((PAD + n,), jnp.float32),
               plgpu.SMEM((width, dim), jnp.float32),
               swizzled_smem((n, dim), dtype),
               plgpu.Barrier(num_arrivals=width + 2, num_barriers=1))
    kernel.__name__ = "short_conv_forward"  # the kernel's name in profiles
    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(x.shape, dtype),
                        scratch_types=scratch, grid=(heads, rows // n, batch),
                        grid_names=("h", "t", "b"),
                        compiler_params=forward_params())(x, idsp, taps)
