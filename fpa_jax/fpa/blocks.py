"""Per-block statistics of the field that the blocked FPA forward and backward share.

For a field phi [T] cut into nb blocks of size n (block b = [b n, (b+1) n)):

    prefix_min[b, t]  = min_{bn <= u <= t} phi_u           inclusive, query side (C_t)
    suffix_min[b, s]  = min_{s < u < (b+1)n} phi_u          exclusive, key side (A_s), BIG if empty
    block_min[b]      = min over the block                  gap blocks (G)
    diag_min[b, t, s] = min_{s < u <= t} phi_u              diagonal tiles, meaningful for s < t

An off-diagonal tile (query block i, key block j < i) has R_ts = min(A_s, G, C_t) with
G = min(block_min[j+1 .. i-1]). The backward also needs the soft-minimum masses, each taken
relative to its own hard minimum so that no exponent is positive:

    prefix_mass[b, t] = sum_{bn <= u <= t} exp(-(phi_u - C_t) / tau)          >= 1
    suffix_mass[b, s] = sum_{s < u < (b+1)n} exp(-(phi_u - A_s) / tau)        >= 1, 0 if empty
    block_mass[b]     = sum_{u in b} exp(-(phi_u - block_min[b]) / tau)        >= 1
    diag_log_mass[b, t, s] = log sum_{s < u <= t} exp(-(phi_u - block_min[b]) / tau)
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from mixer_core.soft_min import BIG, decay


class FieldBlocks(NamedTuple):
    phi: jnp.ndarray          # [nb, n]
    prefix_min: jnp.ndarray   # [nb, n]
    suffix_min: jnp.ndarray   # [nb, n]
    block_min: jnp.ndarray    # [nb]
    diag_min: jnp.ndarray     # [nb, n(t), n(s)]


class FieldMasses(NamedTuple):
    prefix_mass: jnp.ndarray    # [nb, n]
    suffix_mass: jnp.ndarray    # [nb, n]
    block_mass: jnp.ndarray     # [nb]
    diag_log_mass: jnp.ndarray  # [nb, n(t), n(s)]


def _later(n):
    """[n(s), n(u)] bool: u > s."""
    return jnp.arange(n)[None, :] > jnp.arange(n)[:, None]


def range_table(values, combine, empty):
    """table[..., t, s] = combine of values[..., u] over s < u <= t (`empty` where s >= t).

    values [..., n]. A scan over t with one running row per s: O(n^2) work and memory,
    and it compiles fast (XLA's CPU cumulative min/logsumexp compile very slowly).
    """
    n = values.shape[-1]
    positions = jnp.arange(n)

    def step(running, t):
        running = jnp.where(positions < t, combine(running, values[..., t, None]), running)
        return running, running

    init = jnp.full(values.shape, empty, values.dtype)
    _, rows = lax.scan(step, init, positions)  # [n(t), ..., n(s)]
    return jnp.moveaxis(rows, 0, -2)


def masked_min(values, mask):
    """min over the last axis of values [..., 1, n] where mask [m, n]; BIG if empty."""
    return jnp.where(mask, values, BIG).min(-1)


def field_blocks(phi, block_size):
    """phi [T] (T a multiple of block_size) -> FieldBlocks."""
    blocks = phi.reshape(-1, block_size)
    later = _later(block_size)
    return FieldBlocks(
        phi=blocks,
        prefix_min=masked_min(blocks[:, None, :], ~later),  # [t, u]: u <= t
        suffix_min=masked_min(blocks[:, None, :], later),
        block_min=blocks.min(axis=1),
        diag_min=range_table(blocks, jnp.minimum, BIG),
    )


def field_masses(fb: FieldBlocks, tau):
    """Soft-minimum masses of every block, each relative to its hard minimum."""
    n = fb.phi.shape[1]
    later = _later(n)  # [s, u]
    upto = ~later      # [t, u]: u <= t
    phi_u = fb.phi[:, None, :]
    prefix = jnp.where(upto, decay(phi_u - fb.prefix_min[:, :, None], tau), 0.0).sum(-1)
    suffix = jnp.where(later, decay(phi_u - fb.suffix_min[:, :, None], tau), 0.0).sum(-1)
    relative = fb.phi - fb.block_min[:, None]
    return FieldMasses(
        prefix_mass=prefix,
        suffix_mass=suffix,
        block_mass=decay(relative, tau).sum(-1),
        diag_log_mass=range_table(-relative / tau, jnp.logaddexp, -BIG),
    )


def off_diagonal_range_min(suffix_min_j, gap_min, prefix_min_i):
    """R [nb, n(t), n(s)] = min(A_s, G, C_t) for a batch of off-diagonal tiles."""
    key_side = jnp.minimum(suffix_min_j, gap_min[:, None])
    return jnp.minimum(key_side[:, None, :], prefix_min_i[:, :, None])
