"""Causal softmax attention baseline, optionally with ALiBi (RoPE/NoPE: the caller's choice).

    logit_ts = scale * <q_t, k_s> - slope_h * (t - s)         (ALiBi term only if slopes given)
    out_t    = sum_{s <= t, same segment} softmax_s(logit_t.) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; alibi_slopes [H] float; segment_ids [B, T] int
    -> out [B, T, H, Dv] in q's dtype.

ALiBi is separable, -slope (t - s) = (-slope t) - (-slope s), so the blocked path takes
row_bias_t = -slope t and col_bias_s = -slope s (absolute positions; only t - s matters, also
inside a packed document).

implementation: "reference" = dense masked softmax; "xla" = blocked flash path
(flash_xla.py); None = "xla", except that on a GPU backend, for bf16/fp16 inputs without ALiBi
or segment_ids and with equal q/v head dims of at most 128 (a multiple of 8), it calls
jax.nn.dot_product_attention(implementation="cudnn") (causal), which is several times faster.
"pallas" is not available yet (NotImplementedError).
"""

import jax
import jax.numpy as jnp

from fpa_jax.baselines import flash_xla
from fpa_jax.fpa import checks


def _alibi_biases(slopes, batch, length):
    """ALiBi as (row_bias, col_bias) [B, T, H] float32: row - col = -slope (t - s)."""
    position_term = -jnp.arange(length, dtype=jnp.float32)[:, None] * slopes.astype(jnp.float32)
    both = jnp.broadcast_to(position_term, (batch, length, slopes.shape[0]))
    return both, both


def _uses_cudnn(q, v, segment_ids, alibi_slopes):
    head_dim = q.shape[-1]
    return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
            and segment_ids is None and alibi_slopes is None and v.shape[-1] == head_dim
            and head_dim <= 128 and head_dim % 8 == 0)


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
    chosen = flash_xla.resolve_implementation(implementation, "softmax_attention")

    if implementation is None and _uses_cudnn(q, v, segment_ids, alibi_slopes):
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                            implementation="cudnn")
    if chosen == "reference":
        bias = None
        if alibi_slopes is not None:
            positions = jnp.arange(length, dtype=jnp.float32)
            distance = positions[:, None] - positions[None, :]  # t - s
            bias = -alibi_slopes.astype(jnp.float32)[None, :, None, None] * distance
        out, _ = flash_xla.dense_attention(q, k, v, bias, scale=scale, segment_ids=segment_ids)
        return out
    row_bias = col_bias = None
    if alibi_slopes is not None:
        row_bias, col_bias = _alibi_biases(alibi_slopes, batch, length)
    out, _ = flash_xla.flash_attention(q, k, v, row_bias=row_bias, col_bias=col_bias, scale=scale,
                                       segment_ids=segment_ids, block_size=block_size)
    return out
