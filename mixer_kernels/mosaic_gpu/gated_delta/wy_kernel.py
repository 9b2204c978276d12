"""Pallas Mosaic GPU kernel for the intra-chunk WY preparation, one block per (chunk, value
head, batch).

Per chunk (local tokens i, j < C = 64; rows of `wy.chunk_rows`: gamma = within-chunk cumsum of
g, beta, beta*e, the write decay d and a document number within the chunk):

    Gamma_ij = exp(gamma_i - gamma_j)   i >= j, same document; else 0
    A        = strict_lower(diag(beta) (K K^T) ⊙ Gamma)          K K^T on the tensor cores
    T        = (I + A)^{-1}                                       blockwise, see below
    W        = (T diag(beta e)) K       U = (T diag(beta)) V     (16-bit T, float32 accumulation)
    P        = scale (Q K^T) ⊙ Gamma    Kw = diag(d) K

The unit-lower inverse is block forward substitution on whole 64 x 64 tiles: with X the
inverse of the diagonal blocks of size s (X = I - A ⊙ M_1 for s = 2), the blocks of size 2s are

    X <- X - X (A ⊙ M_s) X           M_s: row in the lower, column in the upper half of a 2s block

(L^{-1} = [[X11, 0], [-X22 L21 X11, X22]] for every 2s block at once), two wgmmas per level,
levels s = 2, 4, 8, 16, 32. No power of A is formed (repeated squaring loses everything once
keys in a chunk are correlated); X stays float32 in registers, its operand copy is 16-bit.

    q, k [B, Tp, H, K]   v [B, Tp, HV, V] (16-bit; f32 only in interpret mode)
    rows [B, HV, N, R, C] float32 (R = len(wy.ROWS))
    -> W, Kw [N, B, HV, C, K] (q's dtype), U [N, B, HV, C, V] float32, P [N, B, HV, C, C]
       (q's dtype) and, with `with_inverse`, T [N, B, HV, C, C] float32 (for the backward)

Value head hv reads q/k head hv // (HV // H). Shared memory is reused: Kw is staged in Q's
buffer once P is formed, W in K's once W is formed, so K = V = 256 fits one block.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.gated_delta import wy
from mixer_kernels.mosaic_gpu.gated_delta.common import CHUNK, check_smem, head_sizes, per_chunk
from mixer_kernels.mosaic_gpu.common import matmul, matmul_groups, swizzled_smem


def smem_bytes(key_dim, value_dim, operand_dtype, with_inverse) -> int:
    """Shared memory of one block (inputs, chain operands, output staging, barrier)."""
    c, op = CHUNK, jnp.dtype(operand_dtype).itemsize
    inputs = (2 * key_dim + value_dim) * c * op + len(wy.ROWS) * c * 4
    chain = 2 * c * c * op
    staging = c * c * op + c * value_dim * 4 + (c * c * 4 if with_inverse else 0)
    return inputs + chain + staging + 1024


def unit_lower_inverse(a, i, j, x_s, m_s):
    """(I + A)^{-1} float32 [C, C] for strictly lower A (float32, WGMMA layout; i, j its row and
    column iotas) by the block forward substitution of the module docstring; x_s, m_s [C, C]
    16-bit SMEM scratch (the products' operands), free for the caller's stores on return."""
    def block(level):        # M_s for s = 2**level
        return (((i >> (level + 1)) == (j >> (level + 1))) & ((i >> level) != (j >> level))
                & (i > j))

    x = jnp.where(i == j, 1.0, jnp.where(block(0), -a, 0.0))
    for level in range(1, 6):
        x_s[...] = x.astype(x_s.dtype)
        m_s[...] = jnp.where(block(level), a, 0.0).astype(m_s.dtype)
        plgpu.commit_smem()
        left = matmul(x_s, m_s, a.shape)                 # X (A ⊙ M_s)
        m_s[...] = left.astype(m_s.dtype)
        plgpu.commit_smem()
        x = x - matmul(m_s, x_s, a.shape)
    return x


def chunk_tiles(rows_s, c):
    """The prologue of a chunk's WY kernels, from the chunk's rows (wy.ROWS) in SMEM rows_s:
    (along, i, j, decay). along(name, size): row `name` as a [C, size] tile varying along axis
    0 (over i: names without _j) or 1 (over j); i, j the [C, C] iotas; decay[i, j] =
    exp(gamma_i - gamma_j) on the pairs i >= j of one document, 0 elsewhere."""
    row = {name: index for index, name in enumerate(wy.ROWS)}

    def along(name, size):
        axis = 1 if name.endswith("_j") or name == "beta_e" else 0
        vector = plgpu.load(rows_s.at[row[name]], layout=plgpu.Layout.WGMMA.reduce(1 - axis))
        return lax.broadcast_in_dim(vector, (c, size), [axis])

    i = plgpu.broadcasted_iota(jnp.int32, (c, c), 0, layout=plgpu.Layout.WGMMA)
    j = plgpu.broadcasted_iota(jnp.int32, (c, c), 1, layout=plgpu.Layout.WGMMA)
    pairs = (i >= j) & (along("document_i", c) == along("document_j", c))
    decay = jnp.exp(jnp.where(pairs, along("gamma_i", c) - along("gamma_j", c), -jnp.inf))
    return along, i, j, decay


def prepare(q, k, v, rows, *, scale, with_inverse=False, interpret=None):
    """(W, U, Kw, P[, T]) chunk-major; see the module docstring."""
    batch, num_heads, key_dim, num_v_heads, value_dim, group = head_sizes(k.shape, *v.shape[2:])
    num_chunks = rows.shape[2]
    op_dtype = k.dtype
    c = CHUNK
    shape = (c, c)
    check_smem("WY kernel", smem_bytes(key_dim, value_dim, op_dtype, with_inverse=True),
               key_dim, value_dim)

    def kernel(q_ref, k_ref, v_ref, rows_ref, w_ref, u_ref, kw_ref, p_ref, *rest):
        t_ref = rest[0] if with_inverse else None
        q_s, k_s, v_s, rows_s, x_s, m_s, p_s, u_s, *t_s, loaded = rest[1:] if with_inverse else rest
        chunk, head, b = (lax.axis_index(n) for n in ("c", "hv", "b"))
        tokens = pl.ds(chunk * c, c)
        plgpu.copy_gmem_to_smem(q_ref.at[b, tokens, head // group], q_s, loaded)
        plgpu.copy_gmem_to_smem(k_ref.at[b, tokens, head // group], k_s, loaded)
        plgpu.copy_gmem_to_smem(v_ref.at[b, tokens, head], v_s, loaded)
        plgpu.copy_gmem_to_smem(rows_ref.at[b, head, chunk], rows_s, loaded)
        plgpu.barrier_wait(loaded)

        along, i, j, decay = chunk_tiles(rows_s, c)
        key_gram, scores = matmul_groups((shape, [(k_s, k_s.T)]), (shape, [(q_s, k_s.T)]))
        a = jnp.where(i > j, along("beta_i", c) * key_gram * decay, 0.0)

        p_s[...] = (scale * scores * decay).astype(op_dtype)
        q_s[...] = (k_s[...].astype(jnp.float32)
                    * along("kw_decay", key_dim)).astype(op_dtype)    # Kw, staged in Q's place
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(p_s, p_ref.at[chunk, b, head])
        plgpu.copy_smem_to_gmem(q_s, kw_ref.at[chunk, b, head])

        x = unit_lower_inverse(a, i, j, x_s, m_s)
        x_s[...] = (x * along("beta_e", c)).astype(op_dtype)
        m_s[...] = (x * along("beta_j", c)).astype(op_dtype)
        if with_inverse:
            t_s[0][...] = x
        plgpu.commit_smem()
        u, w = matmul_groups(((c, value_dim), [(m_s, v_s)]), ((c, key_dim), [(x_s, k_s)]))
        u_s[...] = u
        k_s[...] = w.astype(op_dtype)                                   # W, staged in K's place
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_s, w_ref.at[chunk, b, head])
        plgpu.copy_smem_to_gmem(u_s, u_ref.at[chunk, b, head])
        if with_inverse:
            plgpu.copy_smem_to_gmem(t_s[0], t_ref.at[chunk, b, head])
        plgpu.wait_smem_to_gmem(0)

    chunk_major = (num_chunks, batch, num_v_heads, c)
    out_type = [jax.ShapeDtypeStruct((*chunk_major, key_dim), op_dtype),
                jax.ShapeDtypeStruct((*chunk_major, value_dim), jnp.float32),
                jax.ShapeDtypeStruct((*chunk_major, key_dim), op_dtype),
                jax.ShapeDtypeStruct((*chunk_major, c), op_dtype)]
    scratch = [swizzled_smem((c, key_dim), op_dtype),      # Q, then Kw
               swizzled_smem((c, key_dim), op_dtype),      # K, then W
               swizzled_smem((c, value_dim), op_dtype),    # V
               plgpu.SMEM((len(wy.ROWS), c), jnp.float32),
               swizzled_smem(shape, op_dtype),             # X, then T diag(beta e)
               swizzled_smem(shape, op_dtype),             # A ⊙ M_s, X (A ⊙ M_s), T diag(beta)
               swizzled_smem(shape, op_dtype),             # P
               swizzled_smem((c, value_dim), jnp.float32)]  # U
    if with_inverse:
        out_type.append(jax.ShapeDtypeStruct((*chunk_major, c), jnp.float32))
        scratch.append(swizzled_smem(shape, jnp.float32))
    scratch.append(plgpu.Barrier(num_arrivals=4))
    return per_chunk(kernel, "delta_rule_wy_prepare", tuple(out_type), tuple(scratch),
                     (num_chunks, num_v_heads, batch), interpret)(q, k, v, rows)
