"""Pallas Mosaic GPU kernel for the backward of the intra-chunk WY preparation: what
`wy.prepare_backward` computes, one block per (chunk, value head, batch), with the inverse
T = (I + A)^{-1} formed in the kernel as `wy_kernel.prepare` forms it (one launch, no T in
memory).

Per chunk (local tokens i, j < C = 64; rows of `wy.chunk_rows` named as in `wy.ROWS`, beta for
beta_i = beta_j; dW, dU, dKw, dP the cotangents of W, U, Kw, P):

    Gamma, A, T as in `wy_kernel`      G = K K^T     S = Q K^T     P = scale S ⊙ Gamma
    W = (T diag(beta_e)) K     U = (T diag(beta)) V      recomputed as the forward forms them
    dR_K = T^T dW              dR_V = T^T dU
    dA   = -strict_lower(dR_K W^T + dR_V U^T)
    dV   = diag(beta) dR_V
    dbeta_e_i = <dR_K_i, k_i>     dbeta_j_i = <dR_V_i, v_i>     dkw_decay_i = <dKw_i, k_i>
    dbeta_i_i = sum_j (dA ⊙ G ⊙ Gamma)_ij
    E         = diag(beta) (dA ⊙ G ⊙ Gamma) + dP ⊙ P                       (= Gamma ⊙ dGamma)
    dgamma_i_i = sum_j E_ij       dgamma_j_j = -sum_i E_ij                the documents get 0
    dG   = diag(beta) dA ⊙ Gamma              dS = scale dP ⊙ Gamma
    dQ   = dS K
    dK   = dG K + dG^T K + dS^T Q + (T diag(beta_e))^T dW + diag(kw_decay) dKw

(the fourth term of dK is diag(beta_e) dR_K, taken as a product with the operand T diag(beta_e)
that W needs anyway: beta_e sits in shared memory in the column layout only). Products: 16-bit
operands (T, dU, the recomputed W and U, dR, dG, dS rounded as `wy.prepare_backward` rounds
them), float32 accumulation, 23 wgmmas per block (G, S, 10 for T, W, U, dR_K, dR_V, the direct
term, 2 for dA, dQ, 3 for dK); the C x C elementwise work and the row sums are float32.

    q, k [B, Tp, H, K]   v [B, Tp, HV, V] (16-bit; f32 only in interpret mode)
    rows [B, HV, N, R, C] float32 (R = len(wy.ROWS))
    cotangents dW, dKw [N, B, HV, C, K], dU [N, B, HV, C, V], dP [N, B, HV, C, C] (dU goes to
    the operand dtype in XLA, as `wy.prepare_backward` casts it)
    dq_more [B, Tp, H, K] in q's dtype or None: a cotangent of q from elsewhere (the chunk
    outputs'), added to dQ in float32 before the one rounding (group 1 only)
    -> dq, dk, dv in the layouts and dtypes of q, k, v; drows [B, HV, N, R, C] float32

Grouped heads (HV = group H > 1): value head hv reads q/k head hv // group and writes its own
partial dq, dk [B, Tp, HV, K] float32; XLA sums them over the group and casts. For group 1 the
kernel writes dq and dk in q's and k's dtype. dv and drows are written in their final layouts.
Shared memory is reused: W is staged in dKw's place, dR_K in dW's, dR_V in dU's, dS in dP's,
dG in the inversion's scratch, dV in V's; then for group 1 dk goes out from dR_K's place and dq
from dq_more's (or W's), for group > 1 dq from dk's float32 staging tile once dk has left it.
At K = V = 64 a block takes 101 KiB (109 with dq_more), so two blocks share an SM.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.gated_delta import wy, wy_kernel
from mixer_kernels.mosaic_gpu.gated_delta.common import (CHUNK, SMEM_BYTES, check_smem, head_sizes,
                                                           per_chunk, summed_over_group)
from mixer_kernels.mosaic_gpu.common import matmul, swizzled_smem


def smem_bytes(key_dim, value_dim, operand_dtype) -> int:
    """Shared memory of one block (inputs, cotangents, work tiles, output staging, barriers),
    counting the dq_more tile that only group 1 with dq_more allocates (an upper bound)."""
    c, op, rows = CHUNK, jnp.dtype(operand_dtype).itemsize, len(wy.ROWS) * CHUNK * 4
    inputs = (2 * key_dim + value_dim) * c * op + rows
    cotangents = (2 * key_dim + value_dim + c) * c * op
    work = (2 * c + value_dim) * c * op                     # inversion scratch (2), U
    staging = c * key_dim * 4 + rows                        # dk then dq, drows
    more = c * key_dim * op                                 # dq_more
    return inputs + cotangents + work + staging + more + 1024


def fits(key_dim, value_dim) -> bool:
    """Whether one block fits shared memory with 16-bit operands (float32 runs only in
    interpret mode, which has no such limit)."""
    return smem_bytes(key_dim, value_dim, jnp.bfloat16) <= SMEM_BYTES


def backward(q, k, v, rows, cotangents, dq_more=None, *, scale, interpret=None):
    """(dq, dk, dv, drows) as `wy.prepare_backward` returns them, dq plus dq_more where given;
    see the module docstring."""
    batch, num_heads, key_dim, num_v_heads, value_dim, group = head_sizes(k.shape, *v.shape[2:])
    if dq_more is not None and (group != 1 or dq_more.shape != q.shape
                                or dq_more.dtype != q.dtype):
        raise ValueError(f"dq_more: expected {q.shape} {q.dtype} with group 1, got "
                         f"{dq_more.shape} {dq_more.dtype} with group {group}")
    more = dq_more is not None
    num_chunks = rows.shape[2]
    op_dtype = k.dtype
    c = CHUNK
    shape = (c, c)
    check_smem("WY backward kernel", smem_bytes(key_dim, value_dim, jnp.bfloat16), key_dim,
               value_dim)
    row = {name: index for index, name in enumerate(wy.ROWS)}

    def kernel(q_ref, k_ref, v_ref, rows_ref, dw_ref, du_ref, dkw_ref, dp_ref, *refs):
        if more:
            dq_more_ref, *refs = refs
        (dq_ref, dk_ref, dv_ref, drows_ref, q_s, k_s, v_s, rows_s, dw_s, du_s, dkw_s, dp_s,
         x_s, m_s, u_s, dk_s, drows_s, loaded, *more_s) = refs
        chunk, head, b = (lax.axis_index(n) for n in ("c", "hv", "b"))
        tokens = pl.ds(chunk * c, c)
        for src, dst, barrier in (
                (q_ref.at[b, tokens, head // group], q_s, 0),
                (k_ref.at[b, tokens, head // group], k_s, 0),
                (v_ref.at[b, tokens, head], v_s, 0), (rows_ref.at[b, head, chunk], rows_s, 0),
                (dw_ref.at[chunk, b, head], dw_s, 1), (du_ref.at[chunk, b, head], du_s, 1),
                (dkw_ref.at[chunk, b, head], dkw_s, 1), (dp_ref.at[chunk, b, head], dp_s, 1)):
            plgpu.copy_gmem_to_smem(src, dst, loaded.at[barrier])
        if more:            # read last: behind the copies the kernel waits for first
            more_tile, more_loaded = more_s
            plgpu.copy_gmem_to_smem(dq_more_ref.at[b, tokens, head], more_tile, more_loaded)
        drows_s[...] = jnp.zeros(drows_s.shape, jnp.float32)     # the document rows stay 0
        plgpu.barrier_wait(loaded.at[0])

        along, i, j, decay = wy_kernel.chunk_tiles(rows_s, c)

        def store_row(name, vector):
            drows_s.at[row[name]][...] = vector

        gram_decay = matmul(k_s, k_s.T, shape) * decay                       # G ⊙ Gamma
        beta = along("beta_i", c)
        inverse = wy_kernel.unit_lower_inverse(jnp.where(i > j, beta * gram_decay, 0.0), i, j,
                                               x_s, m_s)

        x_s[...] = (inverse * along("beta_e", c)).astype(op_dtype)           # T diag(beta_e)
        m_s[...] = (inverse * along("beta_j", c)).astype(op_dtype)           # T diag(beta)
        plgpu.commit_smem()
        u_s[...] = matmul(m_s, v_s, (c, value_dim)).astype(op_dtype)
        plgpu.barrier_wait(loaded.at[1])
        # (c, K) and (c, V) float32 tiles hold 64 registers a thread each at 128: each is
        # formed where it is used and read again from shared memory rather than kept live
        loaded_f32 = lambda ref: ref[...].astype(jnp.float32)
        store_row("kw_decay", jnp.sum(loaded_f32(dkw_s) * loaded_f32(k_s), axis=1))
        dk_s[...] = (matmul(x_s.T, dw_s, (c, key_dim))
                     + loaded_f32(dkw_s) * along("kw_decay", key_dim))       # the direct terms
        dkw_s[...] = matmul(x_s, k_s, (c, key_dim)).astype(op_dtype)        # W, in dKw's place
        x_s[...] = inverse.astype(op_dtype)
        plgpu.commit_smem()

        d_rhs_k = matmul(x_s.T, dw_s, (c, key_dim))
        store_row("beta_e", jnp.sum(d_rhs_k * loaded_f32(k_s), axis=1))
        dw_s[...] = d_rhs_k.astype(op_dtype)
        d_rhs_v = matmul(x_s.T, du_s, (c, value_dim))
        store_row("beta_j", jnp.sum(d_rhs_v * loaded_f32(v_s), axis=1))
        du_s[...] = d_rhs_v.astype(op_dtype)
        v_s[...] = (along("beta_i", value_dim) * d_rhs_v).astype(v_s.dtype)   # dV, in V's place
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(v_s, dv_ref.at[b, tokens, head])

        d_a = jnp.where(i > j, -(matmul(dw_s, dkw_s.T, shape) + matmul(du_s, u_s.T, shape)), 0.0)
        d_p = dp_s[...].astype(jnp.float32)
        d_a_gram = d_a * gram_decay
        through_decay = beta * d_a_gram + d_p * (scale * matmul(q_s, k_s.T, shape) * decay)
        store_row("beta_i", jnp.sum(d_a_gram, axis=1))
        store_row("gamma_i", jnp.sum(through_decay, axis=1))
        store_row("gamma_j", -jnp.sum(through_decay, axis=0))
        m_s[...] = (beta * d_a * decay).astype(op_dtype)                     # dG
        dp_s[...] = (scale * d_p * decay).astype(op_dtype)                   # dS
        plgpu.commit_smem()

        d_k = (dk_s[...] + matmul(m_s, k_s, (c, key_dim)) + matmul(m_s.T, k_s, (c, key_dim))
               + matmul(dp_s.T, q_s, (c, key_dim)))
        if group == 1:      # dR_K and W were last read by dA: dk, dq go out in 16 bits
            dw_s[...] = d_k.astype(dw_s.dtype)
            dk_tile = dw_s
        else:
            dk_s[...] = d_k
            dk_tile = dk_s
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dk_tile, dk_ref.at[b, tokens, head])
        plgpu.copy_smem_to_gmem(drows_s, drows_ref.at[b, head, chunk])
        d_q = matmul(dp_s, k_s, (c, key_dim))
        if group == 1:
            dq_tile = more_tile if more else dkw_s
            if more:
                plgpu.barrier_wait(more_loaded)
                d_q = d_q + dq_tile[...].astype(jnp.float32)
            dq_tile[...] = d_q.astype(dq_tile.dtype)
        else:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # dk has left its staging tile
            dk_s[...] = d_q                                  # dq, in dk's place
            dq_tile = dk_s
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dq_tile, dq_ref.at[b, tokens, head])
        plgpu.wait_smem_to_gmem(0)

    partial = jax.ShapeDtypeStruct((batch, k.shape[1], num_v_heads, key_dim),
                                   op_dtype if group == 1 else jnp.float32)
    out_type = (partial, partial, jax.ShapeDtypeStruct(v.shape, v.dtype),
                jax.ShapeDtypeStruct(rows.shape, jnp.float32))
    row_tile = plgpu.SMEM((len(wy.ROWS), c), jnp.float32)
    scratch = (swizzled_smem((c, key_dim), op_dtype),         # Q
               swizzled_smem((c, key_dim), op_dtype),         # K
               swizzled_smem((c, value_dim), op_dtype),       # V, then dV
               row_tile,                                      # rows
               swizzled_smem((c, key_dim), op_dtype),         # dW, then dR_K
               swizzled_smem((c, value_dim), op_dtype),       # dU, then dR_V
               swizzled_smem((c, key_dim), op_dtype),         # dKw, then W
               swizzled_smem(shape, op_dtype),                # dP, then dS
               swizzled_smem(shape, op_dtype),                # X, T diag(beta_e), T
               swizzled_smem(shape, op_dtype),                # A ⊙ M_s, T diag(beta), dG
               swizzled_smem((c, value_dim), op_dtype),       # U
               swizzled_smem((c, key_dim), jnp.float32),      # dk, then dq (group > 1)
               row_tile,                                      # drows
               plgpu.Barrier(num_arrivals=4, num_barriers=2))
    if more:
        scratch += (swizzled_smem((c, key_dim), op_dtype),     # dq_more, then dq
                    plgpu.Barrier(num_arrivals=1))
    d_q, d_k, d_v, d_rows = per_chunk(kernel, "delta_rule_wy_backward", out_type, scratch,
                                      (num_chunks, num_v_heads, batch), interpret)(
        q, k, v, rows, *(x.astype(op_dtype) for x in cotangents), *([dq_more] if more else []))
    return summed_over_group(d_q, q), summed_over_group(d_k, k), d_v, d_rows
