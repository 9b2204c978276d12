"""FoXAttention: softmax attention plus the summed log forget gates (Forgetting Transformer).

    log f = log_sigmoid(x @ W_f + b_f)                    [B, T, H]   (forget_proj)
    logit_ts = q_t.k_s / sqrt(head_dim) + sum_{s<u<=t} log f_u          (fox_attention; no RoPE)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from fpa_jax import context_shard
from fpa_jax.baselines.fox import fox_attention
from fpa_jax.layers import common
from mixer_core import shard
from mixer_core.inputs import check_mixer_inputs

Dtype = Any


class FoXAttention(nn.Module):
    """Forgetting attention (FoX): softmax attention plus the summed log forget gates, no RoPE.

        log f = log_sigmoid(x @ W_f + b_f)       [B, T, H]   (forget_proj)
        logit_ts = q_t.k_s / sqrt(head_dim) + sum_{s<u<=t} log f_u

    Initialisation: W_f = 0 and b_f = logit(f_h) with the same per-head spread of forget gates
    as FPAAttention (forget_init_range, default 0.95..0.99): the gates start high, so attention
    starts long-range with decay time-scales of about 20..100 tokens, and the layer starts as
    exactly the same function as an FPAAttention with the same q/k/v/out weights. The zero
    kernel receives gradient from the first step. q/k/v/out kernels: LeCun normal.
    """

    num_heads: int
    head_dim: int
    forget_init_range: tuple = common.DEFAULT_FORGET_INIT_RANGE
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None
    block_size: int | None = None    # the op's block (None: its default), as FPAAttention's

    @property
    def op_name(self) -> str:
        """The op this layer calls; `implementation` is checked against its registry."""
        return "fox_attention"

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        """x [B,T,D] -> [B,T,D]. `positions` is accepted for a uniform interface and unused (no RoPE)."""
        layer = type(self).__name__
        common.check_common(self)
        common.check_forget_init_range(layer, self.forget_init_range)
        common.check_block_size(self)
        check_mixer_inputs(layer, x, segment_ids, positions)

        q, k, v = common.head_projections(self, x, ("query", "key", "value"))
        forget = common.per_head_forget_values(self.num_heads, self.forget_init_range)
        forget_init = common.constant_vector_init(np.log(forget / (1.0 - forget)))
        forget_logit = common.per_head_scalar_map(self, x, "forget_proj", forget_init)
        log_forget = jax.nn.log_sigmoid(forget_logit)
        scale = common.attention_scale(self.head_dim)
        out = shard.ring_or_shard(
            fox_attention, context_shard.fox_attention, q, k, v, log_forget,
            layouts=shard.FOX_LAYOUTS, scale=scale, segment_ids=segment_ids,
            implementation=self.implementation, **common.block_options(self))
        return common.output_projection(self, out, x.shape[-1])
