"""Argument checks shared by the FPA entry points: each failure names the argument.

Value ranges (FPA's beta > 0) go through `mixer_core.ranges.check_range`, shared with the
gated delta rule: checked at once on concrete arrays, and inside jit only in checked mode.
"""

import jax.numpy as jnp
import numpy as np

from mixer_core.ranges import check_range


def require_rank(name, x, rank):
    if jnp.ndim(x) != rank:
        raise ValueError(f"{name}: expected rank {rank}, got shape {tuple(jnp.shape(x))}")


def require_float(name, x):
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {jnp.result_type(x)}")


def require_shape(name, x, shape):
    if tuple(jnp.shape(x)) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(jnp.shape(x))}")


def require_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


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
    """beta > 0 (the layer parameterises beta = softplus(rho))."""
    check_range("beta", beta, lambda b, xp: b > 0, "every entry > 0 (use softplus(rho))",
                lambda b, xp: xp.min(b))
