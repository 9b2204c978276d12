"""Mixture-of-experts SwiGLU feed-forward: top-k routing, capacity or dropless, load balancing.

    x [B, T, D] -> tokens x_n [N, D], N = B T;  E experts, each a SwiGLU of width F
    p_n       = softmax(x_n W_r)                      router probabilities [N, E] (float32)
    e_nj, w~  = top_k(p_n)                            j = 1..k: experts and their probabilities
    w_nj      = w~_nj / sum_j w~_nj                   (renormalised over the k choices)
    y_n       = sum_j keep_nj w_nj FFN_{e_nj}(x_n),   FFN_e(x) = (silu(x G_e) * (x U_e)) D_e

keep: dropless (capacity_factor = 0) keeps every assignment; with a capacity factor c each
expert takes at most C = ceil(c N k / E) assignments, filled in priority order (every token's
first choice in token order, then every second choice, ...); the rest are dropped (their
token keeps only its other experts and the residual stream).

Load balancing (Switch / GShard): with f_e the fraction of the N k assignments routed to e
(before dropping; no gradient) and P_e the mean of p_ne over tokens,

    aux = E * sum_e f_e P_e = mean_n a_n,    a_n = E * sum_e f_e p_ne

(1 when routing is uniform). The layer sows coef * a_n per token [B, T] into the collection
AUX_COLLECTION; `apply_with_auxiliary_loss` returns the sum over layers, to be added to the
per-token cross-entropy before the train loss's masked mean (so the auxiliary term is averaged
like the loss, micro-batches included); train/core/step.py does so (a plain `model.apply` ignores
sown values).

Computation: capacity mode scatters assignments into per-expert buffers [E, C, D] (logical
axes ("expert", None, "embed"): the rules table shards experts over the `expert` mapping),
runs the experts as batched matmuls and gathers back; dropless mode sorts the N k assignments
by expert and runs grouped matmuls (`lax.ragged_dot`) with no padding and no drop. Expert
weights: G_e, U_e [E, D, F] ("expert", "embed", "mlp"), D_e [E, F, D] ("expert", "mlp",
"embed"); router W_r [D, E] ("embed", None), applied in float32.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from train.core.sharding import LOGICAL_AXIS_RULES

AUX_COLLECTION = "aux_loss"


def route(router_logits: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """router_logits [N, E] -> (weights [N, k] float32, experts [N, k] int32, probs [N, E])."""
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    top_probs, experts = jax.lax.top_k(probs, top_k)
    return top_probs / jnp.sum(top_probs, axis=-1, keepdims=True), experts.astype(jnp.int32), probs


def load_balancing_terms(probs: jax.Array, experts: jax.Array) -> jax.Array:
    """a_n = E * sum_e f_e p_ne [N] (module doc); its mean over tokens is the Switch loss."""
    num_experts = probs.shape[-1]
    counts = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32), axis=(0, 1))
    fractions = jax.lax.stop_gradient(counts / experts.size)
    return num_experts * probs @ fractions


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """C = ceil(c N k / E), at least 1 and at most N (an expert never gets a token twice)."""
    return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens * top_k / num_experts)))


def capacity_slots(experts: jax.Array, num_experts: int,
                   capacity: int) -> tuple[jax.Array, jax.Array]:
    """Slot of each assignment in its expert's buffer, in priority order: (slot, keep) [N, k].

    Priority: choice j = 0 of tokens 0..N-1, then choice j = 1, ... (module doc).
    """
    by_priority = experts.T.reshape(-1)                                       # [k N]
    one_hot = jax.nn.one_hot(by_priority, num_experts, dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(one_hot, axis=0) - 1) * one_hot, axis=-1)      # [k N]
    slot = slot.reshape(experts.shape[1], experts.shape[0]).T
    return slot, slot < capacity


def _swiglu(x, gate, up, down, matmul):
    hidden = nn.silu(matmul(x, gate)) * matmul(x, up)
    return matmul(hidden, down)


def _capacity_experts(tokens, experts, gate, up, down, capacity):
    """y per assignment [N, k, D]; a dropped assignment reads zeros (out-of-range slot)."""
    num_experts = gate.shape[0]
    slot, keep = capacity_slots(experts, num_experts, capacity)
    slot = jnp.where(keep, slot, capacity)               # out of range: dropped
    token_of = jnp.broadcast_to(jnp.arange(tokens.shape[0])[:, None], experts.shape)
    buffers = jnp.zeros((num_experts, capacity, tokens.shape[-1]), tokens.dtype)
    buffers = buffers.at[experts, slot].set(tokens[token_of], mode="drop")
    buffers = nn.with_logical_constraint(buffers, ("expert", None, "embed"),
                                         rules=LOGICAL_AXIS_RULES)
    batched = lambda x, w: jnp.einsum("ecd,edf->ecf", x, w)
    outputs = _swiglu(buffers, gate, up, down, batched)
    outputs = nn.with_logical_constraint(outputs, ("expert", None, "embed"),
                                         rules=LOGICAL_AXIS_RULES)
    return outputs.at[experts, slot].get(mode="fill", fill_value=0)


def _dropless_experts(tokens, experts, gate, up, down):
    """y per assignment [N, k, D]: assignments sorted by expert, grouped matmuls."""
    num_experts = gate.shape[0]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    grouped = lambda x, w: jax.lax.ragged_dot(x, w, group_sizes)
    outputs = _swiglu(tokens[order // experts.shape[1]], gate, up, down, grouped)
    return jnp.zeros_like(outputs).at[order].set(outputs).reshape(*experts.shape, -1)


class MoEFeedForward(nn.Module):
    """x [B, T, D] -> [B, T, D]; sows coef * a_n [B, T] into AUX_COLLECTION (module doc)."""

    num_experts: int
    top_k: int
    hidden_dim: int
    capacity_factor: float = 0.0        # 0: dropless
    aux_loss_coef: float = 0.01
    init_std: float = 0.02
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k: expected 1 <= top_k <= num_experts = {self.num_experts}, "
                             f"got {self.top_k}")
        batch, length, width = x.shape
        normal = nn.initializers.normal(self.init_std)
        init = lambda axes: nn.with_logical_partitioning(normal, axes)
        experts_shape = (self.num_experts, width, self.hidden_dim)
        router = self.param("router", init(("embed", None)), (width, self.num_experts),
                            self.param_dtype)
        gate = self.param("gate", init(("expert", "embed", "mlp")), experts_shape, self.param_dtype)
        up = self.param("up", init(("expert", "embed", "mlp")), experts_shape, self.param_dtype)
        down = self.param("down", init(("expert", "mlp", "embed")),
                          (self.num_experts, self.hidden_dim, width), self.param_dtype)

        tokens = x.reshape(batch * length, width).astype(self.dtype)
        weights, experts, probs = route(tokens.astype(jnp.float32) @ router.astype(jnp.float32),
                                        self.top_k)
        self.sow(AUX_COLLECTION, "load_balancing",
                 self.aux_loss_coef * load_balancing_terms(probs, experts).reshape(batch, length))
        gate, up, down = (w.astype(self.dtype) for w in (gate, up, down))
        if self.capacity_factor > 0:
            capacity = expert_capacity(tokens.shape[0], self.num_experts, self.top_k,
                                       self.capacity_factor)
            outputs = _capacity_experts(tokens, experts, gate, up, down, capacity)
        else:
            outputs = _dropless_experts(tokens, experts, gate, up, down)
        y = jnp.einsum("nk,nkd->nd", weights.astype(outputs.dtype), outputs)
        return y.reshape(batch, length, width)


def moe_dense_reference(params: dict, x: jax.Array, *, top_k: int, keep: Any = None) -> jax.Array:
    """Oracle: every expert on every token, combined with the routing weights (tests only).

    keep [N, k] bool (default all True) marks the assignments that survive the capacity.
    """
    tokens = x.reshape(-1, x.shape[-1])
    weights, experts, _ = route(tokens @ params["router"], top_k)
    if keep is not None:
        weights = weights * keep
    out = jnp.zeros_like(tokens)
    for e in range(params["gate"].shape[0]):
        combine = jnp.sum(jnp.where(experts == e, weights, 0.0), axis=-1)     # [N]
        expert_out = _swiglu(tokens, params["gate"][e], params["up"][e], params["down"][e],
                             jnp.matmul)
        out = out + combine[:, None] * expert_out
    return out.reshape(x.shape)


def apply_with_auxiliary_loss(model: nn.Module, params: Any, tokens: jax.Array,
                              segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits, aux [B, T] float32): the model's output and the sum of its layers' sown
    auxiliary loss terms (zeros for a model without MoE layers)."""
    logits, state = model.apply({"params": params}, tokens, segment_ids,
                                mutable=[AUX_COLLECTION])
    terms = jax.tree.leaves(state.get(AUX_COLLECTION, {}))
    aux = sum(terms) if terms else jnp.zeros(tokens.shape, jnp.float32)
    return logits, aux
