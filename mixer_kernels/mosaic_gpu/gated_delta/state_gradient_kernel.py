"""Pallas Mosaic GPU kernel for the per-chunk gradients of the state recurrence's inputs, one
block per (chunk, value head, batch); the chunks are independent once the reverse recurrence
(`state_kernels.backward_states`) has produced dU_c and lambda_{c+1}.

The recurrence S_{c+1} = rho_c S_c + Kw_c^T (U_c - W_c S_c) gives, per chunk:

    N_c     = U_c - W_c S_c                        the new values               [C, V]
    dW_c    = -dU_c S_c^T                                                        [C, K]
    dKw_c   = N_c lambda_{c+1}^T                                                 [C, K]
    drho_c  = <S_c, lambda_{c+1}>    written as K row sums, summed over K in XLA  [1, K]

Products: 16-bit operands (S, lambda, dU and N in the operand dtype), float32 accumulation;
the row sums of drho multiply the 16-bit S and lambda in float32.

    states, lambdas [N, B, HV, K, V] (operand dtype: bf16 / f16; float32 in interpret mode)
    dU, U [N, B, HV, C, V] float32     W [N, B, HV, C, K] (operand dtype)
    -> dW, dKw [N, B, HV, C, K] (operand dtype), drho rows [N, B, HV, 1, K] float32

With the chunk outputs' dU_out (`d_u_out`, float32 like dU; the outputs read U and W only
through N, so their dW is -dU_out S^T): dU is dU + dU_out throughout, dW is the total
-(dU + dU_out) S^T, and a fourth output is that dU total in the operand dtype (what the WY
backward reads), so no sum of the two sweeps' dU and dW is left to XLA.

Shared memory is reused when K = V: dW in dU's 16-bit place, dKw in N's. A block then needs
73 KiB at K = V = 64 and 178 KiB at K = V = 128 (bf16), 32 KiB more with dU_out at V = 128.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.gated_delta.common import CHUNK, SMEM_BYTES, check_smem, per_chunk
from mixer_kernels.mosaic_gpu.common import matmul, swizzled_smem


def smem_bytes(key_dim, value_dim, operand_dtype, with_outputs_du=True) -> int:
    """Shared memory of one block (inputs, 16-bit work tiles, output staging, barrier);
    with_outputs_du: with the chunk outputs' dU as a further input."""
    c, op = CHUNK, jnp.dtype(operand_dtype).itemsize
    inputs = (2 * key_dim * value_dim * op + (3 if with_outputs_du else 2) * c * value_dim * 4
              + c * key_dim * op)
    work = 2 * c * value_dim * op                                          # dU, N in 16 bits
    staging = key_dim * 4 + (0 if key_dim == value_dim else 2 * c * key_dim * op)
    return inputs + work + staging + 1024


def fits(key_dim, value_dim) -> bool:
    """Whether the kernel is built for these head dims (64 or 128 each: a 256-wide tile would
    take 128 accumulator registers per thread) and one block fits shared memory."""
    return (max(key_dim, value_dim) <= 128
            and smem_bytes(key_dim, value_dim, jnp.bfloat16) <= SMEM_BYTES)


def state_gradients(states, lambdas, d_u, u, w, d_u_out=None, *, interpret=None):
    """(dW, dKw, drho rows), and the dU total in the operand dtype when d_u_out is given; see
    the module docstring."""
    num_chunks, batch, num_v_heads, key_dim, value_dim = states.shape
    op_dtype, c = w.dtype, CHUNK
    summing = d_u_out is not None
    check_smem("state gradient kernel", smem_bytes(key_dim, value_dim, jnp.bfloat16, summing),
               key_dim, value_dim)
    inputs = (states, lambdas, d_u, u, w) + ((d_u_out,) if summing else ())

    def kernel(*refs):
        in_refs, refs = refs[:len(inputs)], refs[len(inputs):]
        dw_ref, dkw_ref, rows_ref, *refs = refs
        du_total_ref = refs.pop(0) if summing else None
        s_s, lam_s, du_s, u_s, w_s, du16_s, n_s, rows_s, loaded, *rest = refs
        duo_s = rest.pop(0) if summing else None
        dw_s, dkw_s = rest if rest else (du16_s, n_s)
        chunk, head, b = (lax.axis_index(n) for n in ("c", "hv", "b"))
        for src, dst in zip(in_refs, (s_s, lam_s, du_s, u_s, w_s, duo_s)):
            plgpu.copy_gmem_to_smem(src.at[chunk, b, head], dst, loaded)
        plgpu.barrier_wait(loaded)

        d_u_total = du_s[...] + duo_s[...] if summing else du_s[...]
        du16_s[...] = d_u_total.astype(op_dtype)
        n_s[...] = (u_s[...] - matmul(w_s, s_s, (c, value_dim))).astype(op_dtype)
        plgpu.commit_smem()
        if summing:
            plgpu.copy_smem_to_gmem(du16_s, du_total_ref.at[chunk, b, head])
        for start in range(0, key_dim, 64):   # 64 rows at a time: fewer live registers
            part = pl.ds(start, 64)
            rows_s.at[0, part][...] = jnp.sum(s_s.at[part][...].astype(jnp.float32)
                                              * lam_s.at[part][...].astype(jnp.float32), axis=1)
        d_w = matmul(du16_s, s_s.T, (c, key_dim))
        if summing:   # dW may take dU's 16-bit place once its copy out has read it
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        dw_s[...] = (-d_w).astype(op_dtype)
        d_kw = matmul(n_s, lam_s.T, (c, key_dim))
        dkw_s[...] = d_kw.astype(op_dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dw_s, dw_ref.at[chunk, b, head])
        plgpu.copy_smem_to_gmem(dkw_s, dkw_ref.at[chunk, b, head])
        plgpu.copy_smem_to_gmem(rows_s, rows_ref.at[chunk, b, head])
        plgpu.wait_smem_to_gmem(0)

    chunk_major = (num_chunks, batch, num_v_heads)
    out_type = (jax.ShapeDtypeStruct((*chunk_major, c, key_dim), op_dtype),
                jax.ShapeDtypeStruct((*chunk_major, c, key_dim), op_dtype),
                jax.ShapeDtypeStruct((*chunk_major, 1, key_dim), jnp.float32))
    if summing:
        out_type += (jax.ShapeDtypeStruct((*chunk_major, c, value_dim), op_dtype),)
    scratch = (swizzled_smem((key_dim, value_dim), op_dtype),    # S
               swizzled_smem((key_dim, value_dim), op_dtype),    # lambda
               swizzled_smem((c, value_dim), jnp.float32),       # dU
               swizzled_smem((c, value_dim), jnp.float32),       # U
               swizzled_smem((c, key_dim), op_dtype),            # W
               swizzled_smem((c, value_dim), op_dtype),          # dU in 16 bits, then dW (K = V)
               swizzled_smem((c, value_dim), op_dtype),          # N, then dKw (K = V)
               plgpu.SMEM((1, key_dim), jnp.float32),            # drho rows
               plgpu.Barrier(num_arrivals=len(inputs)))
    if summing:
        scratch += (swizzled_smem((c, value_dim), jnp.float32),)  # dU of the chunk outputs
    if key_dim != value_dim:
        scratch += (swizzled_smem((c, key_dim), op_dtype),       # dW
                    swizzled_smem((c, key_dim), op_dtype))       # dKw
    return per_chunk(kernel, "delta_rule_state_gradients", out_type, scratch,
                     (num_chunks, num_v_heads, batch), interpret)(*inputs)
