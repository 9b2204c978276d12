"""Mosaic GPU kernel: the per-level soft-min shares of FPA's diagonal tiles.

One program per (head, block i, batch) recomputes the diagonal tile [t, s] of block i (the
tile math of backward_kernels.py) and sums, per dyadic level L (pairs s < t with
t >> (L + 1) == s >> (L + 1) and t >> L != s >> L), the shares of coef = beta [dead] dS:

    key side   sum_t coef_ts w_suf(L, s) / mass_ts      (a vector over the block's keys s)
    query side sum_s coef_ts w_pre(L, t) / mass_ts      (a vector over the block's queries t)

with w_X = exp(-(X - R_ts)/tau) and mass_ts = suf_mass(L, s) w_suf + pre_mass(L, t) w_pre.
Output [B, H, nb, 2 * levels, n] float32: the key sides of levels 0 .. levels-1, then the
query sides. The dk/dv and dq sweeps take every other term of the diagonal tiles; keeping the
six levels' work out of them saves their registers on every tile.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels_pallas.attention.backward_kernels import (KernelConfig, _matmul, _smem_tile,
                                                       _Tile, _Vectors, packed_rows)
from kernels_pallas.attention.common import COMPILER_PARAMS


BLOCKS_PER_PROGRAM = 8


def diagonal_shares_kernel(cfg: KernelConfig, q, k, v, dout, rowp, colp, rowd, cold, beta):
    """q, k, v, dout [B, Tp, H, D]; packs as for dkv_kernel / dq_kernel -> [B, H, nb, 2L, n].

    One program per (head, slice, batch) takes the blocks slice, slice + slices, ... (about
    BLOCKS_PER_PROGRAM of them); the next block's tiles and packs load by TMA into a second
    buffer while the current one is computed."""
    batch, tp, heads, head_dim = q.shape
    n = cfg.block
    nb = tp // n
    slices = -(-nb // BLOCKS_PER_PROGRAM)
    levels = cfg.diag_levels
    row_names, col_names = cfg.row_names(), cfg.col_names()

    def body(q_ref, k_ref, v_ref, do_ref, rowp_ref, colp_ref, rowd_ref, cold_ref, beta_ref,
             out_ref, q_s, k_s, v_s, do_s, rowp_s, colp_s, rowd_s, cold_s, beta_s, out_s, bars):
        h, first, b = lax.axis_index("h"), lax.axis_index("slice"), lax.axis_index("b")
        buffers = (q_s, k_s, v_s, do_s, rowp_s, colp_s, rowd_s, cold_s)

        def fetch(i, slot):
            block = (b, pl.ds(i * n, n), h)
            sources = (q_ref.at[block], k_ref.at[block], v_ref.at[block], do_ref.at[block],
                       rowp_ref.at[b, h, i], colp_ref.at[b, h, i], rowd_ref.at[b, h, i],
                       cold_ref.at[b, h, i])
            for index, (src, dst) in enumerate(zip(sources, buffers)):
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bars.at[2 * index + slot])

        plgpu.copy_gmem_to_smem(beta_ref.at[h], beta_s, bars.at[2 * len(buffers)])
        fetch(first, 0)
        plgpu.barrier_wait(bars.at[2 * len(buffers)])
        beta_value = beta_s[0, 0]
        count = lax.div(nb - 1 - first, slices) + 1

        def step(m, carry):
            i = first + m * slices
            slot = lax.rem(m, 2)

            @pl.when(m + 1 < count)
            def _():
                plgpu.commit_smem()  # order the last step's reads of that slot before the TMA
                fetch(i + slices, 1 - slot)

            for index in range(len(buffers)):
                plgpu.barrier_wait(bars.at[2 * index + slot])
            rows = _Vectors(rowp_s.at[slot], row_names, axis=0)
            cols = _Vectors(colp_s.at[slot], col_names, axis=1)
            diag_rows = _Vectors(rowd_s.at[slot], ["pre"], axis=0)
            diag_cols = _Vectors(cold_s.at[slot], ["suf"], axis=1)
            tile = _Tile(cfg, 0, rows, cols, beta_value)
            scores = None
            if cfg.content:
                scores = _matmul(q_s.at[slot], k_s.at[slot].transpose((1, 0)), (n, n))
            logits, extra = tile.logits_and_bias(scores, True, diag_rows, diag_cols)
            p = tile.probs(logits, tile.mask(True))
            dp = _matmul(do_s.at[slot], v_s.at[slot].transpose((1, 0)), (n, n))
            coef, _ = tile.dead_coef(p * (dp - tile.row("delta")), extra)
            key_sums, query_sums = tile.diagonal_shares(coef, extra["range_min"], diag_rows,
                                                        diag_cols)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last block's shares are out
            for index, total in enumerate(key_sums + query_sums):
                out_s.at[index][...] = beta_value * total
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_s, out_ref.at[b, h, i])
            return carry

        lax.fori_loop(0, count, step, None)
        plgpu.wait_smem_to_gmem(0)

    dtype = q.dtype
    tile_transforms = _smem_tile(n, head_dim, dtype).transforms
    packs = (packed_rows(row_names), packed_rows(col_names), 2 * levels, 2 * levels)
    scratch = [
        *(plgpu.SMEM((2, n, head_dim), dtype, transforms=tile_transforms) for _ in range(4)),
        *(plgpu.SMEM((2, rows, n), jnp.float32) for rows in packs),
        plgpu.SMEM((1, n), jnp.float32),
        plgpu.SMEM((2 * levels, n), jnp.float32),
        plgpu.Barrier(num_barriers=17),
    ]
    body.__name__ = "attention_diagonal_shares_fpa"  # the kernel's name in profiles
    out_type = jax.ShapeDtypeStruct((batch, heads, nb, 2 * levels, n), jnp.float32)
    return plgpu.kernel(
        body, out_type=out_type, scratch_types=scratch, compiler_params=COMPILER_PARAMS,
        grid=(heads, slices, batch), grid_names=("h", "slice", "b"),
    )(q, k, v, dout, rowp, colp, rowd, cold, beta)
