"""Delta-rule math shared by the XLA paths (`gdn_jax.ops`) and the Pallas kernels
(`mixer_kernels.mosaic_gpu.gated_delta`): below both, so the kernels import nothing from the ops.

    state_resets(segment_ids, shape)   [B, T] bool: where the state restarts from zero
    compute_dtype(*arrays)             float32 for 16/32-bit inputs, float64 for float64
    pair_decay_matrix(gamma_i, gamma_j, same_document)
                                       Gamma [..., C, C]: exp(gamma_i - gamma_j), i >= j in
                                       one document, else 0
    unit_lower_inverse(A)              (I + A)^{-1} for strictly lower-triangular A [..., C, C]
"""

import jax
import jax.numpy as jnp

_FULL_FLOAT32 = jax.lax.Precision.HIGHEST


def state_resets(segment_ids, shape):
    """Boolean [B, T]: True where the state restarts from zero.

    That is every document start except t = 0 (the first document continues `initial_state`):
    token t > 0 whose id differs from token t-1's. (`fpa_jax`'s `document_starts` also marks
    t = 0.)
    """
    if segment_ids is None:
        return jnp.zeros(shape, dtype=bool)
    changed = segment_ids[:, 1:] != segment_ids[:, :-1]
    return jnp.concatenate([jnp.zeros((shape[0], 1), dtype=bool), changed], axis=1)


def compute_dtype(*arrays):
    """float32 for bf16/f16/f32 inputs; float64 only when an input is float64."""
    present = [x for x in arrays if x is not None]
    return jnp.promote_types(jnp.result_type(*present), jnp.float32)


def pair_decay_matrix(gamma_i, gamma_j, same_document=None):
    """Gamma [..., C, C] of a chunk: Gamma_ij = exp(gamma_i - gamma_j) for i >= j in the same
    document, 0 otherwise.

    gamma_i, gamma_j [..., C]: the within-chunk cumulative sum of g (along i and along j; the
    same values). same_document: bool broadcastable to [..., C, C] (tokens i and j lie in one
    document), or None when the chunk is one document. The exponent is masked to -inf before
    `exp`, so for g <= 0 only exp(non-positive) is ever evaluated.
    """
    chunk = gamma_i.shape[-1]
    lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
    mask = lower if same_document is None else lower & same_document
    return jnp.exp(jnp.where(mask, gamma_i[..., :, None] - gamma_j[..., None, :], -jnp.inf))


def unit_lower_inverse(strictly_lower):
    """(I + A)^{-1} for strictly lower-triangular A [..., C, C], by block forward substitution.

    For a unit lower-triangular L = [[L11, 0], [L21, L22]] with the diagonal blocks already
    inverted (X11, X22), forward substitution by blocks gives

        L^{-1} = [[X11, 0], [-X22 L21 X11, X22]].

    Applied bottom-up to the diagonal blocks of size 1, 2, 4, ..., C (C padded to a power of
    two with identity rows), each level is two batched matmuls over all blocks of all chunks.
    Only inverted diagonal blocks and entries of A are multiplied; no power of A is ever formed
    (unlike the Neumann series / repeated squaring, which overflows once |A| > 1). Batched
    matmuls rather than `triangular_solve`, which is a per-matrix LAPACK call on CPU. These
    small products run at full float32 precision (no TF32 on GPUs): about (2/3) C^3 flops per
    chunk against O(C^2 (K + V)) for the rest, and the solve is the step most sensitive to
    rounding.
    """
    size = strictly_lower.shape[-1]
    padded = 1 << (size - 1).bit_length()
    batch = strictly_lower.shape[:-2]
    a = jnp.pad(strictly_lower, [(0, 0)] * len(batch) + [(0, padded - size)] * 2)
    inverse = jnp.ones(batch + (padded, 1, 1), a.dtype)     # inverses of the 1 x 1 blocks
    block = 1
    while block < padded:
        pairs = padded // (2 * block)
        diagonal_blocks = jnp.einsum(                         # [..., pairs, 2 block, 2 block]
            "...pipj->...pij", a.reshape(batch + (pairs, 2 * block, pairs, 2 * block)))
        lower_left = diagonal_blocks[..., block:, :block]
        upper_inverse, lower_inverse = inverse[..., 0::2, :, :], inverse[..., 1::2, :, :]
        off_diagonal = -jnp.matmul(
            lower_inverse, jnp.matmul(lower_left, upper_inverse, precision=_FULL_FLOAT32),
            precision=_FULL_FLOAT32)
        inverse = jnp.concatenate(
            [jnp.concatenate([upper_inverse, jnp.zeros_like(upper_inverse)], axis=-1),
             jnp.concatenate([off_diagonal, lower_inverse], axis=-1)], axis=-2)
        block *= 2
    return inverse[..., 0, :size, :size]
