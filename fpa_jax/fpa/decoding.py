"""Token-by-token FPA decoding over a slot cache (fpa_jax/decode/slots.py) with eviction.

Per cached key s and head the cache keeps two float32 scalars: its level psi_s and a running
state r_s, updated with every new token t (field phi_t, level psi_t):

    range minimum (default)   r_s <- min(r_s, phi_t)          (+BIG when s is written)
                              b_ts = beta * min(0, r_s - psi_s)     (psi_t with query_level)
    dip sum (dip_sum=True)    r_s <- r_s + min(0, phi_t - psi_s)    (0 when s is written)
                              b_ts = beta * r_s
    out_t = sum_s softmax_s(scale <q_t, k_s> + b_ts) v_s      over the live keys (content=False:
                                                              the logits are b_ts alone)

With key levels b_ts never rises as t grows (r_s only falls), so a key whose bias dropped
below `evict_below` is evicted for good and its slot is reused by the next token. Query
levels make b_ts depend on psi_t, which can rise again: eviction is refused there.

Shapes: q_t, k_t [B, H, D]; v_t [B, H, Dv]; phi_t, psi_t [B, H]; beta [H]; prefix arrays
k [B, T, H, D], v [B, T, H, Dv], phi, psi [B, T, H]; out_t [B, H, Dv] in q_t's dtype.

After a prefix of T tokens (prefill_cache) the states are r_s = min_{s<u<T} phi_u (a reverse
cumulative minimum) and r_s = sum_{s<u<T} min(0, phi_u - psi_s) (a scan over blocks of u,
[B, block, T, H] at a time: O(T * block) memory).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from fpa_jax.decode import slots
from fpa_jax.fpa import checks
from mixer_core.soft_min import BIG

FPACache = slots.SlotCache   # scalars: (level psi_s, running state r_s)


def check_eviction(evict_below, query_level: bool):
    """evict_below: None (keep every key) or a finite float; query levels allow only None."""
    if evict_below is None:
        return
    if isinstance(evict_below, bool) or not isinstance(evict_below, (int, float)):
        raise TypeError(f"evict_below: expected a float or None, got {evict_below!r}")
    if evict_below != evict_below or evict_below == float("inf"):
        raise ValueError(f"evict_below: expected a float below +inf or None, got {evict_below}")
    if query_level and evict_below != float("-inf"):
        raise ValueError("evict_below: query-level FPA's bias can rise again, so keys cannot "
                         f"be evicted; pass None (got {evict_below})")


def init_cache(batch, capacity, heads, dim, value_dim=None, dtype=jnp.float32):
    """An empty cache of `capacity` slots per (batch row, head)."""
    value_dim = dim if value_dim is None else value_dim
    return slots.empty(batch, capacity, heads, dim, value_dim, dtype, num_scalars=2)


def bias(cache, beta, psi_t=None, *, dip_sum=False):
    """b [B, S, H] float32 of every slot from its scalars (psi_t [B, H] for query levels)."""
    beta = beta.astype(jnp.float32)
    level, running = cache.scalars
    if dip_sum:
        return beta * running
    reference = level if psi_t is None else psi_t.astype(jnp.float32)[:, None, :]
    return beta * jnp.minimum(0.0, running - reference)


def _keep(values, evict_below):
    if evict_below is None:
        return jnp.ones(values.shape, bool)
    return values >= evict_below


def decode_step(cache, q_t, k_t, v_t, phi_t, psi_t, beta, *, scale=None, evict_below=-10.0,
                query_level=False, content=True, dip_sum=False):
    """One token: (out_t [B, H, Dv], cache). evict_below=None (or -inf) keeps every key."""
    batch, _, heads, dim = cache.keys.shape
    for name, x, shape in (("q_t", q_t, (batch, heads, dim)), ("k_t", k_t, (batch, heads, dim)),
                           ("v_t", v_t, (batch, heads, cache.values.shape[-1])),
                           ("phi_t", phi_t, (batch, heads)), ("psi_t", psi_t, (batch, heads)),
                           ("beta", beta, (heads,))):
        checks.require_shape(name, x, shape)
    check_eviction(evict_below, query_level)
    if dip_sum and query_level:
        raise ValueError("dip_sum: supported with key levels only (query_level=False)")
    scale = (dim ** -0.5 if dim else 1.0) if scale is None else scale
    phi_t = phi_t.astype(jnp.float32)
    level, running = cache.scalars
    if dip_sum:
        running = running + jnp.minimum(0.0, phi_t[:, None, :] - level)
    else:
        running = jnp.minimum(running, phi_t[:, None, :])
    cache = cache._replace(scalars=(level, running))
    query_psi = psi_t if query_level else None
    cache = slots.evict(cache, _keep(bias(cache, beta, query_psi, dip_sum=dip_sum), evict_below))
    fresh = 0.0 if dip_sum else BIG
    cache = slots.write(cache, k_t, v_t, (psi_t, jnp.full(phi_t.shape, fresh, jnp.float32)))
    out = slots.attend(cache, q_t, bias(cache, beta, query_psi, dip_sum=dip_sum), scale, content)
    return out, cache


def dip_sums_through_block(dip_total, phi_u, u0, psi):
    """Running dip sums over one block of later tokens u = u0 .. u0 + n - 1:

        out[:, i, s] = dip_total[:, s] + sum_{u0 <= u <= u0 + i, u > s} min(0, phi_u - psi_s)

    dip_total, psi [B, T, ...]; phi_u [B, n, ...] (trailing dims alike, e.g. heads) ->
    [B, n, T, ...]; out[:, -1] is the total to carry into the next block. A padded u with
    phi_u = BIG adds nothing."""
    tokens = u0 + jnp.arange(phi_u.shape[1])
    after = tokens[:, None] > jnp.arange(psi.shape[1])[None, :]                # [n, T]: u > s
    after = after.reshape(after.shape + (1,) * (psi.ndim - 2))
    dips = jnp.where(after, jnp.minimum(0.0, phi_u[:, :, None] - psi[:, None]), 0.0)
    return dip_total[:, None] + jnp.cumsum(dips, axis=1)


def _dip_totals(phi, psi, block):
    """sum_{s < u < T} min(0, phi_u - psi_s) [B, T, H]: a scan over blocks of `block` u
    (dip_sums_through_block; O(T * block) memory); phi, psi float32 [B, T, H]."""
    batch, length, heads = phi.shape
    block = max(1, min(block, length))
    count = -(-length // block)
    phi_blocks = jnp.pad(phi, ((0, 0), (0, count * block - length), (0, 0)),
                         constant_values=BIG)
    phi_blocks = jnp.moveaxis(phi_blocks.reshape(batch, count, block, heads), 1, 0)

    def add_block(total, inputs):
        u0, phi_u = inputs                                                 # phi_u [B, block, H]
        return dip_sums_through_block(total, phi_u, u0, psi)[:, -1], None

    total, _ = lax.scan(add_block, jnp.zeros_like(psi), (jnp.arange(count) * block, phi_blocks))
    return total


def prefix_scalars(phi, psi, *, dip_sum=False, block=128):
    """(level, running) [B, T, H] float32 of every key s after the last token T-1 of a prefix;
    O(T * block) memory (the dip sums in blocks of `block` later tokens u)."""
    checks.require_positive_int("block", block)
    phi, psi = phi.astype(jnp.float32), psi.astype(jnp.float32)
    if dip_sum:
        return psi, _dip_totals(phi, psi, block)
    suffix_min = lax.cummin(phi, axis=1, reverse=True)                 # min_{u >= s} phi_u
    running = jnp.concatenate([suffix_min[:, 1:], jnp.full_like(phi[:, :1], BIG)], axis=1)
    return psi, running


def prefill_cache(k, v, phi, psi, beta, *, evict_below=-10.0, query_level=False,
                  dip_sum=False):
    """The cache after a whole prefix (T slots, slot j = token j, evicted ones already free)."""
    checks.require_rank("k", k, 4)
    batch, length, heads, _ = k.shape
    for name, x in (("phi", phi), ("psi", psi)):
        checks.require_shape(name, x, (batch, length, heads))
    checks.require_shape("beta", beta, (heads,))
    check_eviction(evict_below, query_level)
    scalars = prefix_scalars(phi, psi, dip_sum=dip_sum)
    cache = slots.from_sequence(k, v, scalars, jnp.ones((batch, length, heads), bool))
    if query_level:   # no eviction: the scalars alone describe the bias of the next query
        return cache
    return slots.evict(cache, _keep(bias(cache, beta, dip_sum=dip_sum), evict_below))


def live_fraction(cache):
    """Share of the written (key, head) pairs still alive: [] float32."""
    batch, _, heads = cache.alive.shape
    written = jnp.maximum(cache.length, 1) * batch * heads
    return cache.alive.sum() / written


__all__ = ["FPACache", "bias", "check_eviction", "decode_step", "init_cache", "live_fraction",
           "dip_sums_through_block", "prefill_cache", "prefix_scalars"]
