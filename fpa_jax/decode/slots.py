"""A KV cache of reusable slots: per (batch row, head) every slot holds one key or is free.

    keys     [B, S, H, D]     values [B, S, H, Dv]      (the layer's dtype)
    scalars  tuple of [B, S, H] float32                 per-key bias state (its rule's, e.g.
                                                        FPA's level and running minimum)
    alive    [B, S, H] bool                             slot holds a live key
    token    [B, S, H] int32                            position of that key (-1: free)
    length   [] int32                                   tokens written so far (= next position)
    overflow [] bool                                    a write found no free slot (sticky)

Writing token t puts its key, per (b, h), into the FIRST free slot, so a slot freed by
eviction (alive -> False) is reused by the next token and S only has to hold the live keys.
When a (b, h) has no free slot the write is dropped and `overflow` is set; the caller checks it
outside jit (`decode.driver` grows the cache before that can happen). Attention reads only
live slots:

    out_t[b, h] = sum_{slots j alive} softmax_j(scale <q_t, k_j> + bias_j) v_j

`compact` moves the live slots of every (b, h) to the front (order kept); `resize` then cuts
or pads S, which is how the cache shrinks or grows between jitted steps. A free slot's
scalars are meaningless (finite) until a write sets them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SlotCache(NamedTuple):
    keys: jax.Array
    values: jax.Array
    scalars: tuple
    alive: jax.Array
    token: jax.Array
    length: jax.Array
    overflow: jax.Array

    @property
    def capacity(self) -> int:
        return self.alive.shape[1]


def empty(batch: int, capacity: int, heads: int, key_dim: int, value_dim: int, dtype,
          num_scalars: int = 0) -> SlotCache:
    """A cache with every slot free and `num_scalars` per-slot float32 arrays (zeros)."""
    if capacity < 1:
        raise ValueError(f"capacity: expected a positive int, got {capacity}")
    per_slot = (batch, capacity, heads)
    return SlotCache(
        keys=jnp.zeros((*per_slot, key_dim), dtype),
        values=jnp.zeros((*per_slot, value_dim), dtype),
        scalars=tuple(jnp.zeros(per_slot, jnp.float32) for _ in range(num_scalars)),
        alive=jnp.zeros(per_slot, bool),
        token=jnp.full(per_slot, -1, jnp.int32),
        length=jnp.zeros((), jnp.int32),
        overflow=jnp.zeros((), bool),
    )


def evict(cache: SlotCache, keep: jax.Array) -> SlotCache:
    """Free every live slot where keep [B, S, H] is False."""
    alive = cache.alive & keep
    return cache._replace(alive=alive, token=jnp.where(alive, cache.token, -1))


def write(cache: SlotCache, key_t: jax.Array, value_t: jax.Array, scalars_t: tuple) -> SlotCache:
    """Write one token (key_t [B, H, D], value_t [B, H, Dv], scalars_t [B, H] each) into the
    first free slot of every (b, h); length += 1. No free slot: dropped, overflow set."""
    batch, capacity, heads = cache.alive.shape
    free = ~cache.alive
    has_free = free.any(axis=1)                                      # [B, H]
    slot = jnp.where(has_free, jnp.argmax(free, axis=1), capacity)   # capacity: out of range
    rows = jnp.arange(batch)[:, None]
    cols = jnp.arange(heads)[None, :]

    def put(buffer, item):
        return buffer.at[rows, slot, cols].set(item.astype(buffer.dtype), mode="drop")

    return SlotCache(
        keys=put(cache.keys, key_t),
        values=put(cache.values, value_t),
        scalars=tuple(put(s, x) for s, x in zip(cache.scalars, scalars_t)),
        alive=put(cache.alive, jnp.ones((batch, heads), bool)),
        token=put(cache.token, jnp.broadcast_to(cache.length, (batch, heads))),
        length=cache.length + 1,
        overflow=cache.overflow | ~has_free.all(),
    )


def attend(cache: SlotCache, q_t: jax.Array, bias: jax.Array | None, scale: float,
           content: bool = True) -> jax.Array:
    """q_t [B, H, D], bias [B, S, H] float32 or None -> out [B, H, Dv] (q_t's dtype).

    content=False: the logits are the bias alone (no <q, k> term)."""
    logits = jnp.zeros(cache.alive.shape, jnp.float32)
    if content:
        scores = jnp.einsum("bhd,bshd->bsh", q_t, cache.keys, preferred_element_type=jnp.float32)
        logits = scale * scores
    if bias is not None:
        logits = logits + bias
    weights = jax.nn.softmax(jnp.where(cache.alive, logits, -jnp.inf), axis=1)
    out = jnp.einsum("bsh,bshd->bhd", weights, cache.values.astype(jnp.float32))
    return out.astype(q_t.dtype)


def live_counts(cache: SlotCache) -> jax.Array:
    """[B, H] int32: live keys per batch row and head."""
    return cache.alive.sum(axis=1, dtype=jnp.int32)


def compact(cache: SlotCache) -> SlotCache:
    """Live slots of every (b, h) first, in their current order; free slots after them."""
    order = jnp.argsort(~cache.alive, axis=1, stable=True)           # [B, S, H]

    def gather(x):
        index = order.reshape(order.shape + (1,) * (x.ndim - 3))
        return jnp.take_along_axis(x, index, axis=1)

    return cache._replace(keys=gather(cache.keys), values=gather(cache.values),
                          scalars=tuple(gather(s) for s in cache.scalars),
                          alive=gather(cache.alive), token=gather(cache.token))


def resize(cache: SlotCache, capacity: int) -> SlotCache:
    """Compact, then pad or cut to `capacity` slots. Growing is jittable; cutting checks
    (outside jit) that no live key is lost and raises otherwise."""
    current = cache.capacity
    if capacity < current:
        live = int(live_counts(cache).max())
        if capacity < max(live, 1):
            raise ValueError(f"capacity: {capacity} slots cannot hold the {live} live keys")
    cache = compact(cache)
    if capacity <= current:
        cut = lambda x: x[:, :capacity]
        return cache._replace(keys=cut(cache.keys), values=cut(cache.values),
                              scalars=tuple(cut(s) for s in cache.scalars),
                              alive=cut(cache.alive), token=cut(cache.token))
    extra = capacity - current

    def pad(x, fill=0):
        widths = [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)
        return jnp.pad(x, widths, constant_values=fill)

    return cache._replace(keys=pad(cache.keys), values=pad(cache.values),
                          scalars=tuple(pad(s) for s in cache.scalars),
                          alive=pad(cache.alive, False), token=pad(cache.token, -1))


def from_sequence(keys: jax.Array, values: jax.Array, scalars: tuple, keep: jax.Array) -> SlotCache:
    """A cache holding a whole prefix: keys [B, T, H, D], values [B, T, H, Dv], scalars
    [B, T, H] each, keep [B, T, H] bool (False: already evicted). Slot j holds token j."""
    batch, length, heads = keep.shape
    token = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :, None], keep.shape)
    return SlotCache(keys=keys, values=values,
                     scalars=tuple(s.astype(jnp.float32) for s in scalars), alive=keep,
                     token=jnp.where(keep, token, -1), length=jnp.asarray(length, jnp.int32),
                     overflow=jnp.zeros((), bool))
