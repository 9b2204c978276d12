"""Mosaic GPU kernels for FPA's field statistics and level spreads (fields.py's math, one
program per (head, block, batch), every level of the block at once in registers).

A block's n positions meet each other in one [n, n] tile x[r, u] = phi_u (r: the position
whose statistic or share it is, u: the position summed over). Position r's group of 2^L
holds u iff r XOR u < 2^L, so for every level L = 0 .. log2(n):

    stats:   pre_min[L, t]  = min  {phi_u : same group, u <= t}
             pre_mass[L, t] = sum  {exp(-(phi_u - pre_min[L, t])/tau) : same group, u <= t}
             suf_min[L, s]  = min  {phi_u : same group, u > s}       (BIG if empty)
             suf_mass[L, s] = sum  {exp(-(phi_u - suf_min[L, s])/tau) : same group, u > s}
    spread:  dphi_u = sum_L sum_{s < u, same group} col_share[L, s] exp(-(phi_u - suf_min[L, s])/tau)
                    + sum_L sum_{t >= u, same group} row_share[L, t] exp(-(phi_u - pre_min[L, t])/tau)

Every exponent is <= 0 (a piece's mass is relative to its own minimum). The prefix and suffix
pairs of a row do not overlap, so one exponential per pair and level serves both sides. Each
kernel is one custom call however many levels the block has, where the XLA forms of fields.py
are a few hundred ops per call that a model's compile pays for per layer; the price is Lv
exponentials per position and side (fields.py FIELD_PASSES has the measured trade).

Packs ([B, H, nb, rows, n] float32, one TMA per block):
    phi      [B, H, nb, 1, n]
    stats    rows of `stat_row`: the diagonal levels 0 .. top-1 (top = log2 n) grouped as the
             sweeps read them (pre minima, pre masses, suf minima, suf masses), then the
             block level's four; without masses only the minima
    shares   [B, H, nb, 2 Lv, n]: col_share levels 0 .. top, then row_share levels 0 .. top
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.attention.common import BIG, decay, per_block

KINDS = ("pre_min", "pre_mass", "suf_min", "suf_mass")   # level_stats' order (fields.py)


def stat_kinds(masses):
    return KINDS if masses else ("pre_min", "suf_min")


def stat_rows(block, masses):
    """Rows of the stats pack."""
    return len(stat_kinds(masses)) * block.bit_length()


def has_masses(pack, block):
    """Whether a stats pack [B, H, nb, rows, n] holds the masses (its row count says)."""
    return pack.shape[3] == stat_rows(block, True)


def stat_row(kind, level, block, masses):
    """Row of statistic `kind` at `level` in the stats pack: the diagonal levels' rows kind by
    kind (so the row side's minima and masses, and the column side's, are contiguous), then
    the block level's rows in the same kind order."""
    kinds = stat_kinds(masses)
    top = block.bit_length() - 1
    if level == top:
        return len(kinds) * top + kinds.index(kind)
    return kinds.index(kind) * top + level


def _layout(axis):
    """Register layout of a vector along tile axis `axis` of a WGMMA-layout [n, n] tile."""
    return plgpu.Layout.WGMMA.reduce(1 - axis)


def _vector(ref, row, axis, shape):
    """Row `row` of an SMEM pack broadcast along the other axis of an [n, n] tile."""
    return lax.broadcast_in_dim(plgpu.load(ref.at[row], layout=_layout(axis)), shape, [axis])


def _pair_iota(n):
    """(after, upto, differ) [n, n]: u > r, u <= r, and r XOR u (u is in r's group of 2^L iff
    differ < 2^L); r along axis 0, u along axis 1."""
    iota = lambda axis: plgpu.broadcasted_iota(jnp.int32, (n, n), axis,
                                               layout=plgpu.Layout.WGMMA)
    r, u = iota(0), iota(1)
    return u > r, u <= r, r ^ u


def _side_masks(pairs, level, top):
    """(prefix, suffix) [n, n] masks of `level`: u in r's group with u <= r, or u > r (at the
    block level every u is in the group)."""
    after, upto, differ = pairs
    if level == top:
        return upto, after
    same = differ < (1 << level)
    return same & upto, same & after


def _by_side(after, suffix_value, prefix_value):
    """[n, n]: the suffix side's vector (over r) where u > r, the prefix side's elsewhere; one
    exponential per pair then serves both sides, whose pairs do not overlap."""
    return jnp.where(after, suffix_value, prefix_value)


def _constant(value, n, axis):
    return plgpu.layout_cast(jnp.full((n,), value, jnp.float32), _layout(axis))


def _call(body, name, out_shape, scratch, grid_shape, *args):
    return per_block(body, name, jax.ShapeDtypeStruct(out_shape, jnp.float32), scratch,
                     grid_shape, "blk")(*args)


def level_stats_pack(phi, block, tau, masses=True):
    """phi [B, H, Tp] float32 (Tp a multiple of block) -> stats pack [B, H, nb, rows, n]."""
    batch, heads, tp = phi.shape
    n = block
    nb = tp // n
    levels = n.bit_length()
    rows = stat_rows(n, masses)

    def body(phi_ref, out_ref, phi_s, out_s, bar):
        h, i, b = lax.axis_index("h"), lax.axis_index("blk"), lax.axis_index("b")
        plgpu.copy_gmem_to_smem(phi_ref.at[b, h, i], phi_s, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        def store(kind, level, value):
            out_s.at[stat_row(kind, level, n, masses)][...] = value

        # level 0: each group is one position (prefix: itself, suffix: empty)
        store("pre_min", 0, plgpu.load(phi_s.at[0], layout=_layout(0)))
        store("suf_min", 0, _constant(BIG, n, 0))
        if masses:
            store("pre_mass", 0, _constant(1.0, n, 0))
            store("suf_mass", 0, _constant(0.0, n, 0))
        x = _vector(phi_s, 0, 1, (n, n))                       # x[r, u] = phi_u
        pairs = _pair_iota(n)
        after = pairs[0]
        over_u = lambda vector: lax.broadcast_in_dim(vector, (n, n), [0])
        for level in range(1, levels):
            prefix, suffix = _side_masks(pairs, level, levels - 1)
            lows = [jnp.min(jnp.where(mask, x, BIG), axis=1) for mask in (prefix, suffix)]
            store("pre_min", level, lows[0])                   # vectors over r
            store("suf_min", level, lows[1])
            if masses:
                weight = decay(x - _by_side(after, over_u(lows[1]), over_u(lows[0])), tau)
                store("pre_mass", level, jnp.sum(jnp.where(prefix, weight, 0.0), axis=1))
                store("suf_mass", level, jnp.sum(jnp.where(suffix, weight, 0.0), axis=1))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_s, out_ref.at[b, h, i])
        plgpu.wait_smem_to_gmem(0)

    scratch = [plgpu.SMEM((1, n), jnp.float32), plgpu.SMEM((rows, n), jnp.float32),
               plgpu.Barrier(num_barriers=1)]
    return _call(body, "fpa_field_stats", (batch, heads, nb, rows, n), scratch,
                 (batch, heads, nb), phi.reshape(batch, heads, nb, 1, n))


def stats_from_pack(pack, kind, level, block):
    """One statistic of one level from the stats pack: [B, H, Tp]."""
    batch, heads, nb = pack.shape[:3]
    row = stat_row(kind, level, block, has_masses(pack, block))
    return pack[:, :, :, row].reshape(batch, heads, nb * block)


def spread_pack(shares, stats, phi, block, tau):
    """dphi [B, H, Tp] of the level spreads: shares [B, H, nb, 2 Lv, n] (module docstring),
    stats the level_stats_pack of phi (with or without masses), phi [B, H, Tp]."""
    batch, heads, tp = phi.shape
    n = block
    nb = tp // n
    levels = n.bit_length()
    masses = has_masses(stats, n)
    rows = stat_rows(n, masses)

    def body(shares_ref, stats_ref, phi_ref, out_ref, shares_s, stats_s, phi_s, out_s, bars):
        h, i, b = lax.axis_index("h"), lax.axis_index("blk"), lax.axis_index("b")
        copies = ((shares_ref, shares_s), (stats_ref, stats_s), (phi_ref, phi_s))
        for index, (ref, smem) in enumerate(copies):
            plgpu.copy_gmem_to_smem(ref.at[b, h, i], smem, bars.at[index])
        for index in range(len(copies)):
            plgpu.barrier_wait(bars.at[index])
        x = _vector(phi_s, 0, 1, (n, n))                       # x[r, u] = phi_u
        after, _, differ = _pair_iota(n)
        total = plgpu.layout_cast(jnp.zeros((n, n), jnp.float32), plgpu.Layout.WGMMA)
        for level in range(1, levels):
            low = _by_side(after, _vector(stats_s, stat_row("suf_min", level, n, masses), 0, (n, n)),
                           _vector(stats_s, stat_row("pre_min", level, n, masses), 0, (n, n)))
            share = _by_side(after, _vector(shares_s, level, 0, (n, n)),
                             _vector(shares_s, levels + level, 0, (n, n)))
            term = share * decay(x - low, tau)
            total = total + (term if level == levels - 1 else
                             jnp.where(differ < (1 << level), term, 0.0))
        # level 0: only u = t itself, at weight 1 (prefix); + the levels above, summed over r
        out_s.at[0][...] = (plgpu.load(shares_s.at[levels], layout=_layout(1))
                            + jnp.sum(total, axis=0))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_s, out_ref.at[b, h, i])
        plgpu.wait_smem_to_gmem(0)

    scratch = [plgpu.SMEM((2 * levels, n), jnp.float32), plgpu.SMEM((rows, n), jnp.float32),
               plgpu.SMEM((1, n), jnp.float32), plgpu.SMEM((1, n), jnp.float32),
               plgpu.Barrier(num_barriers=3)]
    out = _call(body, "fpa_field_spread", (batch, heads, nb, 1, n), scratch, (batch, heads, nb),
                shares, stats, phi.reshape(batch, heads, nb, 1, n))
    return out.reshape(batch, heads, tp)
