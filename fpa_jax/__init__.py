"""FPA (field/level path-minimum attention bias) and attention baselines in JAX."""

from fpa_jax.fpa import fields, fpa_attention, fpa_attention_reference, fpa_bias
