"""Intra-chunk WY preparation: the per-token rows the kernel reads (`chunk_rows`), the XLA
version of the kernel's math (`prepare_reference`, the test oracle) and its hand-written
backward given the kernel's inverse (`prepare_backward`).

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
the levels of the block inversion (`mixer_core.delta_rule_math.unit_lower_inverse`);
`solve_with_inverse` is the same with the inverse given (the kernel's), so nothing is inverted
twice.
"""

import jax
import jax.numpy as jnp

from mixer_core.delta_rule_math import pair_decay_matrix, state_resets, unit_lower_inverse

ROWS = ("gamma_i", "gamma_j", "beta_i", "beta_j", "beta_e", "kw_decay", "document_i", "document_j")


def _solve_bwd(inverse, solved, d_solved):
    """(dA, dR) float32 for X = (I + A)^{-1} R; the products take operands in the dtypes given
    (dR enters the second one in the dtype of `solved`) and accumulate in float32."""
    d_rhs = jnp.einsum("...ji,...jd->...id", inverse, d_solved,
                       preferred_element_type=jnp.float32)
    chunk = inverse.shape[-1]
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
    d_a = -jnp.einsum("...id,...jd->...ij", d_rhs.astype(solved.dtype), solved,
                      preferred_element_type=jnp.float32)
    return jnp.where(strictly_lower, d_a, 0.0), d_rhs


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


def _pair_decay(row):
    """Gamma [..., C, C] from the rows (a dict of [..., C] by the names in ROWS)."""
    same_document = row["document_i"][..., :, None] == row["document_j"][..., None, :]
    return pair_decay_matrix(row["gamma_i"], row["gamma_j"], same_document)


def prepare_reference(q, k, v, rows, *, scale, inverse=None):
    """XLA version of `wy_kernel.prepare`: (W, U, Kw, P, T) chunk-major, float32.

    q, k [B, Tp, H, K]; v [B, Tp, HV, V]; rows [B, HV, N, R, C]; `inverse` [N, B, HV, C, C]
    given (the kernel's T) or None (computed here).
    """
    batch, _, num_heads, key_dim = k.shape
    num_v_heads, num_chunks, chunk = rows.shape[1], rows.shape[2], rows.shape[4]

    def chunk_major(x, heads):        # [B, Tp, heads, D] -> [N, B, HV, C, D] float32
        x = x.astype(jnp.float32).reshape(batch, num_chunks, chunk, heads, x.shape[-1])
        return jnp.repeat(x.transpose(1, 0, 3, 2, 4), num_v_heads // heads, axis=2)

    q, k, v = chunk_major(q, num_heads), chunk_major(k, num_heads), chunk_major(v, num_v_heads)
    row = dict(zip(ROWS, jnp.moveaxis(rows.transpose(2, 0, 1, 3, 4), 3, 0)))   # [N, B, HV, C]
    decay = _pair_decay(row)
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


def _matmul(spec, x, y, dtype):
    """einsum of x and y as `dtype` operands, accumulated in float32."""
    return jnp.einsum(spec, x.astype(dtype), y.astype(dtype), preferred_element_type=jnp.float32)


def _to_chunks(x, num_chunks, dtype):
    """[B, Tp, heads, D] -> [N, B, heads, C, D] in `dtype`."""
    batch, padded_len, heads, dim = x.shape
    x = x.astype(dtype).reshape(batch, num_chunks, padded_len // num_chunks, heads, dim)
    return x.transpose(1, 0, 3, 2, 4)


def _from_chunks(x, dtype):
    """[N, B, heads, C, D] -> [B, N C, heads, D] in `dtype`."""
    num_chunks, batch, heads, chunk, dim = x.shape
    return x.astype(dtype).transpose(1, 0, 3, 2, 4).reshape(batch, num_chunks * chunk, heads, dim)


def _through_solve(inverse, row, keys, values, d_w, d_u, operand):
    """(dA, dR_K, dR_V) float32 of [W | U] = T [diag(beta_e) K | diag(beta_j) V] by
    `_solve_bwd` on each block, W and U recomputed as the kernel forms them. inverse, d_w, d_u
    [N, B, H, group, C, C | K | V], `row` a dict of [N, B, H, group, C] by the names in ROWS,
    keys [N, B, H, C, K], values [N, B, H, group, C, V]; `operand` the products' operand dtype."""
    w = _matmul("nbhgij,nbhjk->nbhgik", inverse * row["beta_e"][..., None, :], keys, operand)
    u = _matmul("nbhgij,nbhgjv->nbhgiv", inverse * row["beta_j"][..., None, :], values, operand)
    t = inverse.astype(operand)
    d_a_w, d_rhs_k = _solve_bwd(t, w.astype(operand), d_w.astype(operand))
    d_a_u, d_rhs_v = _solve_bwd(t, u.astype(operand), d_u.astype(operand))
    return d_a_w + d_a_u, d_rhs_k, d_rhs_v


def prepare_backward(q, k, v, rows, inverse, cotangents, *, scale):
    """Gradients of `prepare_reference`'s (W, U, Kw, P) with the inverse T = (I + A)^{-1}
    given (the kernel's), written out. Per value head and chunk, with G = K K^T, S = Q K^T,
    dW, dU, dKw, dP the cotangents and the rows named as in ROWS:

        W = (T diag(beta_e)) K   U = (T diag(beta_j)) V     recomputed as the kernel forms them
        dR_K = T^T dW            dR_V = T^T dU              (`_solve_bwd`, one call per block)
        dA   = -strict_lower(dR_K W^T + dR_V U^T)
        dV   = diag(beta_j) dR_V
        dbeta_e_i  = <dR_K_i, k_i>      dbeta_j_i = <dR_V_i, v_i>     dkw_decay_i = <dKw_i, k_i>
        dbeta_i_i  = sum_j (dA ⊙ G ⊙ Gamma)_ij
        E          = Gamma ⊙ dGamma = diag(beta_i) (dA ⊙ G ⊙ Gamma) + dP ⊙ P
        dgamma_i_i = sum_j E_ij         dgamma_j_j = -sum_i E_ij
        dG   = diag(beta_i) dA ⊙ Gamma          dS = scale dP ⊙ Gamma
        dQ   = dS K      dK = (dG + dG^T) K + dS^T Q + diag(beta_e) dR_K + diag(kw_decay) dKw

    the documents get zero. A q/k head serves the group = HV // H value heads hv with
    hv // group = h: G and S are formed once per q/k head, dG, dS and the last two terms of dK
    are summed over the group before the products.

    q, k [B, Tp, H, K]; v [B, Tp, HV, V]; rows [B, HV, N, R, C] float32; inverse [N, B, HV, C, C]
    float32; cotangents (dW, dU, dKw, dP) chunk-major [N, B, HV, C, K | V | K | C] ->
    (dq, dk, dv) in the layouts and dtypes of q, k, v and drows [B, HV, N, R, C] float32.
    The matrix products take q's dtype as operands when it is 16-bit (float32 otherwise) and
    accumulate in float32; the C x C elementwise work is float32. q, k, v go chunk-major and
    dq, dk, dv back with one transpose each.
    """
    batch, _, num_heads, _ = k.shape
    num_v_heads, num_chunks, num_rows, chunk = rows.shape[1:]
    group = num_v_heads // num_heads
    operand = q.dtype if q.dtype in (jnp.bfloat16, jnp.float16) else jnp.dtype(jnp.float32)

    def grouped(x):                   # [N, B, HV, ...] -> [N, B, H, group, ...]
        return x.reshape(*x.shape[:2], num_heads, group, *x.shape[3:])

    q_c, k_c = _to_chunks(q, num_chunks, operand), _to_chunks(k, num_chunks, operand)
    v_c = grouped(_to_chunks(v, num_chunks, operand))
    row = dict(zip(ROWS, rows.reshape(batch, num_heads, group, num_chunks, num_rows, chunk)
                   .transpose(4, 3, 0, 1, 2, 5)))                  # [N, B, H, group, C] each
    d_w, d_u, d_kw, d_p = (grouped(c) for c in cotangents)
    d_kw, d_p = d_kw.astype(jnp.float32), d_p.astype(jnp.float32)
    decay = _pair_decay(row)
    d_a, d_rhs_k, d_rhs_v = _through_solve(grouped(inverse), row, k_c, v_c, d_w, d_u, operand)

    # through A = strict_lower(diag(beta_i) G ⊙ Gamma) and P = scale S ⊙ Gamma
    key_gram = _matmul("nbhik,nbhjk->nbhij", k_c, k_c, operand)[:, :, :, None]
    attention = scale * _matmul("nbhik,nbhjk->nbhij", q_c, k_c, operand)[:, :, :, None] * decay
    d_a_gram = d_a * key_gram * decay
    through_decay = row["beta_i"][..., :, None] * d_a_gram + d_p * attention   # Gamma ⊙ dGamma
    keys, values = k_c.astype(jnp.float32)[:, :, :, None], v_c.astype(jnp.float32)
    grads = dict(gamma_i=jnp.sum(through_decay, -1), gamma_j=-jnp.sum(through_decay, -2),
                 beta_i=jnp.sum(d_a_gram, -1), beta_j=jnp.sum(d_rhs_v * values, -1),
                 beta_e=jnp.sum(d_rhs_k * keys, -1), kw_decay=jnp.sum(d_kw * keys, -1))
    zero = jnp.zeros_like(grads["gamma_i"])
    d_rows = jnp.stack([grads.get(name, zero) for name in ROWS])     # [R, N, B, H, group, C]
    d_rows = d_rows.transpose(2, 3, 4, 1, 0, 5).reshape(rows.shape)

    d_gram = jnp.sum(row["beta_i"][..., :, None] * d_a * decay, axis=3)      # over the group
    d_scores = scale * jnp.sum(d_p * decay, axis=3)
    d_q = _matmul("nbhij,nbhjk->nbhik", d_scores, k_c, operand)
    d_k = (_matmul("nbhij,nbhjk->nbhik", d_gram + jnp.swapaxes(d_gram, -1, -2), k_c, operand)
           + _matmul("nbhji,nbhjk->nbhik", d_scores, q_c, operand)
           + jnp.sum(row["beta_e"][..., None] * d_rhs_k + row["kw_decay"][..., None] * d_kw, 3))
    d_v = (row["beta_j"][..., None] * d_rhs_v).reshape(cotangents[1].shape)
    return (_from_chunks(d_q, q.dtype), _from_chunks(d_k, k.dtype), _from_chunks(d_v, v.dtype),
            d_rows)
