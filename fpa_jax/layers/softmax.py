"""SoftmaxAttention: causal softmax attention with RoPE, no positions (NoPE) or ALiBi.

    q, k <- rope(q, positions), rope(k, positions)        position="rope" (common.rotate)
    logit_ts = q_t.k_s / sqrt(head_dim) [- slope_h (t - s)  with position="alibi"]
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from fpa_jax.baselines.rope import alibi_slopes
from fpa_jax.baselines.softmax import softmax_attention
from fpa_jax.layers import common

Dtype = Any

POSITIONS = ("rope", "nope", "alibi")


class SoftmaxAttention(nn.Module):
    """Causal softmax attention with RoPE ("rope"), no positions ("nope") or ALiBi ("alibi").

    RoPE rotates q and k by `positions` (default: restarting at each document) with base
    rope_base. ALiBi adds -slope_h * (t - s) with the standard geometric slopes.
    Parameters: query, key, value, out (LeCun normal).
    """

    num_heads: int
    head_dim: int
    position: str = "rope"
    rope_base: float = 10000.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    @property
    def op_name(self) -> str:
        """The op this layer calls; `implementation` is checked against its registry."""
        return "softmax_attention"

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        q, k, v = common.checked_rope_projections(self, x, segment_ids, positions, POSITIONS)
        slopes = alibi_slopes(self.num_heads) if self.position == "alibi" else None
        out = softmax_attention(q, k, v, scale=common.attention_scale(self.head_dim),
                                segment_ids=segment_ids, alibi_slopes=slopes,
                                implementation=self.implementation)
        return common.output_projection(self, out, x.shape[-1])
