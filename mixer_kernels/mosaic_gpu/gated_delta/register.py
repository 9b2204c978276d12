"""The "pallas" entry of `gdn_jax.ops.api.REGISTRY` (op "gated_delta_rule") and its
`supports`; the op module builds its table from them.

Runs on a Hopper GPU (or the CPU in GPU interpret mode, for tests) with bf16/fp16 q and k
(float32 only when interpreting), K and V in {64, 128, 256} and chunk_size 64; otherwise
`supports` says why not and the default (implementation=None) falls back to "xla".
"""

import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.gated_delta import state_kernels, vjp
from mixer_kernels.mosaic_gpu.gated_delta.common import CHUNK, SUPPORTED_HEAD_DIMS
from mixer_core.registry import mosaic_gpu_reason

def supports(**facts):
    """None if the kernels run on these inputs, else the reason."""
    reason = mosaic_gpu_reason(facts, "q and k (16-bit tensor-core operands)")
    if reason is not None:
        return reason
    key_dim, value_dim = facts.get("head_dim"), facts.get("value_head_dim")
    if key_dim not in SUPPORTED_HEAD_DIMS or value_dim not in SUPPORTED_HEAD_DIMS:
        return (f"needs K and V in {SUPPORTED_HEAD_DIMS}, got K = {key_dim}, "
                f"V = {value_dim}")
    if facts.get("chunk_size") != CHUNK:
        return f"needs chunk_size {CHUNK}, got {facts.get('chunk_size')}"
    try:
        dtype = jnp.dtype(facts.get("dtype", jnp.float32))
        state_kernels.choose_tiling(-(-facts["seq_len"] // CHUNK), CHUNK,
                                    key_dim, value_dim, dtype)
    except ValueError as error:
        return str(error)
    return None


def keeps_chunk_states() -> bool:
    """Whether the kernels keep their chunk-entering states for the backward pass: only with
    `vjp.RESIDUALS = "internals"` (the default "inputs" keeps the op's inputs alone)."""
    return vjp.RESIDUALS == "internals"


def gated_delta_rule_pallas(q, k, v, g, beta, *, scale, initial_state, segment_ids, chunk_size):
    """The registry's `fn`: (out [B, T, HV, V] float32, final_state [B, HV, K, V] float32)."""
    if chunk_size != CHUNK:
        raise ValueError(f"chunk_size: the pallas kernels need {CHUNK}, got {chunk_size}")
    return vjp.chunked_forward_pallas(q, k, v, g, beta, scale=scale,
                                          initial_state=initial_state, segment_ids=segment_ids)

