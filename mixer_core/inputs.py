"""The input check every sequence mixer layer runs first (FPA, FoX, softmax, Selective, DCP,
dip-sum, Gated DeltaNet): one message per mistake, naming the layer and the argument."""

import jax.numpy as jnp


def check_mixer_inputs(layer: str, x, segment_ids, positions) -> None:
    """x [batch, length, model_dim] floating point; segment_ids and positions None or
    [batch, length] integer."""
    if x.ndim != 3:
        raise ValueError(f"{layer}: x must have shape [batch, length, model_dim], got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{layer}: x must be floating point, got dtype {x.dtype}")
    for name, value in (("segment_ids", segment_ids), ("positions", positions)):
        if value is None:
            continue
        if value.shape != x.shape[:2]:
            raise ValueError(
                f"{layer}: {name} must have shape {x.shape[:2]} (x's [batch, length]), got {value.shape}"
            )
        if not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{layer}: {name} must be an integer array, got dtype {value.dtype}")
