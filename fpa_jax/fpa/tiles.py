"""Tiles of the blocked FPA attention, shared by the XLA forward (xla.py) and backward
(xla_vjp.py).

Per head, with blocks of n positions (query block i, key block j = i - d):

    d = 0 (diagonal):  b_ts = beta * min(0, diag_min[i, t, s] - psi_s),  s < t;  b_tt = 0
    d >= 1:            b_ts = beta * min(0, min(A_s, G_i(d), C_t) - psi_s)
    logits_ts = scale * <q_t, k_s> + b_ts     (-inf where s > t or another document)

(psi_t replaces psi_s with query_level; the q.k term is dropped with content=False.) Every
tile function works on all query blocks at once: inputs [nb, n, ...] -> tiles [nb, n, n].

Layout: `to_heads` turns [B, T, H, ...] into [B, H, Tp, ...] with T padded to whole blocks
(mixer_core.padding: padded positions are their own document).
"""

from typing import NamedTuple

import jax.numpy as jnp

from fpa_jax.fpa import blocks
from mixer_core.padding import pad_segment_ids, pad_time, padded_length


class BlockedConfig(NamedTuple):
    scale: float
    tau: float
    block_size: int
    query_level: bool
    content: bool


class HeadInputs(NamedTuple):
    """One head's inputs, cut into blocks: [nb, n, D] and [nb, n]."""
    q: jnp.ndarray
    k: jnp.ndarray
    v: jnp.ndarray
    psi: jnp.ndarray
    segment: jnp.ndarray


def stat_dtype(x):
    """float32 for half/single inputs, float64 under x64 (lets float64 checks be exact)."""
    return jnp.promote_types(x.dtype, jnp.float32)


def choose_block_size(length, block_size):
    """The block size actually used: no larger than T rounded up to a multiple of 8."""
    return int(min(block_size, max(8, padded_length(length, 8))))


def to_heads(q, k, v, phi, psi, segment_ids, block_size):
    """[B, T, H, ...] -> padded [B, H, Tp, ...]; segment ids int32 [B, Tp] (zeros if None)."""
    padded = padded_length(q.shape[1], block_size)
    heads = lambda t: jnp.moveaxis(pad_time(t, padded), 2, 1)
    if segment_ids is None:
        segment_ids = jnp.zeros(q.shape[:2], jnp.int32)
    segment = pad_segment_ids(segment_ids, padded)
    dtype = stat_dtype(phi)
    return heads(q), heads(k), heads(v), heads(phi.astype(dtype)), heads(psi.astype(dtype)), segment


def cut_blocks(q, k, v, psi, segment, n):
    nb = q.shape[0] // n
    return HeadInputs(q.reshape(nb, n, -1), k.reshape(nb, n, -1), v.reshape(nb, n, -1),
                      psi.reshape(nb, n), segment.reshape(nb, n))


def shift_blocks(x, d):
    """x[i - d] at row i (rows i < d hold wrapped values: callers mask them)."""
    return jnp.roll(x, d, axis=0)


def tile_bias(range_min, psi_query, psi_key, beta, config, strictly_past=None):
    """b_ts = beta * min(0, R_ts - level) and the gap R - level; [nb, n, n]."""
    level = psi_query[:, :, None] if config.query_level else psi_key[:, None, :]
    gap = range_min - level
    dead = gap < 0
    if strictly_past is not None:
        dead = dead & strictly_past
    return beta * jnp.where(dead, gap, 0.0), gap, dead


def tile_logits(x: HeadInputs, keys: HeadInputs, bias, config):
    if not config.content:
        return bias
    scores = jnp.einsum("ntd,nsd->nts", x.q, keys.k, preferred_element_type=stat_dtype(x.psi))
    return config.scale * scores + bias


def diagonal_tile(x: HeadInputs, fb: blocks.FieldBlocks, beta, config):
    """Logits, mask and bias pieces of the diagonal tiles, [nb, n, n]."""
    n = config.block_size
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))
    strictly_past = jnp.tril(jnp.ones((n, n), dtype=bool), k=-1)
    bias, gap, dead = tile_bias(fb.diag_min, x.psi, x.psi, beta, config, strictly_past)
    mask = causal[None] & (x.segment[:, :, None] == x.segment[:, None, :])
    logits = jnp.where(mask, tile_logits(x, x, bias, config), -jnp.inf)
    return logits, mask, gap, dead & mask


def off_diagonal_tile(x: HeadInputs, fb: blocks.FieldBlocks, gap_min, d, beta, config):
    """Tiles (i, i - d) for every query block i: keys, range minimum, logits, mask, bias."""
    keys = HeadInputs(*(shift_blocks(t, d) for t in x))
    suffix_min = shift_blocks(fb.suffix_min, d)
    range_min = blocks.off_diagonal_range_min(suffix_min, gap_min, fb.prefix_min)
    bias, gap, dead = tile_bias(range_min, x.psi, keys.psi, beta, config)
    valid = jnp.arange(x.q.shape[0]) >= d
    mask = valid[:, None, None] & (x.segment[:, :, None] == keys.segment[:, None, :])
    logits = jnp.where(mask, tile_logits(x, keys, bias, config), -jnp.inf)
    return keys, suffix_min, range_min, logits, mask, gap, dead & mask
