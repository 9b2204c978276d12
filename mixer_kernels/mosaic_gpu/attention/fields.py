"""FPA's field statistics (XLA): the level minima the forward and backward kernels read, the
masses the backward reads, and the field-gradient spreading after the backward kernels.

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

FIELD_PASSES (read when traced) picks how the statistics and spreads are formed:
  "by_level"    (the default) in XLA, level by level: the statistics by joining the halves of
                the level below (O(1) work per level, position and statistic), each level's
                spread over its own groups (2^L exponentials per position at level L: 127 per
                side at n = 64), but a few hundred XLA ops per call (about 2000 StableHLO ops
                per layer with the kernels' other glue, benchmarks/hlo_op_count.py)
  "kernels"     in two Mosaic GPU kernels (fields_kernels.py), every level of a block at once
                in registers, one custom call each (654 StableHLO ops per layer); the
                off-diagonal gap's O(nb^2) spread stays in XLA. On an H200 it compiles the
                fpa_125m step 5.6 s faster (33.2 against 38.8 s of XLA compile; lowering takes
                2.2 s longer) but costs 0.087 ms more per layer call at (8, 2048, 12, 64): the
                masked [n, n] tiles take Lv exponentials per position and side where level by
                level takes two (docs/benchmarks.md, "Field passes in kernels"), so it is not
                the default
  "all_levels"  in XLA, every level at once: per block, a [Lv, n, n] mask of the (level,
                position, position) triples that share a group meets the block's positions,
                and one fused masked reduction forms each statistic and each side's spread: 850
                StableHLO ops per layer, but Lv n exponentials per position and side (448 at
                n = 64) for the spreads and for the masses, and [..., nb, Lv, n, n]
                intermediates if XLA does not fuse them. On an H200 it compiles fpa_125m 8.7 s
                faster than "by_level" but costs 0.37 ms more per layer call and 9% of the
                train step's throughput (docs/benchmarks.md, "Every level at once")
  "spread_kernel"  the statistics as "by_level", the level spreads in fields_kernels.py's
                spread kernel, which reads the minima from a pack of the XLA levels: about 440
                of the backward's StableHLO ops per layer go (benchmarks/hlo_op_count.py),
                while the statistics keep their two exponentials per level and position; not
                yet timed on a GPU
The XLA forms are also the reference the kernels are tested against.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mixer_kernels.mosaic_gpu.attention import fields_kernels
from mixer_kernels.mosaic_gpu.attention.common import BIG
from mixer_kernels.mosaic_gpu.attention.common import decay

FIELD_PASSES = "by_level"
PASSES = ("kernels", "by_level", "all_levels", "spread_kernel")


def num_levels(block):
    return block.bit_length()  # levels 0 .. log2(block)


def level_stats(phi, block, tau):
    """(pre_min, pre_mass, suf_min, suf_mass), each [..., Lv, Tp] (FIELD_PASSES)."""
    if _all_levels():
        return _level_stats_at_once(phi, block, tau)
    return _level_stats_by_level(phi, block, tau)


def _passes():
    """FIELD_PASSES, checked (a clear error for other values)."""
    if FIELD_PASSES not in PASSES:
        raise ValueError(f"FIELD_PASSES: expected one of {PASSES}, got {FIELD_PASSES!r}")
    return FIELD_PASSES


def _all_levels():
    """Whether the XLA passes form every level at once (under "kernels", level_stats and
    spread_levels, which the kernels' tests use as their reference, run level by level)."""
    return _passes() == "all_levels"


def _kind_index(kind):
    return fields_kernels.KINDS.index(kind)


class Statistics(NamedTuple):
    """The level statistics of phi [B, H, Tp] (`statistics`): the kernels' stats pack
    [B, H, nb, rows, n] (fields_kernels.py) or the XLA forms' four [B, H, Lv, Tp] arrays."""
    block: int
    pack: Optional[jax.Array] = None
    levels: Optional[tuple] = None

    def get(self, kind, level):
        """Statistic kind ("pre_min", "pre_mass", "suf_min", "suf_mass") at level: [B, H, Tp]."""
        if self.pack is not None:
            return fields_kernels.stats_from_pack(self.pack, kind, level, self.block)
        return self.levels[_kind_index(kind)][:, :, level]

    def diagonal_pack(self, side):
        """The diagonal levels' minima then masses of side "pre" (queries) or "suf" (keys),
        [B, H, nb, 2 top, n], as the backward sweeps read them."""
        top = self.block.bit_length() - 1
        if self.pack is None:
            both = [self.levels[_kind_index(f"{side}_{what}")][:, :, :top]
                    for what in ("min", "mass")]
            return _levels_by_block(jnp.concatenate(both, axis=2), self.block)[..., 0]
        if not fields_kernels.has_masses(self.pack, self.block):
            raise ValueError("diagonal_pack: the statistics were formed without masses")
        first = fields_kernels.stat_row(f"{side}_min", 0, self.block, True)
        return self.pack[:, :, :, first:first + 2 * top]


def statistics(phi, block, tau, masses=True):
    """Statistics of phi [B, H, Tp] by FIELD_PASSES (without masses, only the minima are
    asked for: the kernel skips the masses, XLA drops them)."""
    if _passes() == "kernels":
        return Statistics(block, pack=fields_kernels.level_stats_pack(phi, block, tau, masses))
    return Statistics(block, levels=level_stats(phi, block, tau))


def _level_stats_by_level(phi, block, tau):
    """level_stats built level by level: a
    group of 2^(L+1) is two groups of 2^L, so a prefix in its second half takes in the first
    half's total (the prefix at its last position) and a suffix in its first half the second
    half's total, each mass rescaled to the new minimum (every exponent <= 0). O(Tp) per
    level, elementwise (no g x g tiles)."""
    shape = phi.shape
    pre_min, pre_mass = phi, jnp.ones_like(phi)
    suf_min, suf_mass = jnp.full_like(phi, BIG), jnp.zeros_like(phi)
    stats = [(pre_min, pre_mass, suf_min, suf_mass)]
    for level in range(1, num_levels(block)):
        half = 1 << (level - 1)
        halves = lambda a: a.reshape(shape[:-1] + (shape[-1] // (2 * half), 2, half))
        pm, pw, sm, sw = (halves(a) for a in (pre_min, pre_mass, suf_min, suf_mass))
        total_min, total_mass = pm[..., -1:], pw[..., -1:]   # [..., groups, 2, 1] per half
        joined = jnp.minimum(pm[..., 1, :], total_min[..., 0, :])
        second_pre = (pw[..., 1, :] * decay(pm[..., 1, :] - joined, tau)
                      + total_mass[..., 0, :] * decay(total_min[..., 0, :] - joined, tau))
        pre_min = jnp.stack([pm[..., 0, :], joined], axis=-2).reshape(shape)
        pre_mass = jnp.stack([pw[..., 0, :], second_pre], axis=-2).reshape(shape)
        joined = jnp.minimum(sm[..., 0, :], total_min[..., 1, :])
        first_suf = (sw[..., 0, :] * decay(sm[..., 0, :] - joined, tau)
                     + total_mass[..., 1, :] * decay(total_min[..., 1, :] - joined, tau))
        suf_min = jnp.stack([joined, sm[..., 1, :]], axis=-2).reshape(shape)
        suf_mass = jnp.stack([first_suf, sw[..., 1, :]], axis=-2).reshape(shape)
        stats.append((pre_min, pre_mass, suf_min, suf_mass))
    return tuple(jnp.stack(parts, axis=-2) for parts in zip(*stats))


def group_masks(block):
    """(prefix, suffix): [Lv, n, n] boolean constants over a block's positions. prefix[L, t, u]:
    start(t) <= u <= t in t's group of 2^L; suffix[L, s, u]: s < u <= end(s) in s's group."""
    index = np.arange(block)
    shifts = np.arange(num_levels(block))[:, None, None]
    same = (index[None, :, None] >> shifts) == (index[None, None, :] >> shifts)
    return (same & (index[None, None, :] <= index[None, :, None]),
            same & (index[None, None, :] > index[None, :, None]))


def _by_block(x, block):
    """[..., Tp] -> [..., nb, 1, 1, n]: a block's positions u on the last axis, ready to meet
    a [Lv, n, n] mask."""
    return x.reshape(x.shape[:-1] + (x.shape[-1] // block, 1, 1, block))


def _levels_first(x):
    """[..., nb, Lv, n] -> [..., Lv, Tp]."""
    return jnp.moveaxis(x, -2, -3).reshape(x.shape[:-3] + (x.shape[-2], -1))


def _levels_by_block(x, block):
    """[..., Lv, Tp] -> [..., nb, Lv, n, 1]: per block, one row per level and position."""
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))
    return jnp.moveaxis(blocks, -2, -3)[..., None]


def _level_stats_at_once(phi, block, tau):
    """level_stats with every level at once, as a
    masked minimum and a masked sum over a block's n positions per (level, position) (one
    fused reduction per statistic, every exponent <= 0: each mass is relative to its own
    minimum)."""
    prefix, suffix = group_masks(block)
    x = _by_block(phi, block)                                    # [..., nb, 1, 1, n(u)]
    pre_min = jnp.min(jnp.where(prefix, x, BIG), axis=-1)        # [..., nb, Lv, n]
    pre_mass = jnp.sum(jnp.where(prefix, decay(x - pre_min[..., None], tau), 0.0), axis=-1)
    suf_min = jnp.min(jnp.where(suffix, x, BIG), axis=-1)
    suf_mass = jnp.sum(jnp.where(suffix, decay(x - suf_min[..., None], tau), 0.0), axis=-1)
    return tuple(_levels_first(a) for a in (pre_min, pre_mass, suf_min, suf_mass))


def at_block_ends(x, block):
    """[..., Tp] -> [..., nb]: each block's value at its last position (the block's total when
    x is a block-level prefix statistic: its minimum, its mass)."""
    return x[..., block - 1::block]


def gap_minima(block_min):
    """G[..., i, j] = min_{j < b < i} block_min[b] (BIG where the gap is empty); O(nb^2)."""
    nb = block_min.shape[-1]
    b = jnp.arange(nb)
    after = jnp.where(b[None, :] > b[:, None], block_min[..., None, :], BIG)  # [j, b]: b > j
    upto = jax.lax.cummin(after, axis=after.ndim - 1)  # [j, c] = min_{j < b <= c} m_b
    shifted = jnp.concatenate([jnp.full_like(upto[..., :1], BIG), upto[..., :-1]], axis=-1)
    return jnp.swapaxes(shifted, -1, -2)  # [i, j] = upto[j, i - 1]


def _side(side):
    if side not in ("suffix", "prefix"):
        raise ValueError(f"side: expected 'suffix' or 'prefix', got {side!r}")
    return side == "suffix"


def _spread_level(share, minima, phi, group, tau, side):
    """One level's spread, [..., Tp]: side "suffix": sum_s share_s exp(-(phi_u - minima_s)/tau)
    over s < u in the group of u; "prefix": the same over t >= u."""
    shape = phi.shape
    cut = lambda a: a.reshape(shape[:-1] + (shape[-1] // group, group))
    u = jnp.arange(group)
    pieces = u[None, :] > u[:, None] if _side(side) else u[None, :] <= u[:, None]  # [s or t, u]
    weight = jnp.where(pieces, decay(cut(phi)[..., None, :] - cut(minima)[..., :, None], tau),
                       0.0)
    return (cut(share)[..., :, None] * weight).sum(-2).reshape(shape)  # a fused reduction


def spread_levels(share, minima, phi, block, tau, side):
    """Every level's shares spread over their pieces, summed: [..., Tp] from share and minima
    [..., Lv, Tp]. side "suffix": sum_{L, s < u in the group of u} share[L, s]
    exp(-(phi_u - minima[L, s])/tau); side "prefix": the same over t >= u. FIELD_PASSES:
    level by level, or one fused reduction over (level, position) per block."""
    suffix_side = _side(side)
    if not _all_levels():
        return sum(_spread_level(share[..., level, :], minima[..., level, :], phi, 1 << level,
                                 tau, side) for level in range(num_levels(block)))
    prefix, suffix = group_masks(block)
    mask = suffix if suffix_side else prefix                            # [L, s or t, u]
    x = _by_block(phi, block)                                           # [..., nb, 1, 1, n(u)]
    weight = jnp.where(mask, decay(x - _levels_by_block(minima, block), tau), 0.0)
    total = jnp.sum(_levels_by_block(share, block) * weight, axis=(-3, -2))  # [..., nb, n]
    return total.reshape(phi.shape)


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
    step = decay(gaps - before, tau)  # [i, b]: F_b -> F_b+1 factor

    def combine(first, second):
        return first[0] * second[0], first[1] * second[0] + second[1]

    _, running = jax.lax.associative_scan(combine, (step, gap_total), axis=gap_total.ndim - 1)
    totals_before = jnp.concatenate([jnp.zeros_like(running[..., :1]), running[..., :-1]], axis=-1)
    idx = jnp.arange(nb)
    inside = idx[:, None] > idx[None, :]  # [i, b]: b < i
    weight = decay(block_min[..., None, :] - before, tau)
    totals = jnp.where(inside, totals_before * weight, 0.0).sum(-2)  # [..., b]
    x = phi.reshape(phi.shape[:-1] + (nb, block))
    return (totals[..., None] * decay(x - block_min[..., None], tau)).reshape(phi.shape)


def minima_pack(levels, block):
    """The stats pack without masses ([B, H, nb, rows, n], fields_kernels.stat_row's order)
    from the XLA forms' (pre_min, pre_mass, suf_min, suf_mass) [B, H, Lv, Tp]."""
    pre_min, _, suf_min, _ = levels
    top = num_levels(block) - 1
    rows = jnp.concatenate([pre_min[:, :, :top], suf_min[:, :, :top], pre_min[:, :, top:],
                            suf_min[:, :, top:]], axis=2)
    return _levels_by_block(rows, block)[..., 0]


def field_gradient(shares, gap_total, phi, block, tau, stats):
    """dphi [B, H, Tp] from the kernels' shares: shares [B, H, nb, 2 Lv, n] (the key side's
    levels 0 .. top, then the query side's), gap_total [B, H, nb(i), nb(j)], stats the
    `statistics` of phi (FIELD_PASSES)."""
    levels = num_levels(block)
    if stats.pack is not None:
        dphi = fields_kernels.spread_pack(shares, stats.pack, phi, block, tau)
    elif _passes() == "spread_kernel":
        dphi = fields_kernels.spread_pack(shares, minima_pack(stats.levels, block), phi, block,
                                          tau)
    else:
        pre_min, _, suf_min, _ = stats.levels
        dphi = (spread_levels(_levels_first(shares[:, :, :, :levels]), suf_min, phi, block, tau,
                              "suffix")
                + spread_levels(_levels_first(shares[:, :, :, levels:]), pre_min, phi, block,
                                tau, "prefix"))
    block_min = at_block_ends(stats.get("pre_min", levels - 1), block)
    return dphi + spread_gap(gap_total, block_min, phi, block, tau)
