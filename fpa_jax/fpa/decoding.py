"""Token-by-token FPA decoding with a KV cache whose dead keys can be evicted.

Per cached key s and head, the cache holds its level psi_s and the running field minimum
m_s = min_{s < u <= t} phi_u (+inf right after s is written). At each new token t:

    m_s    <- min(m_s, phi_t)                    for every cached key      O(cache)
    b_ts   =  beta * min(0, m_s - psi_s)         (b_tt = 0: the new key's range is empty)
    out_t  =  sum_s softmax_s(scale * <q_t, k_s> + b_ts) v_s   over live keys

b_ts never rises (m_s only falls), so a key whose bias dropped below `evict_below` can be
dropped for good. The cache has a fixed capacity (static shapes, jit-friendly); an evicted
slot is marked dead per head and its memory is reusable by a compacting caller.
`live_fraction` reports how much of the cache is still alive.

Shapes: q_t, k_t, v_t [B, H, D]; phi_t, psi_t [B, H]; beta [H]; cache arrays [B, S, H, ...].
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fpa_jax.fpa import checks
from fpa_jax.fpa.blocks import BIG


class FPACache(NamedTuple):
    keys: jnp.ndarray         # [B, S, H, D]
    values: jnp.ndarray       # [B, S, H, Dv]
    levels: jnp.ndarray       # [B, S, H] psi_s
    running_min: jnp.ndarray  # [B, S, H] m_s
    alive: jnp.ndarray        # [B, S, H] bool: written and not evicted
    length: jnp.ndarray       # [] int32: tokens written so far


def init_cache(batch, capacity, heads, dim, value_dim=None, dtype=jnp.float32):
    """An empty cache for `capacity` tokens."""
    value_dim = dim if value_dim is None else value_dim
    return FPACache(
        keys=jnp.zeros((batch, capacity, heads, dim), dtype),
        values=jnp.zeros((batch, capacity, heads, value_dim), dtype),
        levels=jnp.zeros((batch, capacity, heads), jnp.float32),
        running_min=jnp.full((batch, capacity, heads), BIG, jnp.float32),
        alive=jnp.zeros((batch, capacity, heads), bool),
        length=jnp.zeros((), jnp.int32),
    )


def decode_step(cache: FPACache, q_t, k_t, v_t, phi_t, psi_t, beta, *, scale=None,
                evict_below=-10.0):
    """One token: returns (out_t [B, H, Dv], updated cache). evict_below=-inf keeps every key.

    Writing past the cache's capacity cannot raise under jit; the output is NaN instead.
    """
    batch, _, heads, dim = cache.keys.shape
    for name, x, shape in (("q_t", q_t, (batch, heads, dim)), ("k_t", k_t, (batch, heads, dim)),
                           ("phi_t", phi_t, (batch, heads)), ("psi_t", psi_t, (batch, heads)),
                           ("beta", beta, (heads,))):
        checks.require_shape(name, x, shape)
    checks.require_shape("v_t", v_t, (batch, heads, cache.values.shape[-1]))
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    position = cache.length
    running_min = jnp.minimum(cache.running_min, phi_t.astype(jnp.float32)[:, None, :])
    bias = beta.astype(jnp.float32) * jnp.minimum(0.0, running_min - cache.levels)
    alive = cache.alive & (bias >= evict_below)

    write = lambda buffer, item: jax.lax.dynamic_update_slice_in_dim(buffer, item[:, None], position, axis=1)
    keys = write(cache.keys, k_t.astype(cache.keys.dtype))
    values = write(cache.values, v_t.astype(cache.values.dtype))
    levels = write(cache.levels, psi_t.astype(jnp.float32))
    running_min = write(running_min, jnp.full(phi_t.shape, BIG, jnp.float32))
    bias = write(bias, jnp.zeros(phi_t.shape, jnp.float32))
    alive = write(alive, jnp.ones(phi_t.shape, bool))

    scores = jnp.einsum("bhd,bshd->bsh", q_t, keys, preferred_element_type=jnp.float32)
    logits = jnp.where(alive, scale * scores + bias, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=1)
    out = jnp.einsum("bsh,bshd->bhd", weights, values.astype(jnp.float32))
    out = jnp.where(position < keys.shape[1], out, jnp.nan).astype(q_t.dtype)
    return out, FPACache(keys, values, levels, running_min, alive, position + 1)


def live_fraction(cache: FPACache):
    """Share of written (key, head) slots still alive: [] float32."""
    written = jnp.maximum(cache.length, 1) * cache.alive.shape[0] * cache.alive.shape[2]
    return cache.alive.sum() / written
