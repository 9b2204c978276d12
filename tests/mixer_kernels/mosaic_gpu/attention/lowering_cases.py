"""Bias descriptions with placeholder vectors, for the tests that only lower the kernels."""

import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias


def placeholder_bias(kind, batch, length, heads):
    """kind: none | separable | fpa | fpa_query | fpa_no_content."""
    vec = jnp.zeros((batch, length, heads), jnp.float32)
    if kind == "none":
        return NoBias()
    if kind == "separable":
        return SeparableBias(vec, vec)
    return FPABias(vec, vec, jnp.ones((heads,), jnp.float32), query_level=kind == "fpa_query",
                   content=kind != "fpa_no_content")
