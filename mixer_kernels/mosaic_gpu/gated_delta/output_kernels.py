"""Pallas Mosaic GPU kernels for the chunk outputs of the gated delta rule and their backward,
one block per (chunk, value head, batch); the chunks are independent (the entering states come
from `state_kernels.forward_states`).

Forward, per chunk (C = 64 tokens; e the decay since the chunk's start, scale the query scale):

    N_c = U_c - W_c S_c                          the new values           [C, V]
    O_c = scale diag(e) Q_c S_c + P_c N_c                                  [C, V]

Backward, from dO_c (D = scale diag(e) dO_c):

    dN  = P_c^T dO_c         dU = dN              dP = dO_c N_c^T
    dQ  = D S_c^T            dW = -dN S_c^T       dS = Q_c^T D - W_c^T dN
    de_i = scale <dO_c,i , (Q_c S_c)_i>

Products: 16-bit operands (S, N, dO, D, dN rounded to the operand dtype, as fla's output
kernels round them), float32 accumulation; 3 wgmmas forward, 8 backward. S arrives in the
operand dtype (XLA rounds the float32 states in one pass), U in float32.

    q [B, Tp, H, K] (16-bit; f32 only in interpret mode)   states [N, B, HV, K, V] (q's dtype)
    W [N, B, HV, C, K], P [N, B, HV, C, C] (q's dtype)     U [N, B, HV, C, V] float32
    e [N, B, HV, 1, C] float32                             dO [B, Tp, HV, V] (q's dtype)
    -> O [B, Tp, HV, V] float32
    -> dq [B, Tp, HV, K] in q's dtype for group 1, else float32 per value head (summed over
       the group in XLA),
       dS [N, B, HV, K, V] float32, dW [N, B, HV, C, K] (q's dtype), dU [N, B, HV, C, V]
       float32, dP [N, B, HV, C, C] (q's dtype), de [N, B, HV, 1, C] float32

Value head hv reads q head hv // (HV // H). Shared memory is reused: O is staged in U's
place and, for K = V, N in W's (two blocks per SM at K = V = 128); in the backward dP in P's, dU in U's, D in dO's and, for K = V, dq in U's (once dU has
left) and dW in N's; for group 1 dq goes out in q's dtype from Q's place once dS is formed.
Then a block needs 49 / 90 KiB (forward / backward) at K = V = 64 and
105 / 218 KiB at K = V = 128 (bf16).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.gated_delta.common import (CHUNK, SMEM_BYTES, check_smem, head_sizes,
                                                           per_chunk)
from mixer_kernels.mosaic_gpu.common import matmul, matmul_groups, swizzled_smem


def smem_bytes(key_dim, value_dim, operand_dtype, backward: bool) -> int:
    """Shared memory of one block (inputs, work tiles, output staging, barriers; the reuse of
    the module docstring)."""
    c, op = CHUNK, jnp.dtype(operand_dtype).itemsize
    inputs = (2 * c * key_dim + key_dim * value_dim + c * c) * op + c * value_dim * 4 + c * 4
    if not backward:   # N in W's place for K = V
        return inputs + (0 if key_dim == value_dim else c * value_dim * op) + 1024
    work = 3 * c * value_dim * op                                       # dO then D, N, dN
    staging = key_dim * value_dim * 4 + c * 4                           # dS, de
    if key_dim != value_dim:
        staging += c * key_dim * (op + 4)    # dW, dq (float32: group > 1 only; counted always)
    return inputs + work + staging + 1024


def fits(key_dim, value_dim, backward: bool) -> bool:
    """Whether one block fits shared memory with 16-bit operands."""
    return smem_bytes(key_dim, value_dim, jnp.bfloat16, backward) <= SMEM_BYTES


def _column(vector_s, size):
    """A [1, C] float32 SMEM row as a [C, size] tile varying along axis 0 (WGMMA layout)."""
    vector = plgpu.load(vector_s.at[0], layout=plgpu.Layout.WGMMA.reduce(1))
    return lax.broadcast_in_dim(vector, (CHUNK, size), [0])


def _shapes(q, states):
    """(num_chunks, batch, num_heads, key_dim, num_v_heads, value_dim, group)."""
    num_chunks, _, num_v_heads, _, value_dim = states.shape
    return (num_chunks, *head_sizes(q.shape, num_v_heads, value_dim))


def forward(q, states, w, u, p, e, *, scale, interpret=None):
    """O [B, Tp, HV, V] float32; see the module docstring."""
    num_chunks, batch, num_heads, key_dim, num_v_heads, value_dim, group = _shapes(q, states)
    op_dtype, c = q.dtype, CHUNK
    check_smem("chunk output kernel", smem_bytes(key_dim, value_dim, jnp.bfloat16, False),
               key_dim, value_dim)

    def kernel(q_ref, s_ref, w_ref, u_ref, p_ref, e_ref, o_ref,
               q_s, s_s, w_s, u_s, p_s, e_s, loaded, *n_tile):
        n_s = n_tile[0] if n_tile else w_s     # N in W's place once W S is formed (K = V)
        chunk, head, b = (lax.axis_index(n) for n in ("c", "hv", "b"))
        tokens = pl.ds(chunk * c, c)
        for src, dst in ((q_ref.at[b, tokens, head // group], q_s),
                         (s_ref.at[chunk, b, head], s_s), (w_ref.at[chunk, b, head], w_s),
                         (u_ref.at[chunk, b, head], u_s), (p_ref.at[chunk, b, head], p_s),
                         (e_ref.at[chunk, b, head], e_s)):
            plgpu.copy_gmem_to_smem(src, dst, loaded)
        plgpu.barrier_wait(loaded)

        predicted, from_state = matmul_groups(((c, value_dim), [(w_s, s_s)]),
                                              ((c, value_dim), [(q_s, s_s)]))
        n_s[...] = (u_s[...] - predicted).astype(op_dtype)
        plgpu.commit_smem()
        u_s[...] = scale * _column(e_s, value_dim) * from_state + matmul(p_s, n_s, (c, value_dim))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(u_s, o_ref.at[b, tokens, head])
        plgpu.wait_smem_to_gmem(0)

    scratch = (swizzled_smem((c, key_dim), op_dtype),          # Q
               swizzled_smem((key_dim, value_dim), op_dtype),  # S
               swizzled_smem((c, key_dim), op_dtype),          # W
               swizzled_smem((c, value_dim), jnp.float32),     # U, then O
               swizzled_smem((c, c), op_dtype),                # P
               plgpu.SMEM((1, c), jnp.float32),                # e
               plgpu.Barrier(num_arrivals=6))
    if key_dim != value_dim:
        scratch += (swizzled_smem((c, value_dim), op_dtype),)  # N
    out_type = jax.ShapeDtypeStruct((batch, q.shape[1], num_v_heads, value_dim), jnp.float32)
    return per_chunk(kernel, "delta_rule_chunk_outputs", out_type, scratch,
                     (num_chunks, num_v_heads, batch), interpret)(q, states, w, u, p, e)


def backward(q, states, w, u, p, e, d_out, *, scale, with_dw=True, interpret=None):
    """(dq [B, Tp, HV, K], dS, dW, dU, dP, de); see the module docstring (dq in q's dtype for
    group 1, float32 partials otherwise). Without with_dw, dW (= -dU S^T, which a caller may
    form from a summed dU) is neither formed nor returned."""
    num_chunks, batch, num_heads, key_dim, num_v_heads, value_dim, group = _shapes(q, states)
    op_dtype, c = q.dtype, CHUNK
    check_smem("chunk output backward kernel",
               smem_bytes(key_dim, value_dim, jnp.bfloat16, True), key_dim, value_dim)

    def kernel(q_ref, s_ref, w_ref, u_ref, p_ref, e_ref, do_ref, dq_ref, ds_ref, *refs):
        dw_ref = refs[0] if with_dw else None
        (du_ref, dp_ref, de_ref, q_s, s_s, w_s, u_s, p_s, e_s, do_s, n_s, dn_s, ds_s, de_s,
         loaded, *separate) = refs[1:] if with_dw else refs
        dw_s = separate[0] if separate else n_s
        dq_s = q_s if group == 1 else (separate[1] if separate else u_s)
        chunk, head, b = (lax.axis_index(n) for n in ("c", "hv", "b"))
        tokens = pl.ds(chunk * c, c)
        for src, dst in ((q_ref.at[b, tokens, head // group], q_s),
                         (s_ref.at[chunk, b, head], s_s), (w_ref.at[chunk, b, head], w_s),
                         (u_ref.at[chunk, b, head], u_s), (p_ref.at[chunk, b, head], p_s),
                         (e_ref.at[chunk, b, head], e_s), (do_ref.at[b, tokens, head], do_s)):
            plgpu.copy_gmem_to_smem(src, dst, loaded)
        plgpu.barrier_wait(loaded)

        shape = (c, value_dim)
        from_state, predicted = matmul_groups((shape, [(q_s, s_s)]), (shape, [(w_s, s_s)]))
        de_s.at[0][...] = scale * jnp.sum(do_s[...].astype(jnp.float32) * from_state, axis=1)
        n_s[...] = (u_s[...] - predicted).astype(op_dtype)
        plgpu.commit_smem()

        d_new, d_p = matmul_groups((shape, [(p_s.T, do_s)]), ((c, c), [(do_s, n_s.T)]))
        p_s[...] = d_p.astype(op_dtype)                                         # dP
        u_s[...] = d_new                                                        # dU
        dn_s[...] = (-d_new).astype(op_dtype)                                   # -dN
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(p_s, dp_ref.at[chunk, b, head])
        plgpu.copy_smem_to_gmem(u_s, du_ref.at[chunk, b, head])
        plgpu.copy_smem_to_gmem(de_s, de_ref.at[chunk, b, head])
        do_s[...] = (scale * _column(e_s, value_dim)
                     * do_s[...].astype(jnp.float32)).astype(op_dtype)       # D
        plgpu.commit_smem()

        def state_gradient(acc):
            plgpu.wgmma(acc, q_s.T, do_s)
            plgpu.wgmma(acc, w_s.T, dn_s)
            return acc[...]
        ds_s[...] = pl.run_scoped(state_gradient, plgpu.ACC((key_dim, value_dim), jnp.float32))
        if with_dw:
            d_w, d_q = matmul_groups(((c, key_dim), [(dn_s, s_s.T)]),
                                     ((c, key_dim), [(do_s, s_s.T)]))
            dw_s[...] = d_w.astype(op_dtype)
        else:
            d_q = matmul(do_s, s_s.T, (c, key_dim))
        if group == 1:
            dq_s[...] = d_q.astype(op_dtype)                      # Q is read by dS only
        else:
            if not separate:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # dU has left U's place
            dq_s[...] = d_q
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dq_s, dq_ref.at[b, tokens, head])
        plgpu.copy_smem_to_gmem(ds_s, ds_ref.at[chunk, b, head])
        if with_dw:
            plgpu.copy_smem_to_gmem(dw_s, dw_ref.at[chunk, b, head])
        plgpu.wait_smem_to_gmem(0)

    chunk_major = (num_chunks, batch, num_v_heads)
    dq_dtype = op_dtype if group == 1 else jnp.float32
    out_type = (jax.ShapeDtypeStruct((batch, q.shape[1], num_v_heads, key_dim), dq_dtype),
                jax.ShapeDtypeStruct((*chunk_major, key_dim, value_dim), jnp.float32),
                *([jax.ShapeDtypeStruct((*chunk_major, c, key_dim), op_dtype)] if with_dw else []),
                jax.ShapeDtypeStruct((*chunk_major, c, value_dim), jnp.float32),
                jax.ShapeDtypeStruct((*chunk_major, c, c), op_dtype),
                jax.ShapeDtypeStruct((*chunk_major, 1, c), jnp.float32))
    scratch = (swizzled_smem((c, key_dim), op_dtype),          # Q, then dq (group 1)
               swizzled_smem((key_dim, value_dim), op_dtype),  # S
               swizzled_smem((c, key_dim), op_dtype),          # W
               swizzled_smem((c, value_dim), jnp.float32),     # U, then dU, dq (K = V, group > 1)
               swizzled_smem((c, c), op_dtype),                # P, then dP
               plgpu.SMEM((1, c), jnp.float32),                # e
               swizzled_smem((c, value_dim), op_dtype),        # dO, then D = scale diag(e) dO
               swizzled_smem((c, value_dim), op_dtype),        # N, then dW (K = V)
               swizzled_smem((c, value_dim), op_dtype),        # -dN
               swizzled_smem((key_dim, value_dim), jnp.float32),  # dS
               plgpu.SMEM((1, c), jnp.float32),                # de
               plgpu.Barrier(num_arrivals=7))
    if key_dim != value_dim:
        scratch += (swizzled_smem((c, key_dim), op_dtype),)     # dW
        if group > 1:
            scratch += (swizzled_smem((c, key_dim), jnp.float32),)   # dq
    return per_chunk(kernel, "delta_rule_chunk_outputs_backward", out_type, scratch,
                     (num_chunks, num_v_heads, batch), interpret)(q, states, w, u, p, e, d_out)
