"""Pallas Mosaic GPU kernel: the backward of the gated delta layer's short convolution.

Forward (`forward_kernel`), per channel c of a head of D channels:

    total_t = sum_{j < W} w[W-1-j] x_{t-j} m_j(t)      m_j(t) = [doc(t - j) == doc(t)]
    a_t     = silu(total_t)
    y_t     = a_t / sqrt(sum_c a_t^2 + eps)            (normalize; else y_t = a_t)

and its backward, given the cotangent dy:

    dtotal_t = silu'(total_t) * r_t (dy_t - y_t <y_t, dy_t>)    r_t = 1 / sqrt(sum_c a_t^2 + eps)
               (without normalize: silu'(total_t) dy_t)
    dw[W-1-j] = sum_t x_{t-j} m_j(t) dtotal_t
    dx_u      = sum_{s < W} w[W-1-s] m_s(u + s) dtotal_{u+s}

One program per (head, block of n rows, batch), all in float32 registers; the shifted rows
and total come from `shifted_rows` (copies of x itself, no padded copy).

`conv_backward`: the program returns d total on its rows [B, Tr, H, D] float32 (the caller
forms dx in one XLA pass) and the taps' gradient per block, dw_part [B, Tr / n, H, W, D]
float32 (the caller sums it over batch and blocks). (A design whose program also formed dx,
recomputing d total on the W - 1 later shifted tiles, measured slower on an H200:
docs/benchmarks.md, "dx in the convolution's kernel".) x is 16-bit (float32 only in
interpret mode); the taps w [W, H, D] float32; W <= PAD + 1.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.common import swizzled_smem
from mixer_kernels.mosaic_gpu.short_conv.common import BLOCK, PAD, backward_params
from mixer_kernels.mosaic_gpu.short_conv.shifted_rows import copy_taps_and_ids, pre_activation


def d_total(total, grad, *, normalize: bool, eps: float):
    """d total [n, D] float32 from total and dy (float32) on the same rows."""
    shape = total.shape
    gate = jax.nn.sigmoid(total)
    if normalize:
        act = total * gate
        inv = lax.rsqrt(jnp.sum(act * act, axis=1) + eps)
        inv_full = lax.broadcast_in_dim(inv, shape, [0])
        y = act * inv_full
        along = lax.broadcast_in_dim(jnp.sum(y * grad, axis=1), shape, [0])
        grad = inv_full * (grad - y * along)
    return grad * (gate * (1.0 + total * (1.0 - gate)))


def conv_backward(x, dy, idsp, taps, *, normalize: bool, eps: float):
    """(dtotal [B, Tr, H, D] float32, dw_part [B, Tr / BLOCK, H, W, D] float32).

    x [B, Tr, H, D]; dy [B, Tr, H, D] zero past T; idsp [B, PAD + Tr] float32, the document ids
    padded in front with -1 (so taps before t = 0 are masked like taps into another document)
    and past T with -2;
    taps [W, H, D] float32; Tr a multiple of BLOCK.
    """
    batch, rows, heads, dim = dy.shape
    width = taps.shape[0]
    n = BLOCK
    if rows % n or x.shape[1] != rows or idsp.shape[1] != rows + PAD or width > PAD + 1:
        raise ValueError(f"conv_backward: rows {rows} must be a multiple of {n} and x's (got "
                         f"{x.shape[1]}), ids padded by {PAD} in front (got {idsp.shape[1]}), "
                         f"taps <= {PAD + 1} (got {width})")

    def kernel(x_ref, dy_ref, ids_ref, taps_ref, dtotal_ref, dw_ref,
               x_s, dy_s, ids_s, taps_s, dtotal_s, dw_s, loaded):
        h, i, b = lax.axis_index("h"), lax.axis_index("t"), lax.axis_index("b")
        copy_taps_and_ids(x_ref, ids_ref, x_s, ids_s, loaded.at[0], b=b, start=i * n, h=h)
        plgpu.copy_gmem_to_smem(dy_ref.at[b, pl.ds(i * n, n), h], dy_s, loaded.at[0])
        plgpu.copy_gmem_to_smem(taps_ref.at[:, h], taps_s, loaded.at[0])
        plgpu.barrier_wait(loaded.at[0])

        total, shifted = pre_activation(x_s, ids_s, taps_s)
        dtotal = d_total(total, dy_s[...].astype(jnp.float32), normalize=normalize, eps=eps)
        dtotal_s[...] = dtotal
        for s in range(width):
            dw_s.at[width - 1 - s][...] = jnp.sum(shifted(s) * dtotal, axis=0)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dtotal_s, dtotal_ref.at[b, pl.ds(i * n, n), h])
        plgpu.copy_smem_to_gmem(dw_s, dw_ref.at[b, i, h])
        plgpu.wait_smem_to_gmem(0)

    blocks = rows // n
    out_type = (jax.ShapeDtypeStruct((batch, rows, heads, dim), jnp.float32),
                jax.ShapeDtypeStruct((batch, blocks, heads, width, dim), jnp.float32))
    # x untiled: its copies start at any row (a tiled copy needs rows in multiples of 8)
    scratch = (plgpu.SMEM((width, n, dim), x.dtype),
               swizzled_smem((n, dim), dy.dtype),
               plgpu.SMEM((PAD + n,), jnp.float32),
               plgpu.SMEM((width, dim), jnp.float32),
               swizzled_smem((n, dim), jnp.float32),
               plgpu.SMEM((width, dim), jnp.float32),
               plgpu.Barrier(num_arrivals=width + 3, num_barriers=1))
    kernel.__name__ = "short_conv_backward"  # the kernel's name in profiles
    return plgpu.kernel(kernel, out_type=out_type, scratch_types=scratch,
                        grid=(heads, blocks, batch), grid_names=("h", "t", "b"),
                        compiler_params=backward_params())(
        x, dy, idsp, taps)
