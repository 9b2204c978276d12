"""Blocked FPA attention in pure JAX: never materialises T x T, memory O(T * block).

Per head, with blocks of n positions (query block i, key block j = i - d):

    d = 0 (diagonal):  b_ts = beta * min(0, diag_min[i, t, s] - psi_s),  s < t;  b_tt = 0
    d >= 1:            b_ts = beta * min(0, min(A_s, G_i(d), C_t) - psi_s)
                       G_i(1) = +inf,  G_i(d + 1) = min(G_i(d), block_min[i - d])
    logits = scale * <q_t, k_s> + b_ts  -> online softmax over d, float32 statistics

The scan runs over the offset d, all query blocks at once (tiles with i < d are masked), so
the gap minimum G is a running minimum carried by the scan. With query_level, psi_t replaces
psi_s. The tiles themselves are built in tiles.py; the backward pass (xla_vjp.py) recomputes
them, so the forward stores only the output (float32 for bf16 inputs, so the backward's
Delta_t = <dout_t, out_t> is not taken from the rounded output) and the row log-sum-exp.

Shapes (public wrapper): q, k, v [B, T, H, D]; phi, psi [B, T, H]; beta [H];
segment_ids [B, T] int32 -> out [B, T, H, D].
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fpa_jax.fpa import blocks
from fpa_jax.fpa.tiles import (BlockedConfig, cut_blocks, diagonal_tile, off_diagonal_tile,
                               shift_blocks, to_heads)
from fpa_jax.fpa.xla_vjp import blocked_backward


def forward_head(q, k, v, phi, psi, beta, segment, config: BlockedConfig):
    """One head: q, k, v [T, D] (T a multiple of the block), phi, psi [T] -> out, lse.

    out stays in the statistics dtype (float32 for bf16 inputs); callers cast it.
    """
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
    return out.reshape(-1, out.shape[-1]), lse.reshape(-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def fpa_blocked(q, k, v, phi, psi, beta, segment_ids, config: BlockedConfig):
    """Blocked FPA attention with the straight-through soft-minimum VJP."""
    out, _ = _forward(q, k, v, phi, psi, beta, segment_ids, config)
    return out.astype(q.dtype)


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
    return out.astype(q.dtype), (q, k, v, phi, psi, beta, segment_ids, out, lse)


def _bwd(config, residuals, dout):
    q, k, v, phi, psi, beta, segment_ids, out, lse = residuals
    grads = blocked_backward(q, k, v, phi, psi, beta, segment_ids, out, lse, dout, config)
    seg_cotangent = None if segment_ids is None else np.zeros(segment_ids.shape, jax.dtypes.float0)
    return (*grads, seg_cotangent)


fpa_blocked.defvjp(_fwd, _bwd)
