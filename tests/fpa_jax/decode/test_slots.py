"""Slot-cache overflow is per (batch row, head): one full (b, h) among others with free slots
sets the (sticky, cache-wide) flag and drops only that (b, h)'s write; no full (b, h), no flag."""

import jax
import jax.numpy as jnp
import numpy as np

from fpa_jax.decode import slots
from tests.seeds import case_seed

BATCH, CAPACITY, HEADS, DIM = 2, 3, 2, 4


def token_inputs(seed, count):
    rng = np.random.default_rng(seed)   # NumPy: jax.random would compile per shape
    k, v = (jnp.asarray(rng.standard_normal((count, BATCH, HEADS, DIM), np.float32))
            for _ in range(2))
    return k, v, jnp.asarray(rng.standard_normal((count, BATCH, HEADS), np.float32))


def test_one_full_row_head_overflows_while_the_others_still_write():
    seed = case_seed(2901)
    k, v, s = token_inputs(seed, CAPACITY + 2)
    write = jax.jit(slots.write)
    cache = slots.empty(BATCH, CAPACITY, HEADS, DIM, DIM, jnp.float32, num_scalars=1)
    for t in range(CAPACITY):                              # every slot of every (b, h) taken
        cache = write(cache, k[t], v[t], (s[t],))
    assert not bool(cache.overflow)
    # free every slot except those of (b=1, h=0): that (b, h) stays full, the others have room
    full = np.zeros((BATCH, CAPACITY, HEADS), bool)
    full[1, :, 0] = True
    cache = slots.evict(cache, jnp.asarray(full))
    cache = write(cache, k[CAPACITY], v[CAPACITY], (s[CAPACITY],))
    assert bool(cache.overflow), f"seed {seed}: a full (b, h) did not set the overflow flag"
    token, alive = np.asarray(cache.token), np.asarray(cache.alive)
    keys = np.asarray(cache.keys)
    for b in range(BATCH):
        for h in range(HEADS):
            if (b, h) == (1, 0):                           # dropped: the old keys untouched
                assert list(token[b, :, h]) == list(range(CAPACITY))
                np.testing.assert_array_equal(keys[b, :, h], np.asarray(k[:CAPACITY, b, h]))
            else:                                          # written into the first free slot
                assert list(token[b, :, h]) == [CAPACITY, -1, -1]
                assert list(alive[b, :, h]) == [True, False, False]
                np.testing.assert_array_equal(keys[b, 0, h], np.asarray(k[CAPACITY, b, h]))
    assert int(cache.length) == CAPACITY + 1
    # sticky: a later write that fits everywhere keeps the flag
    cache = slots.evict(cache, jnp.zeros_like(cache.alive))
    cache = write(cache, k[CAPACITY + 1], v[CAPACITY + 1], (s[CAPACITY + 1],))
    assert bool(cache.overflow)
    assert np.asarray(cache.alive)[:, 0].all()


def test_no_overflow_while_every_row_head_has_a_free_slot():
    seed = case_seed(2902)
    k, v, s = token_inputs(seed, CAPACITY)
    write = jax.jit(slots.write)
    cache = slots.empty(BATCH, CAPACITY, HEADS, DIM, DIM, jnp.float32, num_scalars=1)
    # keep (b=0, h=1) one slot short of full, the others nearly empty: all still fit
    for t in range(CAPACITY - 1):
        cache = write(cache, k[t], v[t], (s[t],))
        keep = np.zeros((BATCH, CAPACITY, HEADS), bool)
        keep[0, :, 1] = True
        cache = slots.evict(cache, jnp.asarray(keep))
    cache = write(cache, k[CAPACITY - 1], v[CAPACITY - 1], (s[CAPACITY - 1],))
    assert not bool(cache.overflow), f"seed {seed}"
    assert list(np.asarray(cache.token)[0, :, 1]) == list(range(CAPACITY))
