"""Blocked FPA attention in pure JAX: never materialises T x T, memory O(T * block).

Per head, with blocks of n positions (query block i, key block j = i - d):

    d = 0 (diagonal):  b_ts = beta * min(0, diag_min[i, t, s] - psi_s),  s < t;  b_tt = 0
    d >= 1:            b_ts = beta * min(0, min(A_s, G_i(d), C_t) - psi_s)
                       G_i(1) = +inf,  G_i(d + 1) = min(G_i(d), block_min[i - d])
    logits = scale * <q_t, k_s> + b_ts  -> online softmax over d, float32 statistics

The scan runs over the offset d, all query blocks at once (tiles with i < d are masked), so
the gap minimum G is a running minimum carried by the scan. With query_level, psi_t replaces
psi_s. The backward pass (xla_vjp.py) recomputes the tiles; the forward stores only the
output and the row log-sum-exp.

Shapes (public wrapper): q, k, v [B, T, H, D]; phi, psi [B, T, H]; beta [H];
segment_ids [B, T] int32 -> out [B, T, H, D].
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fpa_jax.fpa import blocks


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


def forward_head(q, k, v, phi, psi, beta, segment, config: BlockedConfig):
    """One head: q, k, v [T, D] (T a multiple of the block), phi, psi [T] -> out, lse."""
    n = config.block_size
    x = cut_blocks(q, k, v, psi, segment, n)
    fb = blocks.field_blocks(phi, n)
    nb = fb.phi.shape[0]

    logits, _, _, _ = diagonal_tile(x, fb, beta, config)
    row_max = logits.max(-1)
    probs = jnp.exp(logits - row_max[..., None])
    row_sum = probs.sum(-1)
    acc = jnp.einsum("nts,nsd->ntd", probs.astype(v.dtype), x.v, preferred_element_type=probs.dtype)

    def step(carry, d):
        row_max, row_sum, acc, gap_min = carry
        keys, _, _, logits, _, _, _ = off_diagonal_tile(x, fb, gap_min, d, beta, config)
        new_max = jnp.maximum(row_max, logits.max(-1))
        correction = jnp.exp(row_max - new_max)
        probs = jnp.exp(logits - new_max[..., None])
        row_sum = row_sum * correction + probs.sum(-1)
        acc = acc * correction[..., None] + jnp.einsum(
            "nts,nsd->ntd", probs.astype(v.dtype), keys.v, preferred_element_type=probs.dtype)
        gap_min = jnp.minimum(gap_min, shift_blocks(fb.block_min, d))
        return (new_max, row_sum, acc, gap_min), None

    init = (row_max, row_sum, acc, jnp.full((nb,), blocks.BIG, phi.dtype))
    (row_max, row_sum, acc, _), _ = jax.lax.scan(step, init, jnp.arange(1, nb))
    out = acc / row_sum[..., None]
    lse = row_max + jnp.log(row_sum)
    return out.reshape(-1, out.shape[-1]).astype(q.dtype), lse.reshape(-1)


def pad_time(x, length, axis=1, value=0):
    pad = length - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def choose_block_size(length, block_size):
    """The block size actually used: no larger than T rounded up to a multiple of 8."""
    return int(min(block_size, max(8, -(-length // 8) * 8)))


def to_heads(q, k, v, phi, psi, segment_ids, block_size):
    """[B, T, H, ...] -> padded [B, H, Tp, ...]; segment ids [B, Tp] (padding: its own id)."""
    length = q.shape[1]
    padded = -(-length // block_size) * block_size
    heads = lambda t: jnp.moveaxis(pad_time(t, padded), 2, 1)
    if segment_ids is None:
        segment_ids = jnp.zeros(q.shape[:2], jnp.int32)
    pad_id = jnp.iinfo(jnp.int32).min
    segment = pad_time(segment_ids.astype(jnp.int32), padded, value=pad_id)
    dtype = stat_dtype(phi)
    return heads(q), heads(k), heads(v), heads(phi.astype(dtype)), heads(psi.astype(dtype)), segment


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def fpa_blocked(q, k, v, phi, psi, beta, segment_ids, config: BlockedConfig):
    """Blocked FPA attention with the straight-through soft-minimum VJP."""
    out, _ = _forward(q, k, v, phi, psi, beta, segment_ids, config)
    return out


def _forward(q, k, v, phi, psi, beta, segment_ids, config):
    length = q.shape[1]
    qh, kh, vh, phih, psih, segment = to_heads(q, k, v, phi, psi, segment_ids, config.block_size)
    head_fn = lambda *a: forward_head(*a, config)
    over_heads = jax.vmap(head_fn, in_axes=(0, 0, 0, 0, 0, 0, None))
    batched = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, 0, None, 0))
    out, lse = batched(qh, kh, vh, phih, psih, beta.astype(phih.dtype), segment)
    return jnp.moveaxis(out, 1, 2)[:, :length], lse


def _fwd(q, k, v, phi, psi, beta, segment_ids, config):
    out, lse = _forward(q, k, v, phi, psi, beta, segment_ids, config)
    return out, (q, k, v, phi, psi, beta, segment_ids, out, lse)


def _bwd(config, residuals, dout):
    from fpa_jax.fpa.xla_vjp import blocked_backward

    q, k, v, phi, psi, beta, segment_ids, out, lse = residuals
    grads = blocked_backward(q, k, v, phi, psi, beta, segment_ids, out, lse, dout, config)
    seg_cotangent = None if segment_ids is None else np.zeros(segment_ids.shape, jax.dtypes.float0)
    return (*grads, seg_cotangent)


fpa_blocked.defvjp(_fwd, _bwd)
