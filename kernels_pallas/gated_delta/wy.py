"""Intra-chunk WY preparation: the per-token rows the kernel reads (`chunk_rows`) and the XLA
version of the kernel's math (`prepare_reference`: the test oracle and, given the kernel's
inverse, the function the backward pass differentiates).

Per value head and chunk (local tokens i, j; gamma = within-chunk cumsum of g):

    Gamma_ij = exp(gamma_i - gamma_j)   i >= j, same document; else 0
    e_i      = exp(gamma_i)             0 once a document starts in the chunk at or before i
    d_j      = Gamma_{C-1, j}           write decay of token j into the next chunk's state
    A_ij     = beta_i (k_i . k_j) Gamma_ij  (i > j)
    [W | U]  = (I + A)^{-1} [diag(beta e) K | diag(beta) V]
    P        = scale (Q K^T) ⊙ Gamma    Kw = diag(d) K       rho = e_{C-1}

    rows [B, HV, N, R, C] float32, R = ROWS: gamma, beta, beta*e, d, document number within
    the chunk (0 for the document the chunk enters with, as a float); gamma, beta and the
    document come twice, one copy per tile axis the kernel reads them along (Mosaic GPU's
    layout inference hangs on one SMEM row loaded in two layouts)

`wy_solve` has its own VJP: with X = (I + A)^{-1} R, dR = (I + A)^{-T} dX and
dA = -tril_strict(dR X^T), two batched matmuls per chunk instead of differentiating through
the levels of the block inversion (`gdn_jax.ops.chunk.unit_lower_inverse`);
`solve_with_inverse` is the same with the inverse given (the kernel's), so nothing is inverted
twice.
"""

import jax
import jax.numpy as jnp

from gdn_jax.ops.chunk import unit_lower_inverse
from gdn_jax.ops.naive import state_resets

ROWS = ("gamma_i", "gamma_j", "beta_i", "beta_j", "beta_e", "kw_decay", "document_i", "document_j")


def _solve_bwd(inverse, solved, d_solved):
    d_rhs = jnp.matmul(jnp.swapaxes(inverse, -1, -2), d_solved)
    chunk = inverse.shape[-1]
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
    d_a = jnp.where(strictly_lower, -jnp.matmul(d_rhs, jnp.swapaxes(solved, -1, -2)), 0.0)
    return d_a, d_rhs


@jax.custom_vjp
def wy_solve(strictly_lower, right_hand_side):
    """(I + A)^{-1} R for strictly lower-triangular A [..., C, C] and R [..., C, D]."""
    return jnp.matmul(unit_lower_inverse(strictly_lower), right_hand_side)


def _wy_solve_fwd(strictly_lower, right_hand_side):
    inverse = unit_lower_inverse(strictly_lower)
    solved = jnp.matmul(inverse, right_hand_side)
    return solved, (inverse, solved)


wy_solve.defvjp(_wy_solve_fwd, lambda residuals, d_solved: _solve_bwd(*residuals, d_solved))


@jax.custom_vjp
def solve_with_inverse(inverse, strictly_lower, right_hand_side):
    """inverse @ R where inverse = (I + A)^{-1} is given; differentiable in A and R only."""
    return jnp.matmul(inverse, right_hand_side)


def _with_inverse_fwd(inverse, strictly_lower, right_hand_side):
    solved = jnp.matmul(inverse, right_hand_side)
    return solved, (inverse, solved)


def _with_inverse_bwd(residuals, d_solved):
    inverse, solved = residuals
    return (jnp.zeros_like(inverse), *_solve_bwd(inverse, solved, d_solved))


solve_with_inverse.defvjp(_with_inverse_fwd, _with_inverse_bwd)


def chunk_rows(g, beta, segment_ids, num_chunks, chunk):
    """g, beta [B, Tp, HV] (Tp = N C, padded with zeros) -> rows [B, HV, N, R, C] float32 and
    e [N, B, HV, C] (see the module docstring); segment_ids [B, T] or None."""
    batch, padded_len, num_v_heads = g.shape
    gamma = jnp.cumsum(g.astype(jnp.float32).reshape(batch, num_chunks, chunk, num_v_heads), axis=2)
    beta = beta.astype(jnp.float32).reshape(gamma.shape)
    if segment_ids is None:
        document = jnp.zeros((batch, num_chunks, chunk, 1), jnp.float32)
    else:
        resets = state_resets(segment_ids, segment_ids.shape)
        resets = jnp.pad(resets, [(0, 0), (0, padded_len - resets.shape[1])])  # padding continues
        resets = resets.reshape(batch, num_chunks, chunk).astype(jnp.int32)
        document = jnp.cumsum(resets, axis=2)[..., None].astype(jnp.float32)
    entering_decay = jnp.exp(jnp.where(document == 0, gamma, -jnp.inf))
    kw_decay = jnp.exp(jnp.where(document == document[:, :, -1:], gamma[:, :, -1:] - gamma,
                                 -jnp.inf))
    document = jnp.broadcast_to(document, gamma.shape)
    rows = jnp.stack([gamma, gamma, beta, beta, beta * entering_decay, kw_decay, document, document],
                     axis=-1)
    rows = rows.transpose(0, 3, 1, 4, 2)                      # [B, HV, N, R, C]
    return rows, entering_decay.transpose(1, 0, 3, 2)


def prepare_reference(q, k, v, rows, *, scale, inverse=None):
    """XLA version of `wy_kernel.prepare`: (W, U, Kw, P, T) chunk-major, float32.

    q, k [B, Tp, H, K]; v [B, Tp, HV, V]; rows [B, HV, N, R, C]; `inverse` [N, B, HV, C, C]
    given (the kernel's T) or None (computed here).
    """
    batch, _, num_heads, key_dim = k.shape
    num_v_heads, num_chunks, chunk = rows.shape[1], rows.shape[2], rows.shape[4]
    group = num_v_heads // num_heads

    def chunk_major(x, heads):        # [B, Tp, heads, D] -> [N, B, HV, C, D] float32
        x = x.astype(jnp.float32).reshape(batch, num_chunks, chunk, heads, x.shape[-1])
        return jnp.repeat(x.transpose(1, 0, 3, 2, 4), num_v_heads // heads, axis=2)

    q, k, v = chunk_major(q, num_heads), chunk_major(k, num_heads), chunk_major(v, num_v_heads)
    row = dict(zip(ROWS, jnp.moveaxis(rows.transpose(2, 0, 1, 3, 4), 3, 0)))   # [N, B, HV, C]
    lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
    pairs = lower & (row["document_i"][..., :, None] == row["document_j"][..., None, :])
    decay = jnp.exp(jnp.where(pairs, row["gamma_i"][..., :, None] - row["gamma_j"][..., None, :],
                              -jnp.inf))
    key_gram = jnp.einsum("nbhik,nbhjk->nbhij", k, k)
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
    a = jnp.where(strictly_lower, row["beta_i"][..., :, None] * key_gram * decay, 0.0)
    rhs = jnp.concatenate([row["beta_e"][..., None] * k, row["beta_j"][..., None] * v], axis=-1)
    if inverse is None:
        inverse = jax.lax.stop_gradient(unit_lower_inverse(a))
        solved = wy_solve(a, rhs)
    else:
        solved = solve_with_inverse(inverse, a, rhs)
    attention = scale * jnp.einsum("nbhik,nbhjk->nbhij", q, k) * decay
    return (solved[..., :key_dim], solved[..., key_dim:], row["kw_decay"][..., None] * k, attention,
            inverse)
