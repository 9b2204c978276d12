"""Pallas Mosaic GPU kernels for the sequential part of the chunked gated delta rule.

Forward (`forward_states`), per value head and chunk c = 0 .. N-1, entering state S_0 given:

    S_{c+1} = rho_c S_c + Kw_c^T (U_c - W_c S_c)          S [K, V] float32, on chip

    Kw_c = diag(write decay) K_c, W_c [C, K] (16-bit), U_c [C, V] float32, rho_c scalar

returns every entering state S_c [N, B, HV, K, V] (float32, or the operand dtype) and S_N
[B, HV, K, V] (float32).

Backward (`backward_states`), the reverse recurrence of the cotangents, lambda_N = dS_N:

    dU_c       = Kw_c lambda_{c+1}                          [C, V]
    lambda_c   = G_c + rho_c lambda_{c+1} - W_c^T dU_c       G_c = cotangent of S_c

returns lambda_{c+1} per chunk [N, B, HV, K, V] (float32, or the operand dtype), dU
[N, B, HV, C, V] and lambda_0 (= dS_0).

Chunk-major layouts: Kw, W [N, B, HV, C, K]; U [N, B, HV, C, V]; rho [B, HV, N4] (N padded to
a multiple of 4 for the copy engine; the row travels in copies of at most TMA_MAX_ELEMENTS,
the copy engine's limit per dimension, so T / C may exceed it). One block per (V tile, value head, batch) keeps its state
tile [K, Vt] in registers across all chunks; the next chunk's tiles are copied (TMA) while the
current one computes. Matrix products run on the tensor cores (wgmma) with 16-bit operands (the
state is rounded to the input dtype for the product, as the accumulation stays float32);
float32 operands are accepted only in interpret mode (tests), where the product is exact.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.gated_delta.common import SMEM_BYTES, SUPPORTED_HEAD_DIMS
from mixer_kernels.mosaic_gpu.common import matmul, swizzled_smem



@dataclasses.dataclass(frozen=True)
class Tiling:
    """Block shape of one kernel launch: chunk C, key dim K, value tile Vt (of V)."""
    chunk: int
    key_dim: int
    value_dim: int
    value_tile: int

    @property
    def num_value_tiles(self):
        return self.value_dim // self.value_tile


def _operand_swizzle(tiling: Tiling, operand_dtype):
    """One swizzle for all matrix operands of a kernel (wgmma's A and B must agree): the
    value tile's row width in bytes, at most 128."""
    return min(128, tiling.value_tile * jnp.dtype(operand_dtype).itemsize)


def smem_bytes(tiling: Tiling, operand_dtype, num_chunks, forward: bool) -> int:
    """Shared memory of one block: double-buffered input tiles, output staging, operands,
    the rho row and barriers."""
    c, k, vt = tiling.chunk, tiling.key_dim, tiling.value_tile
    op = jnp.dtype(operand_dtype).itemsize
    prefetched = 2 * (2 * c * k * op + (c * vt * 4 if forward else k * vt * 4))
    outputs = k * vt * 4 + (0 if forward else c * vt * 4)
    operands = k * vt * op + c * vt * op
    return prefetched + outputs + operands + 4 * padded_chunks(num_chunks) + 1024


def choose_tiling(num_chunks, chunk, key_dim, value_dim, operand_dtype, value_tile=None) -> Tiling:
    """The value tile: the widest of 64, 32, 16 that fits shared memory in both kernels.

    Measured on an H200 (bf16, K = V = 128; forward / backward state kernel, ms): at
    (B, T, HV) = (4, 4096, 16) Vt 64: 0.36 / 0.44, 32: 0.30 / 0.51, 16: 0.57 / 0.75; at
    (1, 16384, 16) Vt 64: 0.47 / 0.64, 32: 0.48 / 0.60, 16: 0.64 / 0.76. More blocks (narrower
    tiles) do not pay: each block's chunk loop is latency-bound and a narrow tile only repeats
    the Kw/W loads.
    """
    if key_dim not in SUPPORTED_HEAD_DIMS or value_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"K and V must be in {SUPPORTED_HEAD_DIMS}, got K = {key_dim}, V = {value_dim}")
    if chunk != 64:
        raise ValueError(f"chunk_size must be 64 for the pallas kernels, got {chunk}")
    candidates = (value_tile,) if value_tile is not None else (64, 32, 16)
    for tile in candidates:
        tiling = Tiling(chunk, key_dim, value_dim, tile)
        if value_dim % tile == 0 and max(smem_bytes(tiling, operand_dtype, num_chunks, forward)
                                         for forward in (True, False)) <= SMEM_BYTES:
            return tiling
    raise ValueError(f"no value tile of {candidates} fits shared memory for K = {key_dim}, "
                     f"{num_chunks} chunks")


# The copy engine (TMA) moves at most 256 elements along each dimension of one copy.
TMA_MAX_ELEMENTS = 256


def padded_chunks(num_chunks):
    return -(-num_chunks // 4) * 4


def _chunk_stream(refs, smems, loaded, b, head, columns):
    """fetch(c, slot): the TMA of chunk c's Kw, W and value-tile operand (U forward, G
    backward; refs and smems in that order) into `slot`, arriving on loaded[slot]."""
    kw_ref, w_ref, tile_ref = refs
    kw_smem, w_smem, tile_smem = smems

    def fetch(c, slot):
        plgpu.copy_gmem_to_smem(kw_ref.at[c, b, head], kw_smem.at[slot], loaded.at[slot])
        plgpu.copy_gmem_to_smem(w_ref.at[c, b, head], w_smem.at[slot], loaded.at[slot])
        plgpu.copy_gmem_to_smem(tile_ref.at[c, b, head, :, columns], tile_smem.at[slot],
                                loaded.at[slot])

    return fetch


def _stream_scratch(chunk, key_dim, tile_rows, vt, rho_len, op_dtype, swizzle):
    """Shared memory of `_chunk_stream` and `_load_head`: two slots of Kw and W, two of the
    [tile_rows, vt] float32 value-tile operand, and the rho row."""
    return (swizzled_smem((2, chunk, key_dim), op_dtype, swizzle),  # Kw
            swizzled_smem((2, chunk, key_dim), op_dtype, swizzle),  # W
            swizzled_smem((2, tile_rows, vt), jnp.float32),         # U or G
            plgpu.SMEM((rho_len,), jnp.float32))                    # rho row


def _launch(kernel, name, out_type, scratch, tiling, num_v_heads, batch, interpret, *operands):
    """One program per (value tile, value head, batch); scratch is followed by the stream's
    barriers (loaded: two slots of three copies; the head's loads: its rho row's pieces and its
    state tile). operands: (Kw, W, U or G, rho, S_0 or dS_N)."""
    kernel.__name__ = name  # the kernel's name in profiles
    rho_len = operands[3].shape[-1]
    barriers = (plgpu.Barrier(num_arrivals=3, num_barriers=2),
                plgpu.Barrier(num_arrivals=1 + len(_rho_pieces(rho_len)), num_barriers=1))
    return plgpu.kernel(
        kernel, out_type=out_type, scratch_types=(*scratch, *barriers),
        grid=(tiling.num_value_tiles, num_v_heads, batch), grid_names=("vt", "hv", "b"),
        interpret=interpret,
    )(*operands)


def _rho_pieces(rho_len):
    """(start, size) of the copies that move a rho row of `rho_len` (a multiple of 4)."""
    return [(start, min(TMA_MAX_ELEMENTS, rho_len - start))
            for start in range(0, rho_len, TMA_MAX_ELEMENTS)]


def _load_head(rho_ref, rho_smem, state_ref, state_smem, arrived, b, head, columns):
    """Starts the TMAs of the head's rho row and its starting state tile (S_0 forward,
    d S_final backward), all arriving on `arrived` (1 + len(_rho_pieces) arrivals)."""
    for start, size in _rho_pieces(rho_smem.shape[0]):
        piece = pl.ds(start, size)
        plgpu.copy_gmem_to_smem(rho_ref.at[b, head, piece], rho_smem.at[piece], arrived)
    plgpu.copy_gmem_to_smem(state_ref.at[b, head, :, columns], state_smem, arrived)


def forward_states(kw, w, u, rho, s0, *, tiling: Tiling, states_16bit=False, interpret=None):
    """Entering states of all chunks and the final state; see the module docstring.
    states_16bit: the entering states leave in the operand dtype (as rounded for the products),
    not float32; the final state stays float32."""
    num_chunks, batch, num_v_heads, chunk, key_dim = w.shape
    vt = tiling.value_tile
    op_dtype = w.dtype

    def kernel(kw_ref, w_ref, u_ref, rho_ref, s0_ref, states_ref, final_ref,
               kw_smem, w_smem, u_smem, rho_smem, state_smem, state16_smem, vnew16_smem,
               loaded, rho_loaded):
        vtile, head, b = (lax.axis_index(n) for n in ("vt", "hv", "b"))
        columns = pl.ds(vtile * vt, vt)

        fetch = _chunk_stream((kw_ref, w_ref, u_ref), (kw_smem, w_smem, u_smem), loaded, b,
                              head, columns)
        _load_head(rho_ref, rho_smem, s0_ref, state_smem, rho_loaded.at[0], b, head, columns)
        fetch(0, 0)
        plgpu.barrier_wait(rho_loaded.at[0])
        state = state_smem[...]

        def step(c, state):
            slot = lax.rem(c, 2)
            plgpu.barrier_wait(loaded.at[slot])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # state_smem free again
            state_smem[...] = state
            state16_smem[...] = state.astype(op_dtype)
            plgpu.commit_smem()    # also orders the last step's reads of the other slot

            @pl.when(c + 1 < num_chunks)
            def _prefetch():
                fetch(c + 1, 1 - slot)

            plgpu.copy_smem_to_gmem(state16_smem if states_16bit else state_smem,
                                    states_ref.at[c, b, head, :, columns])
            predicted = matmul(w_smem.at[slot], state16_smem, (chunk, vt))
            vnew16_smem[...] = (u_smem.at[slot][...] - predicted).astype(op_dtype)
            plgpu.commit_smem()
            written = matmul(kw_smem.at[slot].T, vnew16_smem, (key_dim, vt))
            return rho_smem[c] * state + written

        state = lax.fori_loop(0, num_chunks, step, state)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        state_smem[...] = state
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(state_smem, final_ref.at[b, head, :, columns])
        plgpu.wait_smem_to_gmem(0)

    swizzle = _operand_swizzle(tiling, op_dtype)
    out_type = (jax.ShapeDtypeStruct((num_chunks, batch, num_v_heads, key_dim, tiling.value_dim),
                                     op_dtype if states_16bit else jnp.float32),
                jax.ShapeDtypeStruct((batch, num_v_heads, key_dim, tiling.value_dim), jnp.float32))
    scratch = (
        *_stream_scratch(chunk, key_dim, chunk, vt, rho.shape[-1], op_dtype, swizzle),
        swizzled_smem((key_dim, vt), jnp.float32),             # state (for the copy out)
        swizzled_smem((key_dim, vt), op_dtype, swizzle),       # state as a matmul operand
        swizzled_smem((chunk, vt), op_dtype, swizzle),         # V_new as a matmul operand
    )
    return _launch(kernel, "delta_rule_forward_states", out_type, scratch, tiling, num_v_heads,
                   batch, interpret, kw, w, u, rho, s0)


def backward_states(kw, w, d_states, rho, d_final, *, tiling: Tiling, lambdas_16bit=False,
                    interpret=None):
    """Reverse recurrence: (lambda_{c+1} per chunk, dU, dS_0); see the module docstring.
    lambdas_16bit: the lambdas leave in the operand dtype (as rounded for the products), not
    float32."""
    num_chunks, batch, num_v_heads, chunk, key_dim = w.shape
    vt = tiling.value_tile
    op_dtype = w.dtype

    def kernel(kw_ref, w_ref, g_ref, rho_ref, dfinal_ref, lambdas_ref, du_ref, ds0_ref,
               kw_smem, w_smem, g_smem, rho_smem, lam_smem, lam16_smem, du_smem, du16_smem,
               loaded, rho_loaded):
        vtile, head, b = (lax.axis_index(n) for n in ("vt", "hv", "b"))
        columns = pl.ds(vtile * vt, vt)

        fetch = _chunk_stream((kw_ref, w_ref, g_ref), (kw_smem, w_smem, g_smem), loaded, b,
                              head, columns)
        _load_head(rho_ref, rho_smem, dfinal_ref, lam_smem, rho_loaded.at[0], b, head, columns)
        fetch(num_chunks - 1, 0)
        plgpu.barrier_wait(rho_loaded.at[0])
        lam = lam_smem[...]

        def step(i, lam):
            c = num_chunks - 1 - i
            slot = lax.rem(i, 2)
            plgpu.barrier_wait(loaded.at[slot])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # lam_smem, du_smem free again
            lam_smem[...] = lam
            lam16_smem[...] = lam.astype(op_dtype)
            plgpu.commit_smem()    # also orders the last step's read of G before the prefetch

            @pl.when(c > 0)
            def _prefetch():
                fetch(c - 1, 1 - slot)

            plgpu.copy_smem_to_gmem(lam16_smem if lambdas_16bit else lam_smem,
                                    lambdas_ref.at[c, b, head, :, columns])
            d_u = matmul(kw_smem.at[slot], lam16_smem, (chunk, vt))
            du_smem[...] = d_u
            du16_smem[...] = d_u.astype(op_dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(du_smem, du_ref.at[c, b, head, :, columns])
            back = matmul(w_smem.at[slot].T, du16_smem, (key_dim, vt))
            return g_smem.at[slot][...] + rho_smem[c] * lam - back

        lam = lax.fori_loop(0, num_chunks, step, lam)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        lam_smem[...] = lam
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(lam_smem, ds0_ref.at[b, head, :, columns])
        plgpu.wait_smem_to_gmem(0)

    value_dim = tiling.value_dim
    swizzle = _operand_swizzle(tiling, op_dtype)
    out_type = (
        jax.ShapeDtypeStruct((num_chunks, batch, num_v_heads, key_dim, value_dim),
                             op_dtype if lambdas_16bit else jnp.float32),
        jax.ShapeDtypeStruct((num_chunks, batch, num_v_heads, chunk, value_dim), jnp.float32),
        jax.ShapeDtypeStruct((batch, num_v_heads, key_dim, value_dim), jnp.float32))
    scratch = (  # the stream's value tile: G, the cotangent of S_c
        *_stream_scratch(chunk, key_dim, key_dim, vt, rho.shape[-1], op_dtype, swizzle),
        swizzled_smem((key_dim, vt), jnp.float32),             # lambda (for the copy out)
        swizzled_smem((key_dim, vt), op_dtype, swizzle),       # lambda as a matmul operand
        swizzled_smem((chunk, vt), jnp.float32),               # dU (for the copy out)
        swizzled_smem((chunk, vt), op_dtype, swizzle),         # dU as a matmul operand
    )
    return _launch(kernel, "delta_rule_backward_states", out_type, scratch, tiling, num_v_heads,
                   batch, interpret, kw, w, d_states, rho, d_final)
