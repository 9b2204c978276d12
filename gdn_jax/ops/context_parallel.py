"""Context-parallel gated delta rule: the time axis split over a mesh axis inside `shard_map`.

Device d of n (along `axis_name`) holds tokens [d L, (d + 1) L). Every local token map is
affine in the state, so the device's whole stretch is affine in its entering state S_d:

    S_t = P_t S_d + Z_t          P_t = A_t ... A_1  [K, K] (local transitions),
                                  Z_t = the local run started from zero          [K, V]
    o_t = Z_t^T (scale q_t) + S_d^T Qhat_t,          Qhat_t = P_t^T (scale q_t)  [K]

One call of the single-device op on the widened values [v | 0_K] with the initial state
[0 | I_K] ([K, V + K]) yields both parts: its outputs are [o^0 | Qhat] and its final state is
[b_d | M_d] = [Z_L | P_L]. The entering states follow from the device maps F_d(S) = M_d S + b_d:

    S_0 = initial_state (zeros if None),   S_{d+1} = F_d(S_d)

an exclusive scan over the axis. Device 0 folds S_0 into its map (M_0 = 0, b_0 = F_0(S_0)),
then ceil(log2 n) rounds of `ppermute` compose maps Hillis-Steele style,
(M2, b2) o (M1, b1) = (M2 M1, M2 b1 + b2), after which b_d is the state leaving device d;
one more shift by one gives S_d. Finally o_t = o^0_t + S_d^T Qhat_t.

Packed documents: the op itself resets inside the device (P_t = 0 after a local document start).
A document that starts exactly at the device's first token zeroes S_d (the previous device's last
segment id arrives with one `ppermute`).

Cost per device (B batch, HV value heads, L = T / n local tokens):
  compute   the local chunked op on V + K value columns instead of V ((V + K) / V times the
            single-device work on L tokens, 2x when K = V) plus log2(n) batched K x K x (K + V)
            matmuls
  memory    the op's own O(L * chunk) activations on the widened values + the [B, HV, K, K + V]
            maps; no device ever holds another device's tokens
  traffic   ceil(log2 n) + 1 messages of B * HV * K * (K + V) float32, independent of T
Gradients flow through `ppermute` (its transpose is the reverse shift), so `jax.grad` of a
`shard_map`ped call is the gradient of the unsplit computation.

Shapes (local to a device): q, k [B, L, H, K]; v [B, L, HV, V]; g, beta [B, L, HV];
initial_state [B, HV, K, V] (the same on every device); segment_ids [B, L] int.
"""

import jax
import jax.numpy as jnp

from gdn_jax.ops.api import gated_delta_rule
from gdn_jax.ops.naive import zero_state
from mixer_core.shard import bound_axis_size

_FULL_FLOAT32 = jax.lax.Precision.HIGHEST


def shift_along_axis(x, axis_name, offset, size):
    """Device d receives x from device d - offset; devices d < offset receive zeros."""
    return jax.lax.ppermute(x, axis_name, [(i, i + offset) for i in range(size - offset)])


def _compose(later, earlier):
    """(M2, b2) o (M1, b1) = (M2 M1, M2 b1 + b2) for maps [B, HV, K, K] and [B, HV, K, V]."""
    transition, offset = later
    first_transition, first_offset = earlier
    mat = lambda a, b: jnp.einsum("bhij,bhjv->bhiv", a, b, precision=_FULL_FLOAT32)
    return mat(transition, first_transition), mat(transition, first_offset) + offset


def entering_states(transition, offset, initial_state, axis_name, size):
    """States entering each device, and the state after the last device (on every device).

    transition [B, HV, K, K], offset [B, HV, K, V]: this device's map S -> M S + b.
    """
    index = jax.lax.axis_index(axis_name)
    first = index == 0
    offset = jnp.where(first, _compose((transition, offset),
                                       (jnp.zeros_like(transition), initial_state))[1], offset)
    transition = jnp.where(first, 0.0, transition)
    step = 1
    while step < size:
        received = (shift_along_axis(transition, axis_name, step, size),
                    shift_along_axis(offset, axis_name, step, size))
        composed = _compose((transition, offset), received)
        transition, offset = (jnp.where(index >= step, new, old)
                              for new, old in zip(composed, (transition, offset)))
        step *= 2
    entering = jnp.where(first, initial_state, shift_along_axis(offset, axis_name, 1, size))
    final = jax.lax.psum(jnp.where(index == size - 1, offset, 0.0), axis_name)
    return entering, final


def _starts_new_document(segment_ids, axis_name, size):
    """[B] bool: this device's first token starts a document (never on device 0)."""
    previous_last = shift_along_axis(segment_ids[:, -1], axis_name, 1, size)
    return (jax.lax.axis_index(axis_name) > 0) & (segment_ids[:, 0] != previous_last)


def context_parallel_gated_delta_rule(q, k, v, g, beta, *, axis_name, scale=None,
                                      initial_state=None, output_final_state=False,
                                      segment_ids=None, chunk_size=64, implementation=None):
    """`gdn_jax.gated_delta_rule` with T split over mesh axis `axis_name` (call in shard_map).

    Arguments are this device's slice of the time axis (device d holds the d-th of n equal
    slices, in axis order); `initial_state` is the state before the first token of device 0,
    replicated over the axis. Returns (out [B, L, HV, V] in v's dtype, final_state
    [B, HV, K, V] float32 after the last token of the last device, on every device, or None).
    The math, memory and communication are in the module docstring.
    """
    size = bound_axis_size(axis_name)
    batch, _, _, key_dim = q.shape
    num_v_heads, value_dim = v.shape[2], v.shape[3]
    # The local op validates shapes; widen the values by K zero columns (float32).
    state_shape = (batch, num_v_heads, key_dim, key_dim + value_dim)
    varying_zero = zero_state(state_shape, jnp.float32, q, k, v, g, beta)
    identity = jnp.broadcast_to(jnp.eye(key_dim, dtype=jnp.float32), state_shape[:-1] + (key_dim,))
    widened_state = varying_zero.at[..., value_dim:].add(identity)
    widened_values = jnp.concatenate(
        [v.astype(jnp.float32), jnp.zeros(v.shape[:-1] + (key_dim,), jnp.float32)], axis=-1)
    local_out, local_final = gated_delta_rule(
        q, k, widened_values, g, beta, scale=scale, initial_state=widened_state,
        output_final_state=True, segment_ids=segment_ids, chunk_size=chunk_size,
        implementation=implementation)
    zero_start_out, queries_back = local_out[..., :value_dim], local_out[..., value_dim:]
    offset, transition = local_final[..., :value_dim], local_final[..., value_dim:]

    if segment_ids is not None:
        keep = ~_starts_new_document(segment_ids, axis_name, size)
        transition = jnp.where(keep[:, None, None, None], transition, 0.0)
    if initial_state is None:
        initial = varying_zero[..., :value_dim]
    else:
        expected = (batch, num_v_heads, key_dim, value_dim)
        if getattr(initial_state, "shape", None) != expected:
            raise ValueError(f"initial_state: expected shape {expected} [B, HV, K, V], got "
                             f"{getattr(initial_state, 'shape', type(initial_state).__name__)}")
        initial = initial_state.astype(jnp.float32) + varying_zero[..., :value_dim]
    entering, final = entering_states(transition, offset, initial, axis_name, size)
    if segment_ids is not None:
        entering = jnp.where(keep[:, None, None, None], entering, 0.0)

    out = zero_start_out + jnp.einsum("blhk,bhkv->blhv", queries_back, entering,
                                      precision=_FULL_FLOAT32)
    return out.astype(v.dtype), (final if output_final_state else None)
