"""The gated delta layer's short causal convolution: dispatch between XLA and Pallas kernels.

    total_t = sum_{j < W} kernel[j] x_{t - (W-1) + j}      depthwise, per channel; taps that
                                                           reach before t = 0 or into an
                                                           earlier document read zero
    y_t     = silu(total_t)                                float32, returned in `dtype`
    normalize_heads = H: y split into H heads [B, T, H, C / H], each L2-normalised
                                                           (y / sqrt(sum y^2 + L2_NORM_EPS))

    x [B, T, C] (16-bit activations)  kernel [W, C]  segment_ids [B, T] int or None

Implementations (`REGISTRY`, op name "short_conv"; default order ("pallas", "xla")):
  "xla"     the forward under `jax.checkpoint` with nothing saved: the backward recomputes the
            float32 intermediates and XLA differentiates them; runs everywhere
  "pallas"  the forward in one Mosaic GPU kernel pass under a custom VJP, saving only x;
            one kernel pass forms d total and the taps' gradient per block of rows, XLA
            the input's gradient from d total and the sum of the taps' gradient
            (`mixer_kernels/mosaic_gpu/short_conv/`: forward, backward and `supports`)
An entry is `fn(x, kernel, segment_ids, *, dtype, normalize_heads) -> y`; `supports(**facts)`
reads `platform_facts()` plus dtype, channels, normalize_heads and kernel_size.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from mixer_core.registry import Entry, Registry, platform_facts
from mixer_kernels.mosaic_gpu.short_conv import register as pallas_backend

L2_NORM_EPS = 1e-6


def recomputed(fn=None, *, static_argnums=()):
    """fn under jax.checkpoint with nothing saved: its backward recomputes the float32
    intermediates from the inputs (16-bit activations)."""
    if fn is None:
        return lambda f: recomputed(f, static_argnums=static_argnums)
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable,
                          static_argnums=static_argnums)


@recomputed
def l2_normalize(x: jax.Array) -> jax.Array:
    """x / sqrt(sum(x^2, -1) + 1e-6), computed in float32, returned in x's dtype (recomputed
    in the backward pass)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + L2_NORM_EPS)).astype(x.dtype)


def same_document(segment_ids: jax.Array | None, length: int, shift: int) -> jax.Array | None:
    """[B, T] bool: position t - shift lies in t's document (None without segment ids); taps
    before t = 0 are zero by the padding of x, whatever this says there."""
    if segment_ids is None:
        return None
    return jnp.pad(segment_ids, ((0, 0), (shift, 0)))[:, :length] == segment_ids


def conv_forward(x: jax.Array, kernel: jax.Array, segment_ids: jax.Array | None, dtype: Any,
                 normalize_heads: int | None) -> jax.Array:
    """The forward of the "xla" entry (module docstring); the "pallas" forward kernel computes
    the same."""
    kernel_size, length = kernel.shape[0], x.shape[1]
    kernel = kernel.astype(jnp.float32)
    x32 = x.astype(jnp.float32)
    total = x32 * kernel[kernel_size - 1]
    for shift in range(1, min(kernel_size, length)):
        shifted = jnp.pad(x32, ((0, 0), (shift, 0), (0, 0)))[:, :length]
        same = same_document(segment_ids, length, shift)
        if same is not None:
            shifted = jnp.where(same[..., None], shifted, 0.0)
        total = total + shifted * kernel[kernel_size - 1 - shift]
    out = jax.nn.silu(total).astype(dtype)
    if normalize_heads is None:
        return out
    return l2_normalize(out.reshape(*out.shape[:-1], normalize_heads, -1))


def short_conv_xla(x, kernel, segment_ids, *, dtype, normalize_heads):
    """The "xla" entry: `conv_forward` recomputed in the backward pass."""
    return recomputed(conv_forward, static_argnums=(3, 4))(x, kernel, segment_ids, dtype,
                                                            normalize_heads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _with_kernels(x, kernel, segment_ids, dtype, normalize_heads):
    return pallas_backend.conv_forward_pass(x, kernel, segment_ids, dtype=dtype,
                                            normalize_heads=normalize_heads, eps=L2_NORM_EPS)


def _save_inputs(x, kernel, segment_ids, dtype, normalize_heads):
    return (_with_kernels(x, kernel, segment_ids, dtype, normalize_heads),
            (x, kernel, segment_ids))


def _kernel_backward(dtype, normalize_heads, residuals, dy):
    x, kernel, segment_ids = residuals
    dx, d_kernel = pallas_backend.conv_backward_pass(x, kernel, segment_ids, dy,
                                                     normalize_heads=normalize_heads,
                                                     eps=L2_NORM_EPS)
    return dx, d_kernel, None


_with_kernels.defvjp(_save_inputs, _kernel_backward)


def short_conv_pallas(x, kernel, segment_ids, *, dtype, normalize_heads):
    """The "pallas" entry: the forward and the backward from the kernels."""
    return _with_kernels(x, kernel, segment_ids, dtype, normalize_heads)


REGISTRY = Registry("short_conv", default_order=("pallas", "xla"), entries=(
    Entry("xla", short_conv_xla),
    Entry("pallas", short_conv_pallas, supports=pallas_backend.supports),
))


def short_conv(x: jax.Array, kernel: jax.Array, segment_ids: jax.Array | None = None, *,
               dtype: Any = None, normalize_heads: int | None = None,
               implementation: str | None = None) -> jax.Array:
    """y [B, T, C] in `dtype` (default x's), or [B, T, H, C / H] with normalize_heads = H."""
    if x.ndim != 3 or kernel.ndim != 2 or kernel.shape[1] != x.shape[2]:
        raise ValueError(f"short_conv: expected x [B, T, C] and kernel [W, C], got "
                         f"{tuple(x.shape)} and {tuple(kernel.shape)}")
    if segment_ids is not None and tuple(segment_ids.shape) != tuple(x.shape[:2]):
        raise ValueError(f"segment_ids: expected shape {tuple(x.shape[:2])} [B, T], got "
                         f"{tuple(segment_ids.shape)}")
    if normalize_heads is not None and x.shape[2] % normalize_heads:
        raise ValueError(f"normalize_heads: {normalize_heads} does not divide the "
                         f"{x.shape[2]} channels")
    dtype = x.dtype if dtype is None else jnp.dtype(dtype)
    _, fn = REGISTRY.select(implementation, **platform_facts(), dtype=x.dtype,
                            channels=x.shape[2], normalize_heads=normalize_heads,
                            kernel_size=kernel.shape[0])
    return fn(x, kernel, segment_ids, dtype=dtype, normalize_heads=normalize_heads)

