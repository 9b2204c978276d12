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

With key levels a tile whose block has kap = min_s (A_s - psi_s) >= 0 (A_s the key's
exclusive suffix minimum in the block) has no dead pair, since R_ts >= A_s for every pair of
the block: coef = 0, so the program stores zeros and skips the tile's matmuls and elementwise
work (flat fields and every stretch where no key is dead).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.attention.backward_kernels import KernelConfig, Tile, Vectors, packed_rows
from mixer_kernels.mosaic_gpu.attention.common import launch_sizes, per_block, zeros
from mixer_kernels.mosaic_gpu.common import matmul, swizzled_smem


def diagonal_shares_kernel(cfg: KernelConfig, q, k, v, dout, rowp, colp, rowd, cold, beta):
    """q, k, v, dout [B, Tp, H, D]; packs as for dkv_kernel / dq_kernel -> [B, H, nb, 2L, n].

    One block per program: on the H200 this beat programs of about eight blocks each with the
    next block's loads in flight (0.18 against 0.22 ms at (4, 4096, 12, 64), 0.25 against
    0.35 ms at (8, 2048, 16, 128)): the double buffers halved the programs per SM, and the
    kernel is bound by its elementwise work, not by its loads."""
    batch, heads, head_dim, n, nb = launch_sizes(cfg, q)
    levels = cfg.diag_levels
    row_names, col_names = cfg.row_names(), cfg.col_names()

    def body(q_ref, k_ref, v_ref, do_ref, rowp_ref, colp_ref, rowd_ref, cold_ref, beta_ref,
             out_ref, q_s, k_s, v_s, do_s, rowp_s, colp_s, rowd_s, cold_s, beta_s, out_s, bars):
        h, i, b = lax.axis_index("h"), lax.axis_index("blk"), lax.axis_index("b")
        block = (b, pl.ds(i * n, n), h)
        copies = [(q_ref.at[block], q_s), (k_ref.at[block], k_s), (v_ref.at[block], v_s),
                  (do_ref.at[block], do_s), (rowp_ref.at[b, h, i], rowp_s),
                  (colp_ref.at[b, h, i], colp_s), (rowd_ref.at[b, h, i], rowd_s),
                  (cold_ref.at[b, h, i], cold_s), (beta_ref.at[h], beta_s)]
        for index, (src, dst) in enumerate(copies):
            plgpu.copy_gmem_to_smem(src, dst, bars.at[index])
        for index in range(len(copies)):
            plgpu.barrier_wait(bars.at[index])

        rows = Vectors(rowp_s, row_names, axis=0)
        cols = Vectors(colp_s, col_names, axis=1)
        diag_rows = Vectors(rowd_s, ["pre"], axis=0)
        diag_cols = Vectors(cold_s, ["suf"], axis=1)
        beta_value = beta_s[0, 0]
        tile = Tile(cfg, 0, rows, cols, beta_value)

        def shares():
            scores = None
            if cfg.content:
                scores = matmul(q_s, k_s.transpose((1, 0)), (n, n))
            pair_levels = tile.pair_levels()
            suf = tile.level_pieces(pair_levels, diag_cols, "suf")
            pre = tile.level_pieces(pair_levels, diag_rows, "pre")
            logits, extra = tile.logits_and_bias(scores, True, range_min=jnp.minimum(suf, pre))
            p = tile.probs(logits, tile.mask(True))
            dp = matmul(do_s, v_s.transpose((1, 0)), (n, n))
            coef, _ = tile.dead_coef(p * (dp - tile.row("delta")), extra["gap"]())

            def emit(index, total):
                out_s.at[index][...] = beta_value * total

            tile.diagonal_shares(coef, pair_levels, suf, pre, diag_rows, diag_cols, emit)

        if cfg.separable:   # key levels: kap >= 0 means no dead pair (module docstring)
            no_dead = cols.scalar("kap") >= 0.0
            nothing = zeros((n,), plgpu.Layout.WGMMA.reduce(0))

            @pl.when(no_dead)
            def _():
                for index in range(2 * levels):
                    out_s.at[index][...] = nothing

            pl.when(jnp.logical_not(no_dead))(shares)
        else:
            shares()
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_s, out_ref.at[b, h, i])
        plgpu.wait_smem_to_gmem(0)

    dtype = q.dtype
    scratch = [
        swizzled_smem((n, head_dim), dtype), swizzled_smem((n, head_dim), dtype),
        swizzled_smem((n, head_dim), dtype), swizzled_smem((n, head_dim), dtype),
        plgpu.SMEM((packed_rows(row_names), n), jnp.float32),
        plgpu.SMEM((packed_rows(col_names), n), jnp.float32),
        plgpu.SMEM((2 * levels, n), jnp.float32),
        plgpu.SMEM((2 * levels, n), jnp.float32),
        plgpu.SMEM((1, n), jnp.float32),
        plgpu.SMEM((2 * levels, n), jnp.float32),
        plgpu.Barrier(num_barriers=9),
    ]
    out_type = jax.ShapeDtypeStruct((batch, heads, nb, 2 * levels, n), jnp.float32)
    return per_block(body, "attention_diagonal_shares_fpa", out_type, scratch,
                     (batch, heads, nb), "blk")(q, k, v, dout, rowp, colp, rowd, cold, beta)
