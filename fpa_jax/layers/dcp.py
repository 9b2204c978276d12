"""DCPAttention: a layer-shared, path-accumulated keep mask from low-rank scores.

    a = x @ W_mask_query,  b = x @ W_mask_key                 [B, T, r]   (r = mask_rank)
    mask_logits_us = <a_u, b_s> / sqrt(r) + mask_offset       [B, T, T]   (shared by all heads)
    logit_ts = q_t.k_s / sqrt(head_dim) + sum_{s<u<=t} log_sigmoid(mask_logits_us)

Dense-only (dcp_attention has only the "reference" implementation).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from fpa_jax.baselines.dcp import dcp_attention
from fpa_jax.layers import common
from mixer_core.inputs import check_mixer_inputs

Dtype = Any


class DCPAttention(nn.Module):
    """DCP-style attention: a layer-shared, path-accumulated keep mask from low-rank scores.

        a = x @ W_mask_query,  b = x @ W_mask_key                 [B, T, r]   (r = mask_rank)
        mask_logits_us = <a_u, b_s> / sqrt(r) + mask_offset       [B, T, T]   (shared by all heads)
        logit_ts = q_t.k_s / sqrt(head_dim) + sum_{s<u<=t} log_sigmoid(mask_logits_us)

    The low-rank "interaction" queries and keys (Dynamic Context Pruning) let every later token
    u vote to keep or drop an earlier key s; dcp_attention accumulates the votes along the path.
    No positional encoding. Parameters: query, key, value, out; mask_query, mask_key (kernels
    [D, r], logical axes ("embed", "mask_rank")); mask_offset (scalar).

    Initialisation: W_mask_query, W_mask_key LeCun normal (so <a_u, b_s> / sqrt(r) is about
    N(0, 1) for unit-scale x; neither factor may start at zero, or the other gets no gradient)
    and mask_offset = logit(keep_init) (default 0.99): keys start almost kept, keep
    probabilities about sigmoid(4.6 +- 1) = 0.97..0.996 per token, like slow FoX gates.
    mask_rank defaults to head_dim. Dense [B, T, T] mask logits: for short sequences (probes).
    """

    num_heads: int
    head_dim: int
    mask_rank: int | None = None
    keep_init: float = 0.99
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    @property
    def op_name(self) -> str:
        """The op this layer calls; `implementation` is checked against its registry."""
        return "dcp_attention"

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        """x [B,T,D] -> [B,T,D]. `positions` is accepted for a uniform interface and unused."""
        layer = type(self).__name__
        common.check_common(self)
        rank = self.head_dim if self.mask_rank is None else self.mask_rank
        common.check_positive_int(layer, "mask_rank", rank)
        if not (isinstance(self.keep_init, float) and 0.0 < self.keep_init < 1.0):
            raise ValueError(f"{layer}: keep_init must be a float in (0, 1), got {self.keep_init!r}")
        check_mixer_inputs(layer, x, segment_ids, positions)

        q, k, v = common.head_projections(self, x, ("query", "key", "value"))
        mask_axes = ("embed", "mask_rank")
        mask_query = nn.Dense(rank, use_bias=False, dtype=jnp.float32, param_dtype=self.param_dtype,
                              kernel_init=common.logical(nn.initializers.lecun_normal(), mask_axes),
                              name="mask_query")(x)
        mask_key = nn.Dense(rank, use_bias=False, dtype=jnp.float32, param_dtype=self.param_dtype,
                            kernel_init=common.logical(nn.initializers.lecun_normal(), mask_axes),
                            name="mask_key")(x)
        mask_offset = self.param(
            "mask_offset",
            common.logical(nn.initializers.constant(math.log(self.keep_init / (1.0 - self.keep_init))), ()),
            (),
            self.param_dtype,
        )
        mask_logits = jnp.einsum("bur,bsr->bus", mask_query, mask_key) / math.sqrt(rank)
        mask_logits = mask_logits + mask_offset.astype(jnp.float32)
        out = dcp_attention(q, k, v, mask_logits, scale=common.attention_scale(self.head_dim),
                            segment_ids=segment_ids, implementation=self.implementation)
        return common.output_projection(self, out, x.shape[-1])
