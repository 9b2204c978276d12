"""The attention ops' context-parallel forms: the time axis split over the "context" mesh axis,
batch and heads split as in mixer_core/shard.py, inside `jax.shard_map`. A layer reaches them
through `shard.ring_or_shard(op, ring, ...)`, which calls them (with the op's own arguments)
when the mesh in scope splits time; the delta rule's form is gdn_jax/ops/context_shard.py.

    mesh      the mesh in scope (`jax.set_mesh`) with an axis CONTEXT_AXIS = "context" of size n
    T         time dimension -> "context": device i of n holds tokens [i L, (i + 1) L), L = T / n
    B, H      -> ("data", "fsdp") and "tensor" where they divide every array (`shard.plan`)
    per shard the op on x[b, i L:(i + 1) L, h], exchanging along "context" what it needs:
      fpa_attention      phi, psi = context_parallel_fields(delta, g, h)   (the global walk)
                         -> ring_fpa_attention                 (fpa_jax/context_parallel.py)
      fox_attention      ring_fox_attention (global cumulative sum of log_forget)
      softmax_attention  ring_fox_attention with log_forget_t = -slope_h, so that
                         c_t - c_s = -slope_h (t - s) (ALiBi), or log_forget = 0 (RoPE or NoPE:
                         q and k are rotated by the caller before the op)

Values and gradients equal the unsplit ops' up to float32 reordering (autodiff through the
ring's `ppermute`s). FPA's walk here runs over the whole row instead of restarting at each
document start as `fpa_jax.fields` does: the offset is constant inside a document, so it cancels
in every same-document gap R_ts - psi_s (and in the soft minimum), and the bias is unchanged.

The ring attention ops have one (XLA) path: `implementation` is accepted, so that the forms
take their ops' arguments, and ignored; `block_size` is the ring's query tile (RING_BLOCK
rows unless the layer sets it). check_vma=False for the reasons given in
mixer_core/shard.py.

These forms sit with the ops, not in mixer_core: they call the ops' ring functions.
"""

from __future__ import annotations

import jax.numpy as jnp

from fpa_jax.context_parallel import (RING_BLOCK, context_parallel_fields, ring_fox_attention,
                                     ring_fpa_attention)
from mixer_core import shard
from mixer_core.shard import CONTEXT_AXIS


def fpa_attention(q, k, v, delta, g, h, beta, *, scale, tau, segment_ids, query_level,
                  content, implementation=None, block_size=RING_BLOCK):
    """FPA attention from the walk's inputs delta, g, h [B, T, H] (beta [H]), T over the ring."""
    def local(q, k, v, delta, g, h, beta, segment_ids=None):
        phi, psi = context_parallel_fields(delta, g, h, axis_name=CONTEXT_AXIS)
        return ring_fpa_attention(q, k, v, phi, psi, beta, axis_name=CONTEXT_AXIS, scale=scale,
                                  tau=tau, segment_ids=segment_ids, query_level=query_level,
                                  content=content, block_size=block_size)

    return shard.shard_over_context(local, q, k, v, delta, g, h, beta,
                                    layouts=shard.FPA_WALK_LAYOUTS, segment_ids=segment_ids)


def fox_attention(q, k, v, log_forget, *, scale, segment_ids, implementation=None,
                  block_size=RING_BLOCK):
    """FoX attention (log_forget [B, T, H]) with T over the ring."""
    def local(q, k, v, log_forget, segment_ids=None):
        return ring_fox_attention(q, k, v, log_forget, axis_name=CONTEXT_AXIS, scale=scale,
                                  segment_ids=segment_ids, block_size=block_size)

    return shard.shard_over_context(local, q, k, v, log_forget, layouts=shard.FOX_LAYOUTS,
                                    segment_ids=segment_ids)


def softmax_attention(q, k, v, *, scale, segment_ids, alibi_slopes=None, implementation=None,
                      block_size=RING_BLOCK):
    """Causal softmax attention (ALiBi when alibi_slopes [H] is given) with T over the ring."""
    slopes = jnp.zeros(q.shape[2:3], jnp.float32) if alibi_slopes is None else alibi_slopes

    def local(q, k, v, slopes, segment_ids=None):
        log_forget = jnp.broadcast_to(-slopes.astype(jnp.float32), q.shape[:3])
        return ring_fox_attention(q, k, v, log_forget, axis_name=CONTEXT_AXIS, scale=scale,
                                  segment_ids=segment_ids, block_size=block_size)

    return shard.shard_over_context(local, q, k, v, slopes,
                                    layouts=shard.SOFTMAX_LAYOUTS + ("H",),
                                    segment_ids=segment_ids)
