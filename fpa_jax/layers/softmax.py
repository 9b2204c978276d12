"""SoftmaxAttention: causal softmax attention with RoPE, no positions (NoPE) or ALiBi.

    q, k <- rope(q, positions), rope(k, positions)        position="rope" (common.rotate)
    q, k <- rotate_yarn(q, k, positions)                  position="rope", rope_scaling=YarnScaling
                                                          (fpa_jax/baselines/rope_scaling.py)
    logit_ts = q_t.k_s / sqrt(head_dim) [- slope_h (t - s)  with position="alibi"]
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from fpa_jax import context_shard
from fpa_jax.baselines.rope import alibi_slopes
from fpa_jax.baselines.rope_scaling import YarnScaling, rotate_yarn
from fpa_jax.baselines.softmax import softmax_attention
from fpa_jax.layers import common
from mixer_core import shard
from mixer_core.inputs import check_mixer_inputs

Dtype = Any

POSITIONS = ("rope", "nope", "alibi")


class SoftmaxAttention(nn.Module):
    """Causal softmax attention with RoPE ("rope"), no positions ("nope") or ALiBi ("alibi").

    RoPE rotates q and k by `positions` (default: restarting at each document) with base
    rope_base; with rope_scaling (a YarnScaling, position="rope" only) the frequencies are
    YaRN's. ALiBi adds -slope_h * (t - s) with the standard geometric slopes.
    Parameters: query, key, value, out (LeCun normal).
    """

    num_heads: int
    head_dim: int
    position: str = "rope"
    rope_base: float = 10000.0
    rope_scaling: YarnScaling | None = None
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None
    block_size: int | None = None    # the op's block (None: its default), as FPAAttention's

    @property
    def op_name(self) -> str:
        """The op this layer calls; `implementation` is checked against its registry."""
        return "softmax_attention"

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        common.check_block_size(self)
        if self.rope_scaling is None:
            q, k, v = common.checked_rope_projections(self, x, segment_ids, positions, POSITIONS)
        else:
            q, k, v = _yarn_projections(self, x, segment_ids, positions)
        slopes = alibi_slopes(self.num_heads) if self.position == "alibi" else None
        scale = common.attention_scale(self.head_dim)
        out = shard.ring_or_shard(
            softmax_attention, context_shard.softmax_attention, q, k, v,
            layouts=shard.SOFTMAX_LAYOUTS, scale=scale, segment_ids=segment_ids,
            alibi_slopes=slopes, implementation=self.implementation, **common.block_options(self))
        return common.output_projection(self, out, x.shape[-1])


def _yarn_projections(module, x, segment_ids, positions):
    """The checks and q, k, v of the layer with q and k rotated by YaRN's frequencies."""
    layer = type(module).__name__
    if not isinstance(module.rope_scaling, YarnScaling) or module.position != "rope":
        raise ValueError(f"{layer}: rope_scaling must be a YarnScaling with position='rope', "
                         f"got {module.rope_scaling!r} with position={module.position!r}")
    common.check_common(module)
    common.check_rope(layer, module)
    check_mixer_inputs(layer, x, segment_ids, positions)
    q, k, v = common.head_projections(module, x, ("query", "key", "value"))
    if positions is None:
        positions = common.positions_within_segments(segment_ids, *x.shape[:2])
    q, k = rotate_yarn(q, k, positions, base=module.rope_base, scaling=module.rope_scaling)
    return q, k, v
