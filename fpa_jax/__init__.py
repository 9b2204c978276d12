"""FPA (field/level path-minimum attention bias) and attention baselines in JAX.

Ops (pure functions): fpa_attention, fpa_bias, fields and the baselines softmax_attention
(RoPE/NoPE/ALiBi), fox_attention, selective_attention, dcp_attention, dipsum_attention.
Each op dispatches through its own registry; REGISTRIES maps op name -> Registry.
Flax Linen layers: FPAAttention, FoXAttention, SoftmaxAttention, SelectiveAttention,
DCPAttention.
"""

from fpa_jax.baselines import (alibi_slopes, apply_rope, dcp_attention, dipsum_attention,
                               fox_attention, selective_attention, softmax_attention)
from fpa_jax.fpa import fields, fpa_attention, fpa_attention_reference, fpa_bias
from fpa_jax.layers import (DCPAttention, FoXAttention, FPAAttention, SelectiveAttention,
                            SoftmaxAttention)
from fpa_jax.registries import REGISTRIES

__all__ = [
    "DCPAttention", "FPAAttention", "FoXAttention", "REGISTRIES", "SelectiveAttention",
    "SoftmaxAttention", "alibi_slopes", "apply_rope", "dcp_attention", "dipsum_attention",
    "fields", "fox_attention", "fpa_attention", "fpa_attention_reference", "fpa_bias",
    "selective_attention", "softmax_attention",
]
