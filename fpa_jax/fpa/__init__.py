"""FPA: softmax attention with a field/level path-minimum bias (see docs/fpa.md)."""

from fpa_jax.fpa.api import fpa_attention
from fpa_jax.fpa.decoding import FPACache, decode_step, init_cache, live_fraction
from fpa_jax.fpa.fields import fields
from fpa_jax.fpa.reference import fpa_attention_reference, fpa_bias

__all__ = ["FPACache", "decode_step", "fields", "fpa_attention", "fpa_attention_reference",
           "fpa_bias", "init_cache", "live_fraction"]
