"""Causal softmax attention baseline, optionally with ALiBi (RoPE/NoPE: the caller's choice).

    logit_ts = scale * <q_t, k_s> - slope_h * (t - s)         (ALiBi term only if slopes given)
    out_t    = sum_{s <= t, same segment} softmax_s(logit_t.) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; alibi_slopes [H] float; segment_ids [B, T] int
    -> out [B, T, H, Dv] in q's dtype.

ALiBi is separable, -slope (t - s) = (-slope t) - (-slope s), so the blocked path takes
row_bias_t = -slope t and col_bias_s = -slope s (absolute positions; only t - s matters, also
inside a packed document).

Implementations (`REGISTRY`, op name "softmax_attention"; default order
("cudnn", "pallas", "xla"); cuDNN first, the fastest causal softmax on a GPU):
  "reference"  dense masked softmax (never chosen by default)
  "xla"        blocked flash path (flash_xla.py); runs everywhere
  "cudnn"      jax.nn.dot_product_attention(implementation="cudnn", is_causal=True), several
               times faster; supports a GPU, bf16/fp16, no segment_ids, no ALiBi, equal q/v
               head dims of at most 128 that are a multiple of 8 (`cudnn_supports`)
  "pallas"     the Mosaic GPU kernels (`mixer_kernels.mosaic_gpu.attention.register`), imported here
An entry is `fn(q, k, v, segment_ids, alibi_slopes, *, scale, block_size) -> out` (q's dtype)
on validated arrays; `supports` reads `fpa_jax.dispatch.attention_facts` plus has_alibi and
block_size (docs/api.md).
"""

import jax
import jax.numpy as jnp

from fpa_jax.baselines import flash_xla
from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import checks
from mixer_kernels.mosaic_gpu.attention import register as pallas_backend
from mixer_core.registry import Entry, Registry

CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
CUDNN_MAX_HEAD_DIM = 128


def _alibi_biases(slopes, batch, length):
    """ALiBi as (row_bias, col_bias) [B, T, H] float32: row - col = -slope (t - s)."""
    position_term = -jnp.arange(length, dtype=jnp.float32)[:, None] * slopes.astype(jnp.float32)
    both = jnp.broadcast_to(position_term, (batch, length, slopes.shape[0]))
    return both, both


def _reference(q, k, v, segment_ids, alibi_slopes, *, scale, block_size):
    del block_size  # dense
    bias = None
    if alibi_slopes is not None:
        positions = jnp.arange(q.shape[1], dtype=jnp.float32)
        distance = positions[:, None] - positions[None, :]  # t - s
        bias = -alibi_slopes.astype(jnp.float32)[None, :, None, None] * distance
    out, _ = flash_xla.dense_attention(q, k, v, bias, scale=scale, segment_ids=segment_ids)
    return out


def _xla(q, k, v, segment_ids, alibi_slopes, *, scale, block_size):
    row_bias = col_bias = None
    if alibi_slopes is not None:
        row_bias, col_bias = _alibi_biases(alibi_slopes, q.shape[0], q.shape[1])
    out, _ = flash_xla.flash_attention(q, k, v, row_bias=row_bias, col_bias=col_bias, scale=scale,
                                       segment_ids=segment_ids, block_size=block_size)
    return out


def _cudnn(q, k, v, segment_ids, alibi_slopes, *, scale, block_size):
    del segment_ids, alibi_slopes, block_size  # None by `cudnn_supports`; no block to choose
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                        implementation="cudnn")


def cudnn_supports(*, platform, dtype, head_dim, value_head_dim, has_segment_ids, has_alibi,
                   **_facts):
    """None if cuDNN's fused attention runs on these inputs, else why not."""
    if platform != "gpu":
        return f"needs a GPU, got platform {platform}"
    if dtype not in CUDNN_DTYPES:
        return f"needs bfloat16 or float16 inputs, got {dtype}"
    if has_segment_ids:
        return "does not take segment_ids"
    if has_alibi:
        return "does not take ALiBi slopes"
    if value_head_dim != head_dim:
        return f"needs equal q and v head dims, got {head_dim} and {value_head_dim}"
    if head_dim > CUDNN_MAX_HEAD_DIM or head_dim % 8:
        return f"needs a head dim <= {CUDNN_MAX_HEAD_DIM} and a multiple of 8, got {head_dim}"
    return None


REGISTRY = Registry("softmax_attention", default_order=("cudnn", "pallas", "xla"), entries=(
    Entry("reference", _reference),
    Entry("xla", _xla),
    Entry("cudnn", _cudnn, supports=cudnn_supports),
    Entry("pallas", pallas_backend.softmax_pallas, supports=pallas_backend.pallas_supports),
))


def softmax_attention(q, k, v, *, scale=None, segment_ids=None, alibi_slopes=None,
                      implementation=None, block_size=None):
    """Causal softmax attention -> out [B, T, H, Dv] (q's dtype). See the module docstring.

    block_size: key block of the "xla" path (default 128).
    """
    batch, length, heads, head_dim = flash_xla.check_qkv(q, k, v)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = flash_xla.resolve_scale(scale, head_dim)
    if alibi_slopes is not None:
        checks.require_shape("alibi_slopes", alibi_slopes, (heads,))
        checks.require_float("alibi_slopes", alibi_slopes)
    flash_xla.check_block_size("block_size", block_size)
    facts = attention_facts(q, v, segment_ids, has_alibi=alibi_slopes is not None,
                            block_size=block_size)
    _, fn = REGISTRY.select(implementation, **facts)
    return fn(q, k, v, segment_ids, alibi_slopes, scale=scale, block_size=block_size)
