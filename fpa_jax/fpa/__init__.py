"""FPA: softmax attention with a field/level path-minimum bias (see FPA.md)."""

from fpa_jax.fpa.api import fpa_attention
from fpa_jax.fpa.fields import fields
from fpa_jax.fpa.reference import fpa_attention_reference, fpa_bias

__all__ = ["fields", "fpa_attention", "fpa_attention_reference", "fpa_bias"]
