"""Attention baselines for the FPA experiments (softmax/RoPE/ALiBi, FoX, Selective Attention,
DCP, dip-sum FPA) and the blocked separable-bias attention core they share."""

from fpa_jax.baselines.dcp import dcp_attention
from fpa_jax.baselines.dipsum import dipsum_attention
from fpa_jax.baselines.flash_xla import dense_attention, flash_attention
from fpa_jax.baselines.fox import fox_attention
from fpa_jax.baselines.rope import alibi_slopes, apply_rope
from fpa_jax.baselines.selective import selective_attention
from fpa_jax.baselines.softmax import softmax_attention

__all__ = [
    "alibi_slopes",
    "apply_rope",
    "dcp_attention",
    "dense_attention",
    "dipsum_attention",
    "flash_attention",
    "fox_attention",
    "selective_attention",
    "softmax_attention",
]
