"""Field statistics before, and field-gradient spreading after, the FPA backward kernels (XLA).

Per head, phi [Tp] (Tp a multiple of the block n, a power of two >= 8) is cut into groups of
g = 2^L positions for every level L = 0 .. log2(n) (L = log2 n is the kernel's block):

    pre_min[L, t]  = min_{start(t) <= u <= t} phi_u          inclusive prefix minimum (C_t)
    pre_mass[L, t] = sum_{start(t) <= u <= t} exp(-(phi_u - pre_min)/tau)              >= 1
    suf_min[L, s]  = min_{s < u <= end(s)} phi_u             exclusive suffix minimum (A_s),
                                                             BIG if empty
    suf_mass[L, s] = sum_{s < u <= end(s)} exp(-(phi_u - suf_min)/tau)                 0 if empty

Off-diagonal tiles (query block i > key block j) take R_ts = min(A_s, G, C_t) at the block
level, G the minimum over the gap blocks j < b < i. A diagonal tile splits its pairs s < t
dyadically: the pair (t, s) belongs to level L < log2 n where t and s share a group of 2^(L+1)
but not of 2^L, and there R_ts = min(suf_min[L, s], pre_min[L, t]) exactly. Every piece's
soft-minimum weight is relative to its own hard minimum, so no exponent is positive.

The kernels return, per level, a key-side share (spread over the suffix of s) and a query-side
share (spread over the prefix of t), plus one scalar per off-diagonal tile for the gap:

    dphi_u += sum_s col_share[L, s] exp(-(phi_u - suf_min[L, s])/tau)     s < u <= end(s)
    dphi_u += sum_t row_share[L, t] exp(-(phi_u - pre_min[L, t])/tau)     start(t) <= u <= t
    dphi_u += exp(-(phi_u - m_b)/tau) sum_{(i, j): j < b < i} gap_total[i, j] exp(-(m_b - G_ij)/tau)

with b the block of u and m_b its minimum. Shapes: phi [..., Tp]; level arrays [..., Lv, Tp]
with Lv = log2(n) + 1 (the last level is the block); gap_total [..., nb(i), nb(j)].
"""

import jax
import jax.numpy as jnp

from kernels_pallas.attention.common import BIG
from kernels_pallas.attention.common import decay as _decay


def num_levels(block):
    return block.bit_length()  # levels 0 .. log2(block)


def group_stats(phi, group, tau):
    """(pre_min, pre_mass, suf_min, suf_mass) of groups of `group` positions, each [..., Tp]."""
    shape = phi.shape
    x = phi.reshape(shape[:-1] + (shape[-1] // group, group))
    u = jnp.arange(group)
    upto = u[None, :] <= u[:, None]   # [t, u]
    later = u[None, :] > u[:, None]   # [s, u]
    xu = x[..., None, :]
    pre_min = jnp.where(upto, xu, BIG).min(-1)
    pre_mass = jnp.where(upto, _decay(xu - pre_min[..., None], tau), 0.0).sum(-1)
    suf_min = jnp.where(later, xu, BIG).min(-1)
    suf_mass = jnp.where(later, _decay(xu - suf_min[..., None], tau), 0.0).sum(-1)
    flat = lambda a: a.reshape(shape)
    return flat(pre_min), flat(pre_mass), flat(suf_min), flat(suf_mass)


def level_stats(phi, block, tau):
    """Stacked group_stats for every level: four arrays [..., Lv, Tp]."""
    per_level = [group_stats(phi, 1 << level, tau) for level in range(num_levels(block))]
    return tuple(jnp.stack(parts, axis=-2) for parts in zip(*per_level))


def block_min_mass(phi, block, tau):
    """Minimum and soft-min mass (relative to it) of every block: [..., nb] each."""
    x = phi.reshape(phi.shape[:-1] + (phi.shape[-1] // block, block))
    low = x.min(-1)
    return low, jnp.exp(-(x - low[..., None]) / tau).sum(-1)


def gap_minima(block_min):
    """G[..., i, j] = min_{j < b < i} block_min[b] (BIG where the gap is empty); O(nb^2)."""
    nb = block_min.shape[-1]
    b = jnp.arange(nb)
    after = jnp.where(b[None, :] > b[:, None], block_min[..., None, :], BIG)  # [j, b]: b > j
    upto = jax.lax.cummin(after, axis=after.ndim - 1)  # [j, c] = min_{j < b <= c} m_b
    shifted = jnp.concatenate([jnp.full_like(upto[..., :1], BIG), upto[..., :-1]], axis=-1)
    return jnp.swapaxes(shifted, -1, -2)  # [i, j] = upto[j, i - 1]


def spread_suffix(share, suf_min, phi, group, tau):
    """sum_s share_s exp(-(phi_u - suf_min_s)/tau) over s < u in the group of u: [..., Tp]."""
    shape = phi.shape
    cut = lambda a: a.reshape(shape[:-1] + (shape[-1] // group, group))
    u = jnp.arange(group)
    later = u[None, :] > u[:, None]  # [s, u]
    weight = jnp.where(later, _decay(cut(phi)[..., None, :] - cut(suf_min)[..., :, None], tau), 0.0)
    return jnp.einsum("...s,...su->...u", cut(share), weight).reshape(shape)


def spread_prefix(share, pre_min, phi, group, tau):
    """sum_t share_t exp(-(phi_u - pre_min_t)/tau) over t >= u in the group of u: [..., Tp]."""
    shape = phi.shape
    cut = lambda a: a.reshape(shape[:-1] + (shape[-1] // group, group))
    u = jnp.arange(group)
    upto = u[None, :] <= u[:, None]  # [t, u]
    weight = jnp.where(upto, _decay(cut(phi)[..., None, :] - cut(pre_min)[..., :, None], tau), 0.0)
    return jnp.einsum("...t,...tu->...u", cut(share), weight).reshape(shape)


def spread_gap(gap_total, block_min, phi, block, tau):
    """Gap part of dphi from per-tile totals gap_total [..., nb(i), nb(j)]: [..., Tp].

    Block b collects Q_b = sum_{j < b < i} gap_total[i, j] exp(-(m_b - G_ij)/tau). For each
    query block i, G_ij grows with j, so
    F_b = sum_{j < b} gap_total[i, j] exp(-(G_i,b-1 - G_ij)/tau)
    obeys F_b+1 = F_b exp(-(G_ib - G_i,b-1)/tau) + gap_total[i, b] (every exponent <= 0; an
    associative scan over b) and Q_b = sum_{i > b} F_b exp(-(m_b - G_i,b-1)/tau). O(nb^2).
    """
    nb = block_min.shape[-1]
    gaps = gap_minima(block_min)  # [..., i, j]
    before = jnp.concatenate([jnp.full_like(gaps[..., :1], BIG), gaps[..., :-1]], axis=-1)
    step = _decay(gaps - before, tau)  # [i, b]: F_b -> F_b+1 factor

    def combine(first, second):
        return first[0] * second[0], first[1] * second[0] + second[1]

    _, running = jax.lax.associative_scan(combine, (step, gap_total), axis=gap_total.ndim - 1)
    totals_before = jnp.concatenate([jnp.zeros_like(running[..., :1]), running[..., :-1]], axis=-1)
    idx = jnp.arange(nb)
    inside = idx[:, None] > idx[None, :]  # [i, b]: b < i
    weight = _decay(block_min[..., None, :] - before, tau)
    totals = jnp.where(inside, totals_before * weight, 0.0).sum(-2)  # [..., b]
    x = phi.reshape(phi.shape[:-1] + (nb, block))
    return (totals[..., None] * _decay(x - block_min[..., None], tau)).reshape(phi.shape)


def field_gradient(col_share, row_share, gap_total, phi, block, tau, pre_min=None,
                   suf_min=None):
    """dphi [..., Tp] from the kernels' shares: col/row_share [..., Lv, Tp]. pre_min, suf_min
    [..., Lv, Tp]: level_stats' minima when the caller has them (else recomputed)."""
    if pre_min is None or suf_min is None:
        pre_min, _, suf_min, _ = level_stats(phi, block, tau)
    dphi = jnp.zeros_like(phi)
    for level in range(num_levels(block)):
        group = 1 << level
        dphi = dphi + spread_suffix(col_share[..., level, :], suf_min[..., level, :], phi,
                                    group, tau)
        dphi = dphi + spread_prefix(row_share[..., level, :], pre_min[..., level, :], phi,
                                    group, tau)
    block_min, _ = block_min_mass(phi, block, tau)
    return dphi + spread_gap(gap_total, block_min, phi, block, tau)
