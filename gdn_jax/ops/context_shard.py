"""The gated delta rule's context-parallel form: the time axis split over the "context" mesh
axis, batch and heads split as in mixer_core/shard.py, inside `jax.shard_map`; per shard
`context_parallel_gated_delta_rule` (gdn_jax/ops/context_parallel.py), which passes the states
along "context". A layer reaches it through `shard.ring_or_shard(gated_delta_rule,
context_shard.gated_delta_rule, ...)` (the attention ops' forms: fpa_jax/context_shard.py).

Values and gradients equal the unsplit op's up to float32 reordering; `implementation` picks
the local chunked op. check_vma=False for the reasons given in mixer_core/shard.py.
"""

from __future__ import annotations

from gdn_jax.ops.context_parallel import context_parallel_gated_delta_rule
from mixer_core import shard
from mixer_core.shard import CONTEXT_AXIS


def gated_delta_rule(q, k, v, g, beta, *, segment_ids, chunk_size, implementation):
    """(out [B, T, HV, V], None) with T over the devices: the op's outputs without the final
    state, which the split op does not return."""
    def local(q, k, v, g, beta, segment_ids=None):
        out, _ = context_parallel_gated_delta_rule(
            q, k, v, g, beta, axis_name=CONTEXT_AXIS, segment_ids=segment_ids,
            chunk_size=chunk_size, implementation=implementation)
        return out

    return shard.shard_over_context(local, q, k, v, g, beta, layouts=shard.GDN_LAYOUTS,
                                    segment_ids=segment_ids), None
