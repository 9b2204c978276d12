"""Argument checks shared by the FPA entry points: each failure names the argument."""

import jax.numpy as jnp
import numpy as np


def require_rank(name, x, rank):
    if jnp.ndim(x) != rank:
        raise ValueError(f"{name}: expected rank {rank}, got shape {tuple(jnp.shape(x))}")


def require_float(name, x):
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {jnp.result_type(x)}")


def require_shape(name, x, shape):
    if tuple(jnp.shape(x)) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(jnp.shape(x))}")


def check_segment_ids(segment_ids, batch, length):
    if segment_ids is None:
        return
    require_shape("segment_ids", segment_ids, (batch, length))
    if not jnp.issubdtype(jnp.result_type(segment_ids), jnp.integer):
        raise TypeError(f"segment_ids: expected an integer dtype, got {jnp.result_type(segment_ids)}")


def check_tau(tau):
    if not isinstance(tau, (int, float)) or not np.isfinite(tau) or tau <= 0:
        raise ValueError(f"tau: expected a positive finite Python float, got {tau!r}")


def check_positive_beta(beta):
    """Rejects non-positive beta when its value is concrete (outside jit)."""
    try:
        values = np.asarray(beta)
    except Exception:  # a tracer under jit: the layer parameterises beta = softplus(rho) > 0
        return
    if values.size and not np.all(values > 0):
        raise ValueError(f"beta: expected every entry > 0 (use softplus(rho)), got min {values.min()}")
