"""Backward pass of the blocked FPA attention (straight-through soft-minimum gradient).

With dL/db_ts = dS_ts (the flash-attention logit gradient, recomputed per tile) and
coef_ts = beta * [R_ts < psi_s] * dS_ts:

    dL/dbeta  = sum_ts gap_ts * dS_ts - sum_t (sum_s dS_ts) * (sum_s P_ts * gap_ts),
                gap_ts = min(0, R_ts - psi_s)           (centred per row: see below)
    dL/dpsi_s = -sum_t coef_ts                    (row sums instead with query_level)
    dL/dphi_u = sum_{s < u <= t} coef_ts * exp(-(phi_u - R_ts)/tau) / Z_ts,
                Z_ts = sum_{s < u' <= t} exp(-(phi_u' - R_ts)/tau)      (soft-min weights)

An off-diagonal tile splits (s, t] into the key block's suffix, the gap blocks and the query
block's prefix. Each weight factors through the hard minimum of its piece, every exponent
<= 0, so drifting walks cannot overflow:

    exp(-(phi_u - R)/tau) = exp(-(phi_u - A_s)/tau) * exp(-(A_s - R)/tau)     u in the suffix
                          = exp(-(phi_u - C_t)/tau) * exp(-(C_t - R)/tau)     u in the prefix
                          = exp(-(phi_u - m_b)/tau) * exp(-(m_b - G)/tau) * exp(-(G - R)/tau)
                                                                              u in gap block b
The tile therefore reduces to a column vector (suffix), a row vector (prefix) and one scalar
(gap); short passes after the scan spread them over the positions. Diagonal tiles use the
exact 2-D soft minimum, one position u at a time (O(n^2) memory per block).

dbeta's centring term: dS_ts = P_ts (dP_ts - Delta_t) with Delta_t = <dout_t, out_t>, so
sum_s dS_ts = sum_s P_ts dP_ts - Delta_t is 0 in exact arithmetic (lse is no output) and the
term vanishes. In bf16 Delta_t carries the rounding of out (of the probabilities in the forward
P V); the term removes that per-row error e_t, which otherwise enters dbeta as
e_t * sum_s P_ts gap_ts for every row. Both row sums are carried in the scan. The
forward keeps its float32 out as the residual, so Delta_t is not taken from the rounded output.
"""

import jax
import jax.numpy as jnp

from fpa_jax.fpa import blocks
from mixer_core.padding import pad_time
from fpa_jax.fpa.tiles import (cut_blocks, diagonal_tile, off_diagonal_tile, shift_blocks,
                               stat_dtype, to_heads)
from mixer_core.soft_min import BIG, decay


def diagonal_field_grad(coef, fb, fm, tau):
    """dphi from diagonal tiles: coef [nb, t, s] -> [nb, n]."""
    n = coef.shape[-1]
    relative = fb.phi - fb.block_min[:, None]
    t_idx = jnp.arange(n)[:, None]
    s_idx = jnp.arange(n)[None, :]

    def at(u):
        inside = (s_idx < u) & (u <= t_idx)
        log_weight = -relative[:, u][:, None, None] / tau - fm.diag_log_mass
        weight = jnp.exp(jnp.where(inside, log_weight, -jnp.inf))
        return (coef * weight).sum((1, 2))

    return jax.lax.map(at, jnp.arange(n)).T


def suffix_field_grad(column_share, fb, tau):
    """Spread per-key shares over u > s inside the key block: [nb, n] -> [nb, n]."""
    n = fb.phi.shape[1]
    later = jnp.arange(n)[None, :] > jnp.arange(n)[:, None]  # [s, u]
    weight = jnp.where(later, decay(fb.phi[:, None, :] - fb.suffix_min[:, :, None], tau), 0.0)
    return jnp.einsum("ns,nsu->nu", column_share, weight)


def prefix_field_grad(row_share, fb, tau):
    """Spread per-query shares over u <= t inside the query block: [nb, n] -> [nb, n]."""
    n = fb.phi.shape[1]
    upto = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]  # [t, u]
    weight = jnp.where(upto, decay(fb.phi[:, None, :] - fb.prefix_min[:, :, None], tau), 0.0)
    return jnp.einsum("nt,ntu->nu", row_share, weight)


def gap_field_grad(gap_totals, gap_mins, fb, tau):
    """Spread per-tile gap scalars over the gap blocks.

    gap_totals, gap_mins: [nd, nb] for offsets d = 1..nb-1 and query blocks i. Block b lies
    in the gap of tile (i, i - d) iff i - d < b < i.
    """
    nd, nb = gap_totals.shape
    offsets = jnp.arange(1, nd + 1)[:, None]
    query = jnp.arange(nb)[None, :]

    def at(b):
        inside = (query - offsets < b) & (b < query)
        weight = decay(fb.block_min[b] - gap_mins, tau)
        return jnp.where(inside, gap_totals * weight, 0.0).sum()

    totals = jax.lax.map(at, jnp.arange(nb))
    return totals[:, None] * decay(fb.phi - fb.block_min[:, None], tau)


def backward_head(q, k, v, phi, psi, beta, segment, out, lse, dout, config):
    """One head's gradients: (dq, dk, dv, dphi, dpsi, dbeta)."""
    n, tau = config.block_size, config.tau
    x = cut_blocks(q, k, v, psi, segment, n)
    fb = blocks.field_blocks(phi, n)
    fm = blocks.field_masses(fb, tau)
    nb = fb.phi.shape[0]
    lse = lse.reshape(nb, n)
    dout = dout.reshape(nb, n, -1)
    acc = stat_dtype(phi)
    row_delta = (dout.astype(acc) * out.reshape(nb, n, -1).astype(acc)).sum(-1)

    def tile_grads(keys, logits, mask):
        probs = jnp.where(mask, jnp.exp(logits - lse[..., None]), 0.0)
        dv = jnp.einsum("nts,ntd->nsd", probs.astype(dout.dtype), dout,
                        preferred_element_type=acc)
        dprobs = jnp.einsum("ntd,nsd->nts", dout, keys.v, preferred_element_type=acc)
        dlogits = probs * (dprobs - row_delta[..., None])
        if config.content:
            scaled = (config.scale * dlogits).astype(q.dtype)
            dq = jnp.einsum("nts,nsd->ntd", scaled, keys.k, preferred_element_type=acc)
            dk = jnp.einsum("nts,ntd->nsd", scaled, x.q, preferred_element_type=acc)
        else:
            dq = jnp.zeros(x.q.shape, acc)
            dk = jnp.zeros(x.k.shape, acc)
        return dq, dk, dv, probs, dlogits

    def level_grad(coef):
        return -coef.sum(2) if config.query_level else -coef.sum(1)

    def beta_terms(probs, dlogits, gap, dead):
        """Per tile: sum gap dS, and the row sums sum_s dS_ts, sum_s P_ts gap_ts [nb, n]."""
        dead_gap = jnp.where(dead, gap, 0.0)
        return (dead_gap * dlogits).sum(), dlogits.sum(2), (probs * dead_gap).sum(2)

    logits, mask, gap, dead = diagonal_tile(x, fb, beta, config)
    dq, dk, dv, probs, dlogits = tile_grads(x, logits, mask)
    dbeta, row_dlogits, row_gap = beta_terms(probs, dlogits, gap, dead)
    coef = jnp.where(dead, beta * dlogits, 0.0)
    dpsi = level_grad(coef)
    dphi = diagonal_field_grad(coef, fb, fm, tau)

    def step(carry, d):
        (dq, dk, dv, dpsi, dbeta, row_dlogits, row_gap, row_share, column_share, gap_min,
         gap_mass) = carry
        keys, suffix_min, range_min, logits, mask, gap, dead = off_diagonal_tile(
            x, fb, gap_min, d, beta, config)
        dq_t, dk_t, dv_t, probs, dlogits = tile_grads(keys, logits, mask)
        dq = dq + dq_t
        dk = dk + shift_blocks(dk_t, -d)
        dv = dv + shift_blocks(dv_t, -d)
        dbeta_t, row_dlogits_t, row_gap_t = beta_terms(probs, dlogits, gap, dead)
        dbeta = dbeta + dbeta_t
        row_dlogits = row_dlogits + row_dlogits_t
        row_gap = row_gap + row_gap_t
        coef = jnp.where(dead, beta * dlogits, 0.0)
        if config.query_level:
            dpsi = dpsi + level_grad(coef)
        else:
            dpsi = dpsi + shift_blocks(level_grad(coef), -d)

        to_suffix = decay(suffix_min[:, None, :] - range_min, tau)
        to_gap = decay(gap_min[:, None, None] - range_min, tau)
        to_prefix = decay(fb.prefix_min[:, :, None] - range_min, tau)
        suffix_mass = shift_blocks(fm.suffix_mass, d)
        mass = (suffix_mass[:, None, :] * to_suffix + gap_mass[:, None, None] * to_gap
                + fm.prefix_mass[:, :, None] * to_prefix)
        share = coef / jnp.maximum(mass, 1.0)
        column_share = column_share + shift_blocks((share * to_suffix).sum(1), -d)
        row_share = row_share + (share * to_prefix).sum(2)
        gap_total = (share * to_gap).sum((1, 2))

        folded_min = shift_blocks(fb.block_min, d)
        new_gap_min = jnp.minimum(gap_min, folded_min)
        gap_mass = (gap_mass * decay(gap_min - new_gap_min, tau)
                    + shift_blocks(fm.block_mass, d) * decay(folded_min - new_gap_min, tau))
        carry = (dq, dk, dv, dpsi, dbeta, row_dlogits, row_gap, row_share, column_share,
                 new_gap_min, gap_mass)
        return carry, (gap_total, gap_min)

    zeros_blocks = jnp.zeros((nb, n), acc)
    init = (dq, dk, dv, dpsi, dbeta, row_dlogits, row_gap, zeros_blocks, zeros_blocks,
            jnp.full((nb,), BIG, acc), jnp.zeros((nb,), acc))
    carry, (gap_totals, gap_mins) = jax.lax.scan(step, init, jnp.arange(1, nb))
    dq, dk, dv, dpsi, dbeta, row_dlogits, row_gap, row_share, column_share, _, _ = carry
    dbeta = dbeta - (row_dlogits * row_gap).sum()

    dphi = dphi + suffix_field_grad(column_share, fb, tau) + prefix_field_grad(row_share, fb, tau)
    if nb > 1:
        dphi = dphi + gap_field_grad(gap_totals, gap_mins, fb, tau)
    flat = lambda t: t.reshape((nb * n,) + t.shape[2:])
    return flat(dq), flat(dk), flat(dv), flat(dphi), flat(dpsi), dbeta


def blocked_backward(q, k, v, phi, psi, beta, segment_ids, out, lse, dout, config):
    """Batched backward: cotangents for (q, k, v, phi, psi, beta)."""
    length = q.shape[1]
    qh, kh, vh, phih, psih, segment = to_heads(q, k, v, phi, psi, segment_ids, config.block_size)
    padded = qh.shape[2]
    heads = lambda t: jnp.moveaxis(pad_time(t, padded), 2, 1)
    head_fn = lambda *a: backward_head(*a, config)
    over_heads = jax.vmap(head_fn, in_axes=(0, 0, 0, 0, 0, 0, None, 0, 0, 0))
    batched = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, 0, None, 0, 0, 0, 0))
    grads = batched(qh, kh, vh, phih, psih, beta.astype(phih.dtype), segment,
                    heads(out), lse, heads(dout))
    dq, dk, dv, dphi, dpsi, dbeta = grads
    back = lambda g, like: jnp.moveaxis(g, 1, 2)[:, :length].astype(like.dtype)
    return (back(dq, q), back(dk, k), back(dv, v), back(dphi, phi), back(dpsi, psi),
            dbeta.sum(0).astype(beta.dtype))
