"""The mixers' ops with the time axis split over the "context" mesh axis (context parallelism),
batch and heads split as in shard.py, inside `jax.shard_map`.

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
      gated_delta_rule   context_parallel_gated_delta_rule     (gdn_jax/ops/context_parallel.py)

Values and gradients equal the unsplit ops' up to float32 reordering (autodiff through the
ring's `ppermute`s). FPA's walk here runs over the whole row instead of restarting at each
document start as `fpa_jax.fields` does: the offset is constant inside a document, so it cancels
in every same-document gap R_ts - psi_s (and in the soft minimum), and the bias is unchanged.

The ring attention ops have one (XLA) path, so attention takes no `implementation`; the delta
rule's `implementation` picks the local chunked op. A layer asks `context_size()` which path to
take: n > 1 only with a mesh in scope whose "context" axis is larger than 1, outside any
shard_map. check_vma=False for the reasons given in shard.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fpa_jax.context_parallel import context_parallel_fields, ring_fox_attention, ring_fpa_attention
from gdn_jax.ops.context_parallel import context_parallel_gated_delta_rule
from mixer_core import shard

CONTEXT_AXIS = "context"
FPA_WALK_LAYOUTS = ("BTHD", "BTHD", "BTHD", "BTH", "BTH", "BTH", "H")   # q, k, v, delta, g, h, beta


def context_size() -> int:
    """n, the size of the "context" axis of the mesh in scope; 1 without a mesh, without that
    axis, or inside a shard_map."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.manual_axes or CONTEXT_AXIS not in mesh.axis_names:
        return 1
    return mesh.shape[CONTEXT_AXIS]


def _shard_over_context(local: Callable[..., Any], arrays: Sequence[Any],
                        layouts: Sequence[str], segment_ids: Any) -> Any:
    """local(*shards, segment_ids=shard or None) per shard (shard.shard_batch_and_heads with T
    over CONTEXT_AXIS); its output has layout "BTHD"."""
    size = context_size()
    if size < 2:
        raise ValueError(f"mesh: the context-parallel ops need a mesh in scope with a "
                         f"{CONTEXT_AXIS!r} axis larger than 1, got context size {size}")
    length = arrays[0].shape[1]
    if length % size:
        raise ValueError(f"q: the time axis ({length} tokens) must split evenly over the {size} "
                         f"devices of mesh axis {CONTEXT_AXIS!r}")
    return shard.shard_batch_and_heads(local, *arrays, layouts=layouts, out_layouts="BTHD",
                                       time_axis=CONTEXT_AXIS, segment_ids=segment_ids)


def fpa_attention(q, k, v, delta, g, h, beta, *, scale, tau, segment_ids, query_level,
                  content):
    """FPA attention from the walk's inputs delta, g, h [B, T, H] (beta [H]), T over the ring."""
    def local(q, k, v, delta, g, h, beta, segment_ids=None):
        phi, psi = context_parallel_fields(delta, g, h, axis_name=CONTEXT_AXIS)
        return ring_fpa_attention(q, k, v, phi, psi, beta, axis_name=CONTEXT_AXIS, scale=scale,
                                  tau=tau, segment_ids=segment_ids, query_level=query_level,
                                  content=content)

    return _shard_over_context(local, (q, k, v, delta, g, h, beta), FPA_WALK_LAYOUTS,
                               segment_ids)


def fox_attention(q, k, v, log_forget, *, scale, segment_ids):
    """FoX attention (log_forget [B, T, H]) with T over the ring."""
    def local(q, k, v, log_forget, segment_ids=None):
        return ring_fox_attention(q, k, v, log_forget, axis_name=CONTEXT_AXIS, scale=scale,
                                  segment_ids=segment_ids)

    return _shard_over_context(local, (q, k, v, log_forget), shard.FOX_LAYOUTS, segment_ids)


def softmax_attention(q, k, v, *, scale, segment_ids, alibi_slopes=None):
    """Causal softmax attention (ALiBi when alibi_slopes [H] is given) with T over the ring."""
    slopes = jnp.zeros(q.shape[2:3], jnp.float32) if alibi_slopes is None else alibi_slopes

    def local(q, k, v, slopes, segment_ids=None):
        log_forget = jnp.broadcast_to(-slopes.astype(jnp.float32), q.shape[:3])
        return ring_fox_attention(q, k, v, log_forget, axis_name=CONTEXT_AXIS, scale=scale,
                                  segment_ids=segment_ids)

    return _shard_over_context(local, (q, k, v, slopes), shard.SOFTMAX_LAYOUTS + ("H",),
                               segment_ids)


def gated_delta_rule(q, k, v, g, beta, *, segment_ids, chunk_size, implementation):
    """The gated delta rule's output [B, T, HV, V] (no final state) with T over the devices."""
    def local(q, k, v, g, beta, segment_ids=None):
        out, _ = context_parallel_gated_delta_rule(
            q, k, v, g, beta, axis_name=CONTEXT_AXIS, segment_ids=segment_ids,
            chunk_size=chunk_size, implementation=implementation)
        return out

    return _shard_over_context(local, (q, k, v, g, beta), shard.GDN_LAYOUTS, segment_ids)
