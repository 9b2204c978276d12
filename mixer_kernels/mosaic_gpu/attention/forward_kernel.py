"""Mosaic GPU forward kernel of causal attention with a per-row / per-column score bias.

One program per (head, query block i, batch), one warpgroup, n x n tiles (n = 64). The
program visits key blocks j = i, i-1, ..., j_lo (j_lo: first block of the query block's
earliest document) and keeps a float32 online softmax:

    logit_ts = scale <q_t, k_s> + b_ts   (masked: s <= t, s >= doc_start_t)
    m_t = max logit,  l_t = sum exp(logit - m_t),  acc_t = sum exp(logit - m_t) v_s
    out_t = acc_t / l_t,  lse_t = m_t + log l_t   (natural log; finite: key t is always valid)

The tile works in base 2 (logits times log2 e, so exp2 needs no multiply); the separable
row / col vectors arrive pre-multiplied by log2 e; pruning scalars stay in nats.

Bias modes (static):
    "none":       b = 0
    "separable":  b_ts = row_t - col_s
    "fpa":        b_ts = beta min(0, R_ts - level),  level = psi_s (psi_t with query_level)
                  diagonal tile: R_ts = min(dsuf_L[s], dpre_L[t]) at the dyadic level L of the
                  pair (t and s share a group of 2^(L+1) positions but not of 2^L), BIG for s = t;
                  off-diagonal: R_ts = min(A_s, G, C_t), G = running minimum of the block minima
                  of the blocks strictly between j and i.

Pruning (static switch): an off-diagonal tile is skipped when

    bound(i, j) + qn_i * kn_j < dmin_i - margin
    qn_i = scale max_{t in I} |q_t|,  kn_j = max_{s in J} |k_s|,  dmin_i = min_{t in I} scale <q_t, k_t>
    bound: separable  rmax_i - cmin_j
           fpa key    beta min(0, G - kp_j, cmax_i - kp_j)         kp_j = min_s psi_s, cmax_i = max_t C_t
           fpa query  beta min(0, qc_i, G - qp_i)                 qc_i = max_t (C_t - psi_t),
                                                                 qp_i = min_t psi_t

Every logit of a skipped tile lies below margin + the row's own diagonal logit, so dropping it
changes the row's normaliser by at most T e^-margin relative. The vectors and per-block
scalars arrive packed: row pack [B, H, nb, rows, n] (query block), column pack
[B, H, nb, cols, n] (key block); a scalar row repeats its value n times.
Pipeline (TMA): key / value blocks are double-buffered (slot j mod 2) and column packs
triple-buffered (slot j mod 3). While tile j is computed, the column pack of j - 2 and the
keys / values of j - 1 are in flight; with pruning, j - 1's skip decision is taken first (it
needs j - 1's column pack and the gap minimum after j), and a pruned tile's keys and values
are never loaded. P @ V takes P from registers (p_in_registers) or through shared memory (the
GPU interpreter of the tests supports wgmma only from shared memory); nothing else differs.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.attention.common import (BIG, BLOCK, LOG2E, launch_sizes,
                                                       no_dead_floor, pair_levels, per_block)
from mixer_kernels.mosaic_gpu.common import matmul, swizzled_smem

LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
    mode: str                 # "none" | "separable" | "fpa"
    scale: float
    block: int = BLOCK
    segments: bool = False
    query_level: bool = False
    content: bool = True
    prune: bool = False
    margin: float = 0.0
    count_pruned: bool = False
    p_in_registers: bool = True   # wgmma reads P from registers; False: via shared memory
                                  # (the GPU interpreter supports only the latter)
    float32_out: bool = False     # also write out in float32 (the FPA backward's residual)

    @property
    def levels(self):
        return self.block.bit_length() - 1  # dyadic levels of a diagonal tile

    @property
    def unbiased_tiles(self):
        """Off-diagonal FPA tiles with no dead pair (a per-block bound) skip the bias."""
        return self.mode == "fpa" and not self.query_level

    def row_names(self):
        """Rows of the per-query-block pack (vectors along t, then scalars)."""
        names = ["start"] if self.segments else []
        if self.mode == "separable":
            names.append("row")
            names += ["qn", "dmin", "rmax"] if self.prune else []
        elif self.mode == "fpa":
            names += ["pre", "beta"]
            names += [f"dpre{level}" for level in range(self.levels)]
            names += [f"dsuf{level}" for level in range(self.levels)]
            names += ["psi"] if self.query_level else ["dpsi", "clo"]
            if self.prune:
                names += ["qn", "dmin"] + (["qc", "qp"] if self.query_level else ["cmax"])
        return names

    def col_names(self):
        """Rows of the per-key-block pack."""
        if self.mode == "separable":
            return ["col"] + (["kn", "cmin"] if self.prune else [])
        if self.mode == "fpa":
            names = ["suf", "bmin"] if self.query_level else ["key_gap", "bmin", "psi", "kap",
                                                              "kpmax"]
            if self.prune:
                names += ["kn"] + ([] if self.query_level else ["kp"])
            return names
        return []


class _Pack:
    """Named rows of a packed [rows, n] SMEM block; `preload` reads loop-invariant ones once."""

    def __init__(self, ref, names):
        self.ref, self.names, self.loaded = ref, names, {}

    def _load(self, name, axis):
        return plgpu.load(self.ref.at[self.names.index(name)],
                          layout=plgpu.Layout.WGMMA.reduce(1 - axis))

    def preload(self, vectors, scalars):
        """vectors: names of rows used along tile axis 0 (over t); scalars: scalar rows."""
        for name in (v for v in vectors if v in self.names):
            self.loaded[name, 0] = self._load(name, 0)
        for name in (v for v in scalars if v in self.names):
            self.loaded[name] = self.ref[self.names.index(name), 0]

    def vector(self, name, axis):
        """Row `name` as a vector along tile axis `axis` (0: over t)."""
        row = self.loaded.get((name, axis))
        return self._load(name, axis) if row is None else row

    def vec(self, name, axis, shape):
        """Row `name` broadcast along tile axis 1 - axis (axis 0: a vector over t)."""
        return lax.broadcast_in_dim(self.vector(name, axis), shape, [axis])

    def scalar(self, name):
        value = self.loaded.get(name)
        return self.ref[self.names.index(name), 0] if value is None else value


def forward_kernel(cfg: ForwardConfig, q, k, v, rowp, colp):
    """q, k, v [B, Tp, H, D]; packs as in the module docstring -> out [B, Tp, H, D],
    lse [B, H, Tp] float32 (then pruned-tile counts [B, H, nb, n] float32 if count_pruned, and
    out in float32 [B, Tp, H, D] if float32_out)."""
    batch, heads, head_dim, n, nb = launch_sizes(cfg, q)
    fpa = cfg.mode == "fpa"
    row_names, col_names = cfg.row_names(), cfg.col_names()
    shape = (n, n)
    ncols = max(len(col_names), 1)

    out_types = [jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, nb * n), jnp.float32)]
    if cfg.count_pruned:
        out_types.append(jax.ShapeDtypeStruct((batch, heads, nb, n), jnp.float32))
    if cfg.float32_out:
        out_types.append(jax.ShapeDtypeStruct(q.shape, jnp.float32))

    def body(q_ref, k_ref, v_ref, rowp_ref, colp_ref, out_ref, lse_ref, *rest):
        rest = list(rest)
        count_ref = rest.pop(0) if cfg.count_pruned else None
        out32_ref = rest.pop(0) if cfg.float32_out else None
        q_s, rowp_s, lse_s, bars = rest
        h = lax.axis_index("h")
        i = nb - 1 - lax.axis_index("qb")  # longest rows first
        b = lax.axis_index("b")
        queries = (b, pl.ds(i * n, n), h)
        plgpu.copy_gmem_to_smem(q_ref.at[queries], q_s, bars.at[0])
        if row_names:
            plgpu.copy_gmem_to_smem(rowp_ref.at[b, h, i], rowp_s, bars.at[1])

        def sweep(k_s, v_s, colp_s, p_s=None):
            """The online softmax over the key blocks; its buffers are scoped, so that the
            epilogue's float32 staging reuses their shared memory."""
            def fetch_kv(j):
                slot, keys = lax.rem(j, 2), (b, pl.ds(j * n, n), h)
                if cfg.content:
                    plgpu.copy_gmem_to_smem(k_ref.at[keys], k_s.at[slot], bars.at[2 + slot])
                plgpu.copy_gmem_to_smem(v_ref.at[keys], v_s.at[slot], bars.at[4 + slot])

            def wait_kv(j):
                slot = lax.rem(j, 2)
                if cfg.content:
                    plgpu.barrier_wait(bars.at[2 + slot])
                plgpu.barrier_wait(bars.at[4 + slot])

            def fetch_cols(j):
                slot = lax.rem(j, 3)
                plgpu.copy_gmem_to_smem(colp_ref.at[b, h, j], colp_s.at[slot], bars.at[6 + slot])

            def wait_cols(j):
                plgpu.barrier_wait(bars.at[6 + lax.rem(j, 3)])

            fetch_kv(i)
            if col_names:
                fetch_cols(i)
            plgpu.barrier_wait(bars.at[0])
            if row_names:
                plgpu.barrier_wait(bars.at[1])
            rows = _Pack(rowp_s, row_names)
            rows.preload(("start", "row", "pre", "psi"),
                         ("start", "beta", "qn", "dmin", "rmax", "cmax", "qc", "qp"))
            t_local = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
            s_local = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
            if cfg.segments:
                first_start = rows.scalar("start").astype(jnp.int32)
                j_lo = lax.div(first_start, n)
            else:
                j_lo = 0
            if col_names:
                pl.when(i - 1 >= j_lo)(lambda: fetch_cols(i - 1))
                wait_cols(i)
            beta = rows.scalar("beta") if fpa else None

            def tile_bias(cols, diagonal, gap_min):
                if cfg.mode == "none":
                    return None
                if cfg.mode == "separable":
                    return rows.vec("row", 0, shape) - cols.vec("col", 1, shape)
                if diagonal:
                    range_min = jnp.full(shape, BIG, jnp.float32)
                    # each pair s < t's dyadic level: the highest set bit of t XOR s (per-level
                    # masks from the iotas instead took 167 registers against 157 on an H100,
                    # docs/benchmarks.md "The query-minimum path")
                    levels = pair_levels(t_local, s_local)
                    for level in range(cfg.levels):
                        piece = jnp.minimum(rows.vec(f"dsuf{level}", 1, shape),
                                            rows.vec(f"dpre{level}", 0, shape))
                        range_min = jnp.where(levels == level, piece, range_min)
                    level = rows.vec("psi", 0, shape) if cfg.query_level else rows.vec("dpsi", 1, shape)
                    return (beta * LOG2E) * jnp.minimum(range_min - level, 0.0)
                # off the diagonal min(0, min(A_s, G, C_t) - level) as two operations per
                # pair, G folded into the vector over the queries (the tile's rows: 2 values
                # a thread, where a vector over the keys costs half a tile operation):
                #   key level    min(key_gap_s, min(C_t, G) - psi_s),  key_gap_s = min(0, A_s - psi_s)
                #   query level  min(min(0, C_t - psi_t, G - psi_t), A_s - psi_t)
                # equal bit for bit (rounding is monotone: min(A, G) - psi = min(A - psi, G - psi))
                over_keys = lambda x: lax.broadcast_in_dim(x, shape, [1])
                over_queries = lambda x: lax.broadcast_in_dim(x, shape, [0])
                if cfg.query_level:
                    level = rows.vector("psi", 0)
                    folded = jnp.minimum(jnp.minimum(rows.vector("pre", 0) - level, 0.0),
                                         gap_min - level)
                    gap = jnp.minimum(over_queries(folded),
                                      over_keys(cols.vector("suf", 1)) - over_queries(level))
                else:
                    low = jnp.minimum(rows.vector("pre", 0), gap_min)
                    gap = jnp.minimum(over_keys(cols.vector("key_gap", 1)),
                                      over_queries(low) - over_keys(cols.vector("psi", 1)))
                return (beta * LOG2E) * gap

            def compute(j, slot, cols, diagonal, gap_min, state, biased=True):
                acc, m, l = state
                logits = tile_bias(cols, diagonal, gap_min) if biased else None
                if cfg.content:
                    scores = (cfg.scale * LOG2E) * matmul(q_s, k_s.at[slot].transpose((1, 0)), shape)
                    logits = scores if logits is None else scores + logits
                elif logits is None:
                    logits = plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)
                valid = None
                if diagonal:
                    valid = s_local <= t_local
                if cfg.segments:
                    same = (s_local + j * n) >= rows.vec("start", 0, shape).astype(jnp.int32)
                    valid = same if valid is None else valid & same
                if valid is not None:
                    logits = jnp.where(valid, logits, -jnp.inf)
                m_new = jnp.maximum(m, logits.max(axis=1))
                alpha = jnp.exp2(m - m_new)
                p = jnp.exp2(logits - lax.broadcast_in_dim(m_new, shape, [0]))
                l = l * alpha + p.sum(axis=1)
                acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                if cfg.p_in_registers:
                    def accumulate(acc_ref):
                        plgpu.wgmma(acc_ref, p.astype(q.dtype), v_s.at[slot])
                    acc = pl.run_state(accumulate)(plgpu.ACC.init(acc))
                else:
                    p_s[...] = p.astype(p_s.dtype)
                    plgpu.commit_smem()
                    acc = acc + matmul(p_s, v_s.at[slot], (n, head_dim))
                return acc, m_new, l

            def skip_tile(cols, gap_min):
                qn_kn = rows.scalar("qn") * cols.scalar("kn")
                if cfg.mode == "separable":
                    bound = rows.scalar("rmax") - cols.scalar("cmin")
                elif cfg.query_level:
                    bound = jnp.minimum(rows.scalar("qc"), gap_min - rows.scalar("qp"))
                    bound = beta * jnp.minimum(bound, 0.0)
                else:
                    kp = cols.scalar("kp")
                    bound = jnp.minimum(gap_min, rows.scalar("cmax")) - kp
                    bound = beta * jnp.minimum(bound, 0.0)
                return bound + qn_kn < rows.scalar("dmin") - cfg.margin

            def step(j, carry, diagonal):
                """Tile (i, j); also fetches ahead: column pack of j - 2, key / value of j - 1
                (unless pruned: its decision needs j - 1's column pack and the gap after j)."""
                state, gap_min, skip, pruned = carry
                has_next = j - 1 >= j_lo
                if col_names:
                    pl.when(j - 2 >= j_lo)(lambda: fetch_cols(j - 2))
                cols = _Pack(colp_s.at[lax.rem(j, 3)], col_names)
                gap_next = gap_min
                if fpa and not diagonal:
                    gap_next = jnp.minimum(gap_min, cols.scalar("bmin"))
                if cfg.prune:
                    pl.when(has_next)(lambda: wait_cols(j - 1))
                    next_cols = _Pack(colp_s.at[lax.rem(j - 1, 3)], col_names)
                    skip_next = has_next & skip_tile(next_cols, gap_next)
                    pl.when(has_next & jnp.logical_not(skip_next))(lambda: fetch_kv(j - 1))
                else:
                    skip_next = skip
                    pl.when(has_next)(lambda: fetch_kv(j - 1))
                    if col_names:
                        pl.when(has_next)(lambda: wait_cols(j - 1))
                run = lambda s: compute(j, lax.rem(j, 2), cols, diagonal, gap_min, s)
                if cfg.unbiased_tiles and not diagonal:
                    floor = no_dead_floor(cols.scalar("kap"), cols.scalar("kpmax"), gap_min,
                                          rows.scalar("clo"))
                    biased_run, plain_run = run, lambda s: compute(
                        j, lax.rem(j, 2), cols, diagonal, gap_min, s, biased=False)
                    run = lambda s: lax.cond(floor >= 0.0, plain_run, biased_run, s)
                if cfg.prune and not diagonal:
                    pl.when(jnp.logical_not(skip))(lambda: wait_kv(j))
                    state = lax.cond(skip, lambda s: s, run, state)
                    if cfg.count_pruned:
                        pruned = pruned + skip.astype(jnp.float32)
                else:
                    wait_kv(j)
                    state = run(state)
                return state, gap_next, skip_next, pruned

            acc = plgpu.layout_cast(jnp.zeros((n, head_dim), jnp.float32), plgpu.Layout.WGMMA)
            m = plgpu.layout_cast(jnp.full((n,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            l = plgpu.layout_cast(jnp.zeros((n,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            gap_min = jnp.float32(BIG)
            pruned = jnp.float32(0.0)
            carry = step(i, ((acc, m, l), gap_min, jnp.bool_(False), pruned), diagonal=True)

            def off_diagonal(offset, c):
                return step(i - 1 - offset, c, diagonal=False)

            (acc, m, l), _, _, pruned = lax.fori_loop(0, i - j_lo, off_diagonal, carry)
            return (acc, m, l), (pruned if cfg.count_pruned else None)

        (acc, m, l), pruned = pl.run_scoped(sweep, *sweep_scratch)
        out = acc / lax.broadcast_in_dim(l, acc.shape, [0])

        def epilogue(out32_s=None, count_s=None):
            q_s[...] = out.astype(q_s.dtype)
            if out32_s is not None:
                out32_s[...] = out
            lse_s[...] = m * LN2 + jnp.log(l)
            if count_s is not None:
                count_s[...] = plgpu.layout_cast(jnp.full((n,), 0.0, jnp.float32) + pruned,
                                                 plgpu.Layout.WGMMA.reduce(1))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_s, out_ref.at[queries])
            if out32_s is not None:
                plgpu.copy_smem_to_gmem(out32_s, out32_ref.at[queries])
            plgpu.copy_smem_to_gmem(lse_s, lse_ref.at[b, h, pl.ds(i * n, n)])
            if count_s is not None:
                plgpu.copy_smem_to_gmem(count_s, count_ref.at[b, h, i])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(epilogue, **epilogue_scratch)

    dtype = q.dtype
    scratch = [
        swizzled_smem((n, head_dim), dtype),
        plgpu.SMEM((max(len(row_names), 1), n), jnp.float32),
        plgpu.SMEM((n,), jnp.float32),
        plgpu.Barrier(num_barriers=9),
    ]
    # scoped: the sweep's buffers, then in the same shared memory the epilogue's staging
    sweep_scratch = [swizzled_smem((2, n, head_dim), dtype), swizzled_smem((2, n, head_dim), dtype),
                     plgpu.SMEM((3, ncols, n), jnp.float32)]
    if not cfg.p_in_registers:
        sweep_scratch.append(swizzled_smem((n, n), dtype))
    epilogue_scratch = {}
    if cfg.float32_out:
        epilogue_scratch["out32_s"] = swizzled_smem((n, head_dim), jnp.float32)
    if cfg.count_pruned:
        epilogue_scratch["count_s"] = plgpu.SMEM((n,), jnp.float32)
    return per_block(body, f"attention_forward_{cfg.mode}", tuple(out_types), scratch,
                     (batch, heads, nb), "qb")(q, k, v, rowp, colp)
