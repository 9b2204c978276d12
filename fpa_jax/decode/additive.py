"""Decoding with an additive per-step bias (FoX's log forget gates, ALiBi) over a slot cache.

Each cached key s keeps one float32 scalar, its bias so far; every new token t adds its
increment a_t [B, H] to the bias of the keys already cached, and writes itself with bias 0:

    b_ts = sum_{s < u <= t} a_u        FoX: a_u = log f_u <= 0;  ALiBi: a_u = -slope_h
    out_t = sum_s softmax_s(scale <q_t, k_s> + b_ts) v_s     over the live keys

With a_u <= 0 the bias never rises, so a key whose bias fell below `evict_below` is evicted
for good and its slot reused (the same rule as FPA's, fpa_jax/fpa/decoding.py).
increment=None: no bias at all (softmax with RoPE or NoPE), nothing is ever evicted.

Shapes: q_t, k_t [B, H, D]; v_t [B, H, Dv]; increment_t [B, H]; prefix k [B, T, H, D],
v [B, T, H, Dv], increments [B, T, H]; out_t [B, H, Dv] in q_t's dtype.
"""

from __future__ import annotations

import jax.numpy as jnp

from fpa_jax.decode import slots
from fpa_jax.fpa.decoding import check_eviction


def init_cache(batch, capacity, heads, dim, value_dim=None, dtype=jnp.float32):
    value_dim = dim if value_dim is None else value_dim
    return slots.empty(batch, capacity, heads, dim, value_dim, dtype, num_scalars=1)


def _evicted(cache, evict_below):
    if evict_below is None:
        return cache
    return slots.evict(cache, cache.scalars[0] >= evict_below)


def decode_step(cache, q_t, k_t, v_t, increment_t, *, scale, evict_below=None):
    """One token: (out_t [B, H, Dv], cache). increment_t None: no bias (and no eviction)."""
    check_eviction(evict_below, query_level=False)
    if increment_t is None:
        cache = slots.write(cache, k_t, v_t, (jnp.zeros(k_t.shape[:2], jnp.float32),))
        return slots.attend(cache, q_t, None, scale), cache
    (bias,) = cache.scalars
    cache = _evicted(cache._replace(scalars=(bias + increment_t.astype(jnp.float32)[:, None],)),
                     evict_below)
    cache = slots.write(cache, k_t, v_t, (jnp.zeros(increment_t.shape, jnp.float32),))
    return slots.attend(cache, q_t, cache.scalars[0], scale), cache


def prefill_cache(k, v, increments, *, evict_below=None):
    """The cache after a whole prefix: b_s = sum_{s < u <= T-1} a_u (increments None: 0)."""
    check_eviction(evict_below, query_level=False)
    batch, length, heads, _ = k.shape
    if increments is None:
        bias = jnp.zeros((batch, length, heads), jnp.float32)
        evict_below = None
    else:
        total = jnp.cumsum(increments.astype(jnp.float32), axis=1)
        bias = total[:, -1:] - total
    cache = slots.from_sequence(k, v, (bias,), jnp.ones((batch, length, heads), bool))
    return _evicted(cache, evict_below)
