"""Step-by-step gated delta rule: the oracle every faster path is tested against.

Per value head j (query/key head h = j // G, G = HV // H), state S in R^{K x V}, float32:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   alpha_t = exp(g_t)
        = alpha_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (alpha_t S_{t-1})^T k_t)
    o_t = S_t^T (scale * q_t)

    q, k [B, T, H, K]   v [B, T, HV, V]   g, beta [B, T, HV]   S [B, HV, K, V]   o [B, T, HV, V]

The decay is applied before the delta update (the error u_t is measured against the decayed
state). With `segment_ids` the state is reset to zero before every token t whose id differs
from token t-1's (a document boundary); the first document starts from `initial_state`.

This is a `lax.scan` over time. Its autodiff stores one state per token, so it is meant for
tests and short sequences only; inputs are assumed validated (see `gdn_jax.ops.api`).
"""

import jax
import jax.numpy as jnp

from mixer_core.delta_rule_math import compute_dtype, state_resets


def zero_state(shape, dtype, *like):
    """Zeros for the absent `initial_state`, typed like the inputs `like` inside `shard_map`.

    A scan carry must vary over the same mesh axes as the body's output, which varies over
    every axis any input does. `lax.full_like` gives zeros that vary over the axes of its
    example (outside `shard_map` they are plain zeros); the sum takes the union over inputs.
    """
    return sum(jax.lax.full_like(x, 0, dtype, shape) for x in like)


def recurrent_forward(q, k, v, g, beta, *, scale, initial_state, segment_ids):
    """Run the recurrence token by token.

    Returns (out [B, T, HV, V], final_state [B, HV, K, V]), both float32 (float64 if an
    input is float64).
    """
    batch, seq_len, num_heads, key_dim = q.shape
    num_v_heads, value_dim = v.shape[2], v.shape[3]
    group = num_v_heads // num_heads

    # Grouped value heads by reshaping v/g/beta to [.., H, G, ..]; q and k broadcast over G.
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    q = q.astype(dtype) * scale
    k = k.astype(dtype)
    v = v.astype(dtype).reshape(batch, seq_len, num_heads, group, value_dim)
    alpha = jnp.exp(g.astype(dtype)).reshape(batch, seq_len, num_heads, group)
    beta = beta.astype(dtype).reshape(batch, seq_len, num_heads, group)
    resets = state_resets(segment_ids, (batch, seq_len))

    if initial_state is None:
        state = zero_state((batch, num_heads, group, key_dim, value_dim), dtype,
                           q, k, v, alpha, beta)
    else:
        state = initial_state.astype(dtype).reshape(
            batch, num_heads, group, key_dim, value_dim)

    def step(state, inputs):
        q_t, k_t, v_t, alpha_t, beta_t, reset_t = inputs
        state = jnp.where(reset_t[:, None, None, None, None], 0.0, state)
        state = alpha_t[..., None, None] * state
        predicted = jnp.einsum("bhk,bhgkv->bhgv", k_t, state)
        update = beta_t[..., None] * (v_t - predicted)
        state = state + jnp.einsum("bhk,bhgv->bhgkv", k_t, update)
        out_t = jnp.einsum("bhk,bhgkv->bhgv", q_t, state)
        return state, out_t

    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, alpha, beta, resets)]
    state, out = jax.lax.scan(step, state, time_major)
    out = jnp.moveaxis(out, 0, 1).reshape(batch, seq_len, num_v_heads, value_dim)
    final_state = state.reshape(batch, num_v_heads, key_dim, value_dim)
    return out, final_state
