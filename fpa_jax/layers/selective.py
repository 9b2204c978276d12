"""SelectiveAttention: a layer-shared soft mask built from head 0's attention logits.

    selection_logits_us = <q_u, k_s> / sqrt(head_dim) of head 0 (after RoPE)   [B, T, T]
    logit_ts = q_t.k_s / sqrt(head_dim) - sum_{s<u<t} relu(selection_logits_us)  (every head)

Dense-only (selective_attention has only the "reference" implementation).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from fpa_jax.baselines.selective import selective_attention
from fpa_jax.layers import common

Dtype = Any

POSITIONS = ("rope", "nope")


class SelectiveAttention(nn.Module):
    """Selective Attention: one layer-shared soft mask built from head 0's attention logits.

        selection_logits_us = <q_u, k_s> / sqrt(head_dim) of head 0 (after RoPE)   [B, T, T]
        logit_ts = q_t.k_s / sqrt(head_dim) - sum_{s<u<t} relu(selection_logits_us)  (every head)

    The selection reuses head 0's query/key, so there are no extra parameters: query, key,
    value, out (LeCun normal). Dense [B, T, T] selection logits: for short sequences (probes).
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
        return "selective_attention"

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        q, k, v = common.checked_rope_projections(self, x, segment_ids, positions, POSITIONS)
        scale = common.attention_scale(self.head_dim)
        selection_logits = scale * jnp.einsum(
            "bud,bsd->bus", q[:, :, 0], k[:, :, 0], preferred_element_type=jnp.float32
        )
        out = selective_attention(q, k, v, selection_logits, scale=scale, segment_ids=segment_ids,
                                  implementation=self.implementation)
        return common.output_projection(self, out, x.shape[-1])
