"""Intra-chunk WY preparation for the state kernels (XLA, batched over all chunks).

Per value head and chunk (local tokens i, j; gamma = within-chunk cumsum of g):

    Gamma_ij = exp(gamma_i - gamma_j)   i >= j, same document; else 0
    e_i      = exp(gamma_i)             0 once a document starts in the chunk at or before i
    A_ij     = beta_i (k_i . k_j) Gamma_ij  (i > j)
    [W | U]  = (I + A)^{-1} [diag(beta e) K | diag(beta) V]          (`wy_solve`)
    P        = (Q K^T) ⊙ Gamma          intra-chunk attention (Q already scaled)
    Kw       = diag(Gamma_{C,:}) K      rho = e_C

    q, k [N, B, H, C, K]   v [N, B, H, G, C, V]   g, beta [N, B, H, G, C]  (chunk-major)

`wy_solve` has its own VJP: with X = (I + A)^{-1} R, dR = (I + A)^{-T} dX and
dA = -tril_strict(dR X^T), two batched matmuls per chunk instead of differentiating through
the levels of the block inversion (`gdn_jax.ops.chunk.unit_lower_inverse`).
"""

import jax
import jax.numpy as jnp

from gdn_jax.ops.chunk import unit_lower_inverse


@jax.custom_vjp
def wy_solve(strictly_lower, right_hand_side):
    """(I + A)^{-1} R for strictly lower-triangular A [..., C, C] and R [..., C, D]."""
    return jnp.matmul(unit_lower_inverse(strictly_lower), right_hand_side)


def _wy_solve_fwd(strictly_lower, right_hand_side):
    inverse = unit_lower_inverse(strictly_lower)
    solved = jnp.matmul(inverse, right_hand_side)
    return solved, (inverse, solved)


def _wy_solve_bwd(residuals, d_solved):
    inverse, solved = residuals
    d_rhs = jnp.matmul(jnp.swapaxes(inverse, -1, -2), d_solved)
    chunk = inverse.shape[-1]
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
    d_a = jnp.where(strictly_lower, -jnp.matmul(d_rhs, jnp.swapaxes(solved, -1, -2)), 0.0)
    return d_a, d_rhs


wy_solve.defvjp(_wy_solve_fwd, _wy_solve_bwd)


def prepare_chunks(q, k, v, g, beta, same_document, sees_entering_state):
    """Everything that does not depend on the entering states.

    Returns (e [N, B, H, G, C], W [.., C, K], U [.., C, V], P [.., C, C], Kw [.., C, K],
    rho [N, B, H, G]), all in the compute dtype.
    """
    chunk, key_dim = k.shape[-2], k.shape[-1]
    gamma = jnp.cumsum(g, axis=-1)
    lower_inclusive = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
    pair_mask = lower_inclusive if same_document is None else lower_inclusive & same_document
    pair_decay = jnp.exp(jnp.where(pair_mask, gamma[..., :, None] - gamma[..., None, :], -jnp.inf))
    entering_decay = jnp.exp(gamma if sees_entering_state is None
                             else jnp.where(sees_entering_state, gamma, -jnp.inf))

    key_gram = jnp.einsum("nbhik,nbhjk->nbhij", k, k)[:, :, :, None]
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
    coupling = jnp.where(strictly_lower, beta[..., :, None] * key_gram * pair_decay, 0.0)
    right_hand_side = jnp.concatenate(
        [(beta * entering_decay)[..., None] * k[:, :, :, None], beta[..., None] * v], axis=-1)
    solved = wy_solve(coupling, right_hand_side)
    state_weights, base_values = solved[..., :key_dim], solved[..., key_dim:]

    attention = jnp.einsum("nbhik,nbhjk->nbhij", q, k)[:, :, :, None] * pair_decay
    weighted_keys = pair_decay[..., -1, :, None] * k[:, :, :, None]
    return (entering_decay, state_weights, base_values, attention, weighted_keys,
            entering_decay[..., -1])
