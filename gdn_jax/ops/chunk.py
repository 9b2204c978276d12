"""Chunked (WY) form of the gated delta rule: batched matmuls within chunks, a scan across them.

Same recurrence as `naive.recurrent_forward` (S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1}
+ beta_t k_t v_t^T, o_t = S_t^T scale q_t), evaluated chunk by chunk. Within a chunk of C
tokens (local index i), with entering state S_c and gamma_i = g_1 + ... + g_i:

    Gamma_ij = exp(gamma_i - gamma_j)          i >= j, same document; else 0
    e_i      = exp(gamma_i)                    if no document starts in the chunk up to i; else 0
    A_ij     = beta_i (k_i . k_j) Gamma_ij     i > j; else 0
    [W | U]  = (I + A)^{-1} [diag(beta e) K | diag(beta) V]      block forward substitution
    V_new    = U - W S_c                       (the delta-rule errors u_i of the chunk)
    O        = diag(e) Q S_c + (Q K^T ⊙ Gamma) V_new              (Q already scaled)
    S_{c+1}  = e_C S_c + K^T diag(Gamma_{C,:}) V_new

    q, k [B, T, H, K]   v [B, T, HV, V]   g, beta [B, T, HV]   S [B, HV, K, V]
    chunk-major internals: q, k [N, B, H, C, K]; v [N, B, H, G, C, V]; g, beta [N, B, H, G, C]

Value head j = h * G + r reads query/key head h (G = HV // H): v, g and beta are reshaped to
[.., H, G, ..] and q, k broadcast over G; q and k are never repeated.

A document start at token t behaves as alpha_t = 0: pairs (i, j) across it get Gamma_ij = 0
(so A, the intra-chunk attention and the write decay vanish across it), tokens after it do not
see S_c (e_i = 0), and S_{c+1} keeps only the writes of the chunk's last document.
Exponents are masked before `exp`, so for g <= 0 only exp(non-positive) is ever evaluated.

T is padded to a multiple of C with g = beta = q = k = v = 0, which leaves the state unchanged.

Memory: everything except the S_c recurrence is batched over all chunks at once; only the state
recurrence is a `lax.scan`. The whole function runs under `jax.checkpoint` whose policy saves
only the per-chunk entering states S_c ([N, B, HV, K, V] float32). Autodiff therefore stores the
original inputs plus those states, nothing else. The backward pass recomputes Gamma, A, W, U
and the intra-chunk attention (O(T * C) per head, batched over chunks) and V_new from them,
without re-running the forward state recurrence, then runs the recurrence once in reverse.
No per-token state is ever stored.
"""

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from gdn_jax.ops.naive import zero_state
from mixer_core.delta_rule_math import (compute_dtype, pair_decay_matrix, state_resets,
                                        unit_lower_inverse)

_CHUNK_STATE = "gdn_chunk_entering_state"


def _to_chunks(x, num_chunks, chunk):
    """[B, N*C, ...] -> [B, N, C, ...]."""
    return x.reshape(x.shape[0], num_chunks, chunk, *x.shape[2:])


def _pad_time(x, pad):
    return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def _document_masks(segment_ids, batch, num_chunks, chunk):
    """Masks for packed documents, or (None, None) without segment ids.

    Returns same_document [N, B, 1, 1, C, C] (tokens i, j of a chunk lie in one document) and
    sees_entering_state [N, B, 1, 1, C] (no document starts between the chunk start and i).
    """
    if segment_ids is None:
        return None, None
    seq_len = segment_ids.shape[1]
    resets = state_resets(segment_ids, (batch, seq_len))
    resets = _pad_time(resets, num_chunks * chunk - seq_len)  # padding continues the document
    document = jnp.cumsum(resets.astype(jnp.int32), axis=1)
    document = jnp.moveaxis(_to_chunks(document, num_chunks, chunk), 1, 0)   # [N, B, C]
    resets = jnp.moveaxis(_to_chunks(resets, num_chunks, chunk), 1, 0)
    entering_document = document[..., 0] - resets[..., 0]                   # [N, B]
    same_document = document[..., :, None] == document[..., None, :]
    sees_entering_state = document == entering_document[..., None]
    return same_document[:, :, None, None], sees_entering_state[:, :, None, None]


def _intra_chunk(q, k, v, g, beta, same_document, sees_entering_state):
    """Everything that does not depend on the entering states, for all chunks at once."""
    chunk, key_dim = k.shape[-2], k.shape[-1]
    gamma = jnp.cumsum(g, axis=-1)                                           # [N, B, H, G, C]
    pair_decay = pair_decay_matrix(gamma, gamma, same_document)              # Gamma
    if sees_entering_state is None:
        entering_decay = jnp.exp(gamma)
    else:
        entering_decay = jnp.exp(jnp.where(sees_entering_state, gamma, -jnp.inf))  # e

    key_gram = jnp.einsum("nbhik,nbhjk->nbhij", k, k)
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
    coupling = jnp.where(strictly_lower,
                         beta[..., :, None] * key_gram[:, :, :, None] * pair_decay, 0.0)  # A
    right_hand_side = jnp.concatenate(
        [(beta * entering_decay)[..., None] * k[:, :, :, None], beta[..., None] * v], axis=-1)
    solved = jnp.matmul(unit_lower_inverse(coupling), right_hand_side)
    state_weights, base_values = solved[..., :key_dim], solved[..., key_dim:]  # W, U

    attention = jnp.einsum("nbhik,nbhjk->nbhij", q, k)[:, :, :, None] * pair_decay
    write_decay = pair_decay[..., -1, :]        # exp(gamma_C - gamma_j) within the last document
    carry_decay = entering_decay[..., -1]       # e_C: zero if a document starts in the chunk
    return entering_decay, state_weights, base_values, attention, write_decay, carry_decay


def _state_scan(state, k, state_weights, base_values, write_decay, carry_decay):
    """Sequential S_c recurrence. Returns (final state, entering states [N, ...])."""

    def step(state, chunk_inputs):
        k_c, w_c, u_c, write_c, carry_c = chunk_inputs
        state = checkpoint_name(state, _CHUNK_STATE)
        new_values = u_c - jnp.einsum("bhgck,bhgkv->bhgcv", w_c, state)
        written = jnp.einsum("bhck,bhgcv->bhgkv", k_c, write_c[..., None] * new_values)
        return carry_c[..., None, None] * state + written, state

    return jax.lax.scan(step, state, (k, state_weights, base_values, write_decay, carry_decay))


def _chunked(q, k, v, g, beta, initial_state, segment_ids, *, scale, chunk_size):
    batch, seq_len, num_heads, key_dim = q.shape
    num_v_heads, value_dim = v.shape[2], v.shape[3]
    group = num_v_heads // num_heads
    chunk = min(chunk_size, seq_len)
    num_chunks = -(-seq_len // chunk)
    pad = num_chunks * chunk - seq_len
    dtype = compute_dtype(q, k, v, g, beta, initial_state)

    def chunk_major(x, inner_shape, permutation):
        """Pad T, cast to the compute dtype, split into chunks, move the chunk axis first."""
        x = _to_chunks(_pad_time(x.astype(dtype), pad), num_chunks, chunk)
        return x.reshape(batch, num_chunks, chunk, *inner_shape).transpose(permutation)

    # [B, N, C, H, D] -> [N, B, H, C, D];  [B, N, C, H, G, D] -> [N, B, H, G, C, D]
    q = chunk_major(q, (num_heads, key_dim), (1, 0, 3, 2, 4)) * scale
    k = chunk_major(k, (num_heads, key_dim), (1, 0, 3, 2, 4))
    v = chunk_major(v, (num_heads, group, value_dim), (1, 0, 3, 4, 2, 5))
    # [B, N, C, H, G] -> [N, B, H, G, C]
    g = chunk_major(g, (num_heads, group), (1, 0, 3, 4, 2))
    beta = chunk_major(beta, (num_heads, group), (1, 0, 3, 4, 2))
    same_document, sees_entering_state = _document_masks(segment_ids, batch, num_chunks, chunk)

    if initial_state is None:
        state = zero_state((batch, num_heads, group, key_dim, value_dim), dtype,
                           q, k, v, g, beta)
    else:
        state = initial_state.astype(dtype).reshape(
            batch, num_heads, group, key_dim, value_dim)

    (entering_decay, state_weights, base_values, attention, write_decay,
     carry_decay) = _intra_chunk(q, k, v, g, beta, same_document, sees_entering_state)
    final_state, entering_states = _state_scan(
        state, k, state_weights, base_values, write_decay, carry_decay)

    new_values = base_values - jnp.einsum("nbhgck,nbhgkv->nbhgcv", state_weights, entering_states)
    out = (entering_decay[..., None] * jnp.einsum("nbhck,nbhgkv->nbhgcv", q, entering_states)
           + jnp.einsum("nbhgij,nbhgjv->nbhgiv", attention, new_values))
    # [N, B, H, G, C, V] -> [B, N, C, H, G, V] -> [B, T, HV, V]
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(batch, num_chunks * chunk, num_v_heads, value_dim)
    return out[:, :seq_len], final_state.reshape(batch, num_v_heads, key_dim, value_dim)


def chunked_forward(q, k, v, g, beta, *, scale, initial_state, segment_ids, chunk_size):
    """Chunked gated delta rule; inputs assumed validated (see `gdn_jax.ops.api`).

    Returns (out [B, T, HV, V], final_state [B, HV, K, V]), both float32 (float64 if an
    input is float64).
    """
    run = jax.checkpoint(
        lambda *arrays: _chunked(*arrays, scale=scale, chunk_size=chunk_size),
        policy=jax.checkpoint_policies.save_only_these_names(_CHUNK_STATE))
    return run(q, k, v, g, beta, initial_state, segment_ids)
