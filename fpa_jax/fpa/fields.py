"""The FPA walk, field and level.

    W_t   = sum_{u <= t, u in the document of t} delta_u      (float32 cumulative sum)
    phi_t = W_t + g_t                                          field
    psi_t = W_t + h_t                                          level

delta, g, h: [B, T, H]; segment_ids: [B, T] or None -> phi, psi: float32 [B, T, H].
With segment_ids the walk restarts at each document start (the bias only compares values
inside one document, so this changes nothing but keeps the numbers small).
"""

import jax.numpy as jnp
from jax import lax

from fpa_jax.fpa import checks


def document_starts(segment_ids):
    """[B, T] bool: True where a new document begins (and at t = 0)."""
    change = segment_ids[:, 1:] != segment_ids[:, :-1]
    return jnp.concatenate([jnp.ones((segment_ids.shape[0], 1), bool), change], axis=1)


def segment_cumsum(x, segment_ids):
    """Cumulative sum of x [B, T, H] along T, restarting at each document start."""
    total = jnp.cumsum(x, axis=1)
    if segment_ids is None:
        return total
    starts = document_starts(segment_ids)
    positions = jnp.arange(x.shape[1])[None, :]
    last_start = lax.cummax(jnp.where(starts, positions, 0), axis=1)
    before_start = total - x  # the running sum just before each position
    offset = jnp.take_along_axis(before_start, last_start[:, :, None], axis=1)
    return total - offset


def fields(delta, g, h, *, segment_ids=None):
    """Walk, field and level: returns (phi, psi), each float32 [B, T, H]."""
    for name, x in (("delta", delta), ("g", g), ("h", h)):
        checks.require_rank(name, x, 3)
        checks.require_float(name, x)
    checks.require_shape("g", g, delta.shape)
    checks.require_shape("h", h, delta.shape)
    checks.check_segment_ids(segment_ids, delta.shape[0], delta.shape[1])
    dtype = jnp.promote_types(delta.dtype, jnp.float32)  # float64 stays float64
    walk = segment_cumsum(delta.astype(dtype), segment_ids)
    return walk + g.astype(dtype), walk + h.astype(dtype)
