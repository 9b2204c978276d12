"""Mosaic GPU backward kernels of causal attention with a per-row / per-column score bias.

Tiles are n x n (n = 64, one warpgroup, wgmma), recomputed from q, k, v, the saved row
log-sum-exp (natural log) and delta_t = <dout_t, out_t>:

    logit_ts = scale <q_t, k_s> + b_ts      P_ts = exp(logit_ts - lse_t) [valid]

(the tiles work in base 2, as the forward does: logits, the separable bias rows and lse arrive
times log2 e, and P = exp2(...), so no tile multiplies before its exponential; lse enters the
scores' multiply-add, and the separable mode's row pack holds row_t - lse_t)
    dP_ts = <dout_t, v_s>    dS_ts = P_ts (dP_ts - delta_t)
    dq_t = scale sum_s dS_ts k_s    dk_s = scale sum_t dS_ts q_t    dv_s = sum_t P_ts dout_t

valid: s <= t and doc(s) == doc(t). Bias modes (static):

    "none":       b = 0
    "separable":  b_ts = row_t - col_s;  d row_t = sum_s dS_ts,  d col_s = -sum_t dS_ts
                  (both sums of the same float32 dS, so their rounding errors match)
    "fpa":        b_ts = beta min(0, R_ts - level),  level = psi_s (psi_t with query_level),
                  R_ts = min(A_s, G, C_t) off the diagonal, the dyadic range minimum on it
                  (fields.py); coef = beta [dead] dS;  d level -= sum coef;
                  d beta_s += sum_t [dead] (R - level) dS;  per row, dsum_t = sum_s dS_ts and
                  pgap_t = sum_s P_ts [dead] (R - level), so that backward.py can centre
                  d beta per row: sum_t dsum_t pgap_t is subtracted (dsum_t is 0 in exact
                  arithmetic; in bf16 it carries the row's error of delta_t, which then
                  cancels out of d beta; docs/benchmarks.md "bf16 gradient precision");
                  soft-min shares of coef per piece: share = coef / mass,
                  mass = sum over pieces of mass_piece exp(-(min_piece - R)/tau)

FPA's field terms take one of four paths per off-diagonal tile (level psi_s; `_share_path`,
from per-block bounds): no dead pair (a plain softmax tile: no bias, no field work), separable
(the pieces' weights relative to one tile minimum r: exponentials per key and per query, one
reciprocal per pair), its query-minimum case (every pair dead with R_ts = min(G, C_t), as on
FoX's fields: the bias from one subtraction per pair and no dead mask) or row-referenced
(weights relative to m_t = min(G, C_t) and one exponential of -|m_t - A_s| per pair; exact for
any spread). Query levels take the exact
shares. The gap's minimum and soft-min mass are scalars carried along the sweep. The diagonal
tiles' per-level shares come from a third kernel (backward_diagonal_kernel.py), which keeps their
six levels' work out of the two sweeps (it cost them registers and spills on every tile).

Two sweep kernels, no atomics: `dkv` runs one program per key block j over query blocks i >= j
(dk, dv, column sums, and the per-tile gap totals), `dq` one per query block i over key blocks
j <= i (dq, row sums). Each recomputes the tile; the next query/key block's tiles are prefetched
by TMA into a second buffer while the current one is computed. (One sweep whose `dkv` also adds
each tile's dq and row sums into float32 accumulators by TMA reductions measured slower on an
H200: docs/benchmarks.md, "One sweep".) Matmul operands that the
kernel computes (P, dS) feed wgmma from registers (lhs_in_registers, the compiled default: no
shared-memory staging, 16 KB less shared memory per dk/dv program and 8 KB per dq program) or
through shared memory (the GPU interpreter of the tests supports wgmma only from there).

Per-block vectors travel packed: [B, H, nb, rows, n] float32, one TMA per block.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_kernels.mosaic_gpu.attention.common import (
    BIG, BLOCK, LOG2E, launch_sizes, no_dead_floor, pair_levels, per_block, reciprocal, zeros)
from mixer_kernels.mosaic_gpu.attention.common import decay
from mixer_kernels.mosaic_gpu.common import matmul, swizzled_smem

# Pack rows read as vectors along a tile axis; every other name is a per-block scalar, and a
# block's scalars share one packed row (the k-th scalar of `pack_layout` at lane k).
VECTOR_ROWS = frozenset({"lse", "delta", "seg", "row", "col", "pre_min", "pre_mass", "suf_min",
                         "suf_mass", "psi", "pre_wmass", "suf_wmass", "key_gap"})
# Largest spread (in units of tau) of the field pieces inside one off-diagonal tile for which
# the soft-min weights are taken relative to one tile minimum (no weight underflows to 0).
SEPARABLE_SPREAD = 80.0


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    mode: str                 # "none" | "separable" | "fpa"
    scale: float
    block: int = BLOCK
    segments: bool = False
    tau: float = 1.0
    query_level: bool = False
    content: bool = True
    prune: bool = False       # skip the forward's pruned tiles and other documents' tiles
    margin: float = 0.0
    lhs_in_registers: bool = False  # P, dS as wgmma operands from registers (compiled only;
                                    # backward.kernel_config picks it outside the interpreter)
    overlap_dq: bool = False  # dq: issue the scores' and dP's matmuls together and form P
    overlap_dkv: bool = False  # (bias, exp) while dP's is in flight; dk/dv likewise

    @property
    def skips(self):
        return self.prune and (self.mode != "none" or self.segments)

    @property
    def prunes(self):
        return self.prune and self.mode != "none"

    @property
    def separable(self):
        """Off-diagonal FPA tiles may take the separable or no-dead-key share paths."""
        return self.mode == "fpa" and not self.query_level

    @property
    def diag_levels(self):
        return (self.block.bit_length() - 1) if self.mode == "fpa" else 0

    def row_names(self):
        """Rows of the per-query-block input pack."""
        names = (["delta"] if self.mode == "separable" else ["lse", "delta"])
        names += ["seg"] if self.segments else []
        if self.mode == "separable":
            names.append("row")   # the bias row less lse (backward.prepare)
        elif self.mode == "fpa":
            names += ["pre_min", "pre_mass", "bmin", "bmass"]
            names += ["psi"] if self.query_level else ["chi", "pre_wmass"]
        if self.prunes:
            names += ["qn", "dmin"]
            if self.mode == "separable":
                names.append("rmax")
            else:
                names += ["qc", "qp"] if self.query_level else ["cmax"]
        return names

    def col_names(self):
        """Rows of the per-key-block input pack."""
        names = ["seg"] if self.segments else []
        if self.mode == "separable":
            names.append("col")
        elif self.mode == "fpa":
            names += ["suf_min", "suf_mass", "bmin", "bmass"]
            names += [] if self.query_level else ["psi", "alo", "kap", "kpmax", "kp",
                                                  "suf_wmass", "key_gap"]
        if self.skips and self.segments:
            names.append("dend")
        if self.prunes:
            names.append("kn")
            if self.mode == "separable":
                names.append("cmin")
        return names

    def col_out_names(self):
        """Rows of dkv's per-key-block output ("share": the block-level key-side shares; the
        diagonal tiles' per-level shares come from backward_diagonal_kernel.py)."""
        if self.mode == "separable":
            return ["dcol"]
        if self.mode == "fpa":
            return ([] if self.query_level else ["dpsi"]) + ["dbeta", "share"]
        return []

    def row_out_names(self):
        """Rows of the per-query-block row sums (dq's output)."""
        if self.mode == "separable":
            return ["drow"]
        if self.mode == "fpa":
            return (["dpsi"] if self.query_level else []) + ["share", "dsum", "pgap"]
        return []


def pack_layout(names):
    """(vector rows, scalars) of a pack holding `names`: the vectors' rows come first, then
    (if any scalars) one row with the block's scalars at lanes 0, 1, ..."""
    vectors = [name for name in names if name in VECTOR_ROWS]
    return vectors, [name for name in names if name not in VECTOR_ROWS]


def packed_rows(names):
    """Rows of the packed block that holds `names` (at least 1)."""
    vectors, scalars = pack_layout(names)
    return max(len(vectors) + (1 if scalars else 0), 1)


class Vectors:
    """Named rows of a packed [rows, n] SMEM block (`pack_layout`), loaded as vectors along
    one tile axis, and the block's scalars."""

    def __init__(self, ref, names, axis):
        self.ref, self.axis = ref, axis
        self.names, self.scalars = pack_layout(names)

    def vec(self, name, row=None):
        index = self.names.index(name) if row is None else row
        return plgpu.load(self.ref.at[index], layout=plgpu.Layout.WGMMA.reduce(1 - self.axis))

    def full(self, name, shape, row=None):
        return lax.broadcast_in_dim(self.vec(name, row), shape, [self.axis])

    def scalar(self, name):
        """A per-block scalar (or a vector row's first value)."""
        if name in self.scalars:
            return self.ref[len(self.names), self.scalars.index(name)]
        return self.ref[self.names.index(name), 0]


def _skip_tile(cfg, rows, cols, gap_min, beta):
    """The forward's pruning test of an off-diagonal tile (forward_kernel.py), as a scalar."""
    qn_kn = rows.scalar("qn") * cols.scalar("kn")
    if cfg.mode == "separable":
        bound = rows.scalar("rmax") - cols.scalar("cmin")
    elif cfg.query_level:
        bound = beta * jnp.minimum(jnp.minimum(rows.scalar("qc"), gap_min - rows.scalar("qp")), 0.0)
    else:
        bound = jnp.minimum(gap_min, rows.scalar("cmax")) - cols.scalar("kp")
        bound = beta * jnp.minimum(bound, 0.0)
    return bound + qn_kn < rows.scalar("dmin") - cfg.margin


def _share_path(cfg, rows, cols, gap_min):
    """Per off-diagonal FPA tile (level psi_s, gap minimum G): (r, path). r = min(alo_j, G,
    clo_i) is the lowest field value of any piece of the tile. path 0: no pair is dead, since
    R_ts - psi_s >= min(kap_j, min(G, clo_i) - kpmax_j) >= 0 (no field gradient); path 1:
    every R_ts <= min(G, chi_i) lies within SEPARABLE_SPREAD tau of r, so the soft-min weights
    relative to r keep every dead pair's mass above e^-SPREAD (separable shares: no
    exponential per pair); path 2: the row-referenced shares (one exponential per pair);
    path 3: path 1 where moreover min(G, chi_i) <= alo_j and min(G, chi_i) < kp_j (the key
    block's lowest level): every pair's range minimum is its query side, R_ts = min(G, C_t),
    and every pair is dead, so u = min(G, C_t) - psi_s bit for bit (`Tile.level_gap`) and
    coef = dS (FoX's fields take it on every off-diagonal tile)."""
    clo = rows.scalar("bmin")
    r = jnp.minimum(jnp.minimum(cols.scalar("alo"), gap_min), clo)
    high = jnp.minimum(gap_min, rows.scalar("chi"))   # the largest min(G, C_t) of the tile
    spread = (high - r) * (1.0 / cfg.tau)
    floor = no_dead_floor(cols.scalar("kap"), cols.scalar("kpmax"), gap_min, clo)
    query_min = (high <= cols.scalar("alo")) & (high < cols.scalar("kp"))
    separable = jnp.where(query_min, 3, 1)
    path = jnp.where(floor >= 0.0, 0, jnp.where(spread <= SEPARABLE_SPREAD, separable, 2))
    return r, path


def _by_path(compute, path):
    """compute(state), or, off the diagonal of an FPA tile with a share path, a plain softmax
    tile (compute(state, field_work=False)) on path 0 and the query-minimum tile
    (compute(state, query_min=True)) on path 3, a branch nested in the dead-pair branch."""
    if path is None:
        return compute
    plain = functools.partial(compute, field_work=False)
    dead = lambda state: lax.cond(path == 3, functools.partial(compute, query_min=True),
                                  compute, state)
    return lambda state: lax.cond(path == 0, plain, dead, state)


def _probs_during_dp(probs_of, lhs, rhs, d_lhs, d_rhs, shape):
    """(p, extra, dP): the scores' matmul lhs @ rhs and dP's, d_lhs @ d_rhs, issued together;
    (p, extra) = probs_of(scores) runs while dP's matmul is in flight (it holds a second
    accumulator tile meanwhile). A diagonal tile's gap ("gap_tile") leaves the scope as an
    array; extra's other entries recompute from shared memory and live outside it."""
    captured = {}

    def body(scores_acc, dp_acc):
        plgpu.wgmma(scores_acc, lhs, rhs)
        plgpu.wgmma(dp_acc, d_lhs, d_rhs)
        p, extra = probs_of(plgpu.wgmma_accumulator_load(scores_acc, wait_n=1))
        gap_tile = None
        if extra is not None and "gap_tile" in extra:
            gap_tile = extra["gap_tile"]
            extra = {key: value for key, value in extra.items() if key not in ("gap", "gap_tile")}
        captured["extra"] = extra
        return p, gap_tile, plgpu.wgmma_accumulator_load(dp_acc, wait_n=0)

    p, gap_tile, dp = pl.run_scoped(body, plgpu.ACC(shape, jnp.float32),
                                    plgpu.ACC(shape, jnp.float32))
    extra = captured["extra"]
    if gap_tile is not None:
        extra = dict(extra, gap=lambda: gap_tile)
    return p, extra, dp


def _probs_and_dp(cfg, overlap, probs_of, score_operands, dp_operands, shape, use_probs=None):
    """(p, extra, dP, use_probs(p)) of one tile. Sequential: the scores' matmul (with
    content), (p, extra) = probs_of(scores), use_probs(p) (dk/dv: dv's matmul), then dP's
    matmul. Overlapped (overlap and content): `_probs_during_dp`, then use_probs(p)."""
    use_probs = use_probs or (lambda p: None)
    if cfg.content and overlap:
        p, extra, dp = _probs_during_dp(probs_of, *score_operands, *dp_operands, shape)
        return p, extra, dp, use_probs(p)
    p, extra = probs_of(matmul(*score_operands, shape) if cfg.content else None)
    used = use_probs(p)
    return p, extra, matmul(*dp_operands, shape), used


def _accumulate(cfg, acc, lhs, lhs_smem, rhs_smem, during=None, state=()):
    """(acc + lhs @ rhs_smem, during(state)): lhs a float32 tile in registers, cast to the
    input dtype; during (elementwise work on other values, returning a tuple like state) runs
    while the matmul is in flight.

    With cfg.lhs_in_registers the wgmma reads lhs from registers and accumulates into acc in
    place (no second accumulator tile); otherwise lhs is staged in lhs_smem (the GPU
    interpreter of the tests supports only that form) and `during` runs after the matmul. (On
    the H200, running it during or after the matmul took the same time.) A ref slot that rhs_smem indexes must be traced (a
    Python int fails in run_state).
    """
    if not cfg.lhs_in_registers:
        lhs_smem[...] = lhs.astype(lhs_smem.dtype)
        plgpu.commit_smem()
        acc = acc + matmul(lhs_smem, rhs_smem, acc.shape)
        return acc, (tuple(state) if during is None else during(tuple(state)))
    operand = lhs.astype(rhs_smem.dtype)
    if during is None:
        acc = pl.run_state(lambda acc_ref: plgpu.wgmma(acc_ref, operand, rhs_smem))(
            plgpu.ACC.init(acc))
        return acc, (tuple(state) if during is None else during(tuple(state)))

    def body(refs):
        acc_ref, state_refs = refs
        plgpu.wgmma(acc_ref, operand, rhs_smem)
        for ref, value in zip(state_refs, during(tuple(ref[...] for ref in state_refs))):
            ref[...] = value

    return pl.run_state(body)((plgpu.ACC.init(acc), tuple(state)))


def _store_rows(pack_s, vectors):
    """Stores the [n] vectors as the rows 0, 1, ... of the SMEM pack pack_s [R, n]."""
    for index, vector in enumerate(vectors):
        pack_s.at[index][...] = vector


class Tile:
    """Elementwise work of one n x n tile. query_axis: 1 in `dkv` ([s, t]), 0 in `dq` ([t, s])."""

    def __init__(self, cfg: KernelConfig, query_axis, rows: Vectors, cols: Vectors, beta):
        self.cfg, self.qa, self.ka = cfg, query_axis, 1 - query_axis
        self.rows, self.cols, self.beta = rows, cols, beta
        n = cfg.block
        self.shape = (n, n)
        iota = lambda axis: plgpu.broadcasted_iota(jnp.int32, self.shape, axis,
                                                   layout=plgpu.Layout.WGMMA)
        self.t_local, self.s_local = iota(self.qa), iota(self.ka)

    def row(self, name, row=None):
        return self.rows.full(name, self.shape, row)

    def col(self, name, row=None):
        return self.cols.full(name, self.shape, row)

    def sum_over_queries(self, x):
        return x.sum(axis=self.qa)

    def sum_over_keys(self, x):
        return x.sum(axis=self.ka)

    def mask(self, diagonal):
        valid = None
        if diagonal:
            valid = self.s_local <= self.t_local
        if self.cfg.segments:
            same = self.row("seg") == self.col("seg")
            valid = same if valid is None else valid & same
        return valid

    def pair_levels(self):
        """Dyadic level of each pair s < t of a diagonal tile, -1 elsewhere: the L with
        2^L <= t XOR s < 2^(L+1) (t and s share their bits above L and differ at L), the
        highest set bit of t XOR s, 31 - clz (one count-leading-zeros instruction). One
        integer tile; a level's mask is `levels == L` where it is used."""
        return pair_levels(self.t_local, self.s_local)

    def level_pieces(self, pair_levels, vectors, name, first_row=0):
        """[n, n]: each pair's row `first_row + level` of the packed level vectors `name`
        (the suffix side's along keys, the prefix side's along queries); pairs outside the
        levels take level 0's."""
        picked = None
        for level in range(self.cfg.diag_levels):
            piece = vectors.full(name, self.shape, row=first_row + level)
            picked = piece if picked is None else jnp.where(pair_levels == level, piece, picked)
        return picked

    def fpa_range_min(self, diagonal, diag_rows, diag_cols, gap_min):
        """Range minimum R [n, n]: min(A_s, G, C_t) off the diagonal (gap_min = G, a scalar),
        per dyadic level min(suf_min[L, s], pre_min[L, t]) on it."""
        if not diagonal:
            return jnp.minimum(jnp.minimum(self.col("suf_min"), gap_min), self.row("pre_min"))
        pair_levels = self.pair_levels()
        return jnp.minimum(self.level_pieces(pair_levels, diag_cols, "suf"),
                           self.level_pieces(pair_levels, diag_rows, "pre"))

    def level_gap(self, gap_min, query_min=False):
        """u = min(0, R - level) [n, n] of an off-diagonal FPA tile (< 0 where the key is
        dead): two operations per pair, as min(x, a - level) with everything else folded into
        vectors first; one (a subtraction) on a query-minimum tile (query_min, path 3 of
        `_share_path`, key levels: u = C'_t - psi_s). With A'_s = min(A_s, G), C'_t = min(C_t, G):

            key level psi_s:    u = min(min(key_gap_s, G - psi_s), C_t - psi_s)     (dk/dv)
                                u = min(key_gap_s, C'_t - psi_s)                     (dq)
            query level psi_t:  u = min(min(0, C_t - psi_t), A'_s - psi_t)          (dk/dv)
                                u = min(min(0, C_t - psi_t, G - psi_t), A_s - psi_t)  (dq)

        with key_gap_s = min(0, A_s - psi_s) from the pack; all equal min(0, min(A'_s, C_t) -
        level) bit for bit (rounding is monotone: min(A, G) - psi = min(A - psi, G - psi)). Each
        sweep folds G into the side whose vectors lie along the tile's rows: a vector along
        the columns costs half a tile operation (a thread holds 16 of its values), one along
        the rows 1/16. The vectors are read from shared memory at each call, so a caller can
        recompute u instead of keeping the tile live."""
        over_keys = lambda x: lax.broadcast_in_dim(x, self.shape, [self.ka])
        over_queries = lambda x: lax.broadcast_in_dim(x, self.shape, [self.qa])
        queries_on_rows = self.qa == 0
        if self.cfg.query_level:
            level = self.rows.vec("psi")
            folded = jnp.minimum(self.rows.vec("pre_min") - level, 0.0)
            if queries_on_rows:
                folded = jnp.minimum(folded, gap_min - level)
                return jnp.minimum(over_queries(folded),
                                   over_keys(self.cols.vec("suf_min")) - over_queries(level))
            key_min = jnp.minimum(self.cols.vec("suf_min"), gap_min)
            return jnp.minimum(over_queries(folded), over_keys(key_min) - over_queries(level))
        level = self.cols.vec("psi")
        if queries_on_rows or query_min:
            low = jnp.minimum(self.rows.vec("pre_min"), gap_min)
            query_side = over_queries(low) - over_keys(level)
            if query_min:
                return query_side
            return jnp.minimum(over_keys(self.cols.vec("key_gap")), query_side)
        folded = jnp.minimum(self.cols.vec("key_gap"), gap_min - level)
        return jnp.minimum(over_keys(folded), over_queries(self.rows.vec("pre_min"))
                           - over_keys(level))

    def logits_and_bias(self, scores, diagonal, diag_rows=None, diag_cols=None, gap_min=None,
                        range_min=None, query_min=False):
        """Base-2 logits less the row's lse [n, n] (before masking: P = exp2 of them) and, for
        FPA, what the gradient pass needs: "gap", a function giving u = [dead] (R - level)
        (bias = beta u; off the diagonal it recomputes u, which is cheaper than keeping the
        tile live over the matmuls). On the diagonal R is `range_min` if given, else formed
        from the level minima.

        The lse goes into the scores' multiply-add, so a bias costs one more multiply-add
        (FPA: (beta log2 e) u + (scale' s - lse)) and the separable one a subtract
        ((scale' s + (row - lse)) - col, its row pack holding row - lse; backward.prepare)."""
        cfg = self.cfg
        extra = {}
        if cfg.mode == "separable":
            row = self.row("row")
            logits = row if scores is None else (cfg.scale * LOG2E) * scores + row
            return logits - self.col("col"), extra
        if cfg.mode == "none":
            bias = None
        elif diagonal:
            if range_min is None:
                range_min = self.fpa_range_min(True, diag_rows, diag_cols, gap_min)
            level = self.row("psi") if cfg.query_level else self.col("psi")
            gap = range_min - level
            gap = jnp.where((gap < 0.0) & (self.s_local < self.t_local), gap, 0.0)
            bias = (self.beta * LOG2E) * gap
            extra = dict(gap=lambda: gap, gap_tile=gap)
        else:
            bias = (self.beta * LOG2E) * self.level_gap(gap_min, query_min)
            extra = dict(gap=functools.partial(self.level_gap, gap_min, query_min))
        shifted = self.unbiased_logits(scores)
        return shifted if bias is None else bias + shifted, extra

    def biased_probs(self, scores, *, diagonal, field_work, diag_rows, diag_cols, gap_min,
                     query_min=False):
        """(P [n, n] masked, extra of `logits_and_bias`); without field_work (a tile with no
        dead pair) the bias is 0 and extra None."""
        if field_work:
            logits, extra = self.logits_and_bias(scores, diagonal, diag_rows, diag_cols, gap_min,
                                                 query_min=query_min)
        else:
            logits, extra = self.unbiased_logits(scores), None
        return self.probs(logits, self.mask(diagonal)), extra

    def unbiased_logits(self, scores):
        """scale' <q, k> - lse without a bias (-lse without content; not the separable mode,
        whose packs hold no lse row)."""
        if scores is None:
            return -self.row("lse")
        return (self.cfg.scale * LOG2E) * scores - self.row("lse")

    def probs(self, logits, mask):
        """P from base-2 logits less lse (`logits_and_bias`)."""
        p = jnp.exp2(logits)
        return p if mask is None else jnp.where(mask, p, 0.0)

    def dead_coef(self, ds, gap, all_dead=False):
        """(coef / beta = [dead] dS, [dead] (R - level) dS) [n, n] from u = gap (masked pairs
        have dS = 0; all_dead: a tile whose every pair is dead, coef = dS); the callers apply
        beta to the sums."""
        return ds if all_dead else jnp.where(gap < 0.0, ds, 0.0), gap * ds

    def exact_shares(self, coef, gap_min, gap_mass, keys=True, queries=True):
        """Per-pair soft-min shares of an off-diagonal tile, summed at once: (key side summed
        over queries, gap summed over queries, query side summed over keys), None for a side
        not asked for (keys, queries: a sum across warps is not dropped as dead code).

        A piece's share of a pair is coef / mass times the piece's own weight
        exp(-(piece min - R)/tau), mass = sum over the pieces of mass_piece exp(-(min - R)/tau).
        """
        tau = self.cfg.tau
        range_min = self.fpa_range_min(False, None, None, gap_min)
        to_key = decay(self.col("suf_min") - range_min, tau)
        to_query = decay(self.row("pre_min") - range_min, tau)
        to_gap = decay(gap_min - range_min, tau)
        mass = (self.col("suf_mass") * to_key + self.row("pre_mass") * to_query
                + gap_mass * to_gap)
        share = coef * reciprocal(jnp.maximum(mass, 1.0))
        key_sum = self.sum_over_queries(share * to_key) if keys else None
        gap_sum = self.sum_over_queries(share * to_gap) if keys else None
        return key_sum, gap_sum, self.sum_over_keys(share * to_query) if queries else None

    def diagonal_shares(self, coef, pair_levels, suf, pre, diag_rows, diag_cols, emit):
        """Per-level soft-min shares of a diagonal tile, handed to emit(index, vector) as each
        is summed: index L < levels the key side of level L (summed over queries), levels + L
        the query side (summed over keys). Each pair s < t lies in one dyadic level L, whose
        two pieces are the key side's suffix (minimum suf = suf_min[L, s]) and the query
        side's prefix (pre); with R = min(suf, pre) one of the two weights
        exp(-(piece - R)/tau) is 1 and the other y = exp(-|suf - pre|/tau): one exponential
        and one reciprocal per pair, the masses selected per pair after the minima. Emitting
        each level's sum at once (the caller stores it) keeps one sum live at a time, not
        twelve; the key side's sums hold 16 values a thread each."""
        levels = self.cfg.diag_levels
        key_first = suf <= pre
        y = jnp.exp(jnp.abs(suf - pre) * (-1.0 / self.cfg.tau))
        to_key = jnp.where(key_first, 1.0, y)
        to_query = jnp.where(key_first, y, 1.0)
        mass = (self.level_pieces(pair_levels, diag_cols, "suf", levels) * to_key
                + self.level_pieces(pair_levels, diag_rows, "pre", levels) * to_query)
        base = coef * reciprocal(jnp.maximum(mass, 1.0))
        for first, share, reduce in ((0, base * to_key, self.sum_over_queries),
                                     (levels, base * to_query, self.sum_over_keys)):
            for level in range(levels):
                emit(first + level, reduce(jnp.where(pair_levels == level, share, 0.0)))

    def separable_weights(self, coef, r, gap_min, gap_mass):
        """(base [n, n], w_key [n] over keys, w_query [n] over queries, w_gap scalar).

        With every piece weighted relative to the tile minimum r, w_X = exp(-(X - r)/tau), a
        pair's key share is coef w_A(s) / (sum over pieces mass_X w_X) = base_ts w_A(s), its
        query share base_ts w_C(t) and its gap share base_ts w_G: the per-pair exponentials
        become per-key and per-query vectors, applied after the tile's sums.

        The masses of the denominator come weighted from the packs, relative to their block's
        lowest piece (suf_wmass_s = suf_mass_s exp(-(A_s - alo)/tau); pre_wmass_t likewise
        with the query block's minimum bmin), so a tile scales each by one scalar
        (exp(-(alo - r)/tau), exp(-(bmin - r)/tau)) instead of forming exponentials per key
        and per query. The denominator needs no floor: on this path the query piece (mass >= 1)
        or, where the gap lies lower, the gap piece weighs at least e^-SEPARABLE_SPREAD.
        """
        tau = self.cfg.tau
        w_gap = decay(gap_min - r, tau)
        key_scale = decay(self.cols.scalar("alo") - r, tau)
        query_scale = decay(self.rows.scalar("bmin") - r, tau)
        over_keys = lambda x: lax.broadcast_in_dim(x, self.shape, [self.ka])
        over_queries = lambda x: lax.broadcast_in_dim(x, self.shape, [self.qa])
        # the side along the tile's columns is scaled per pair (one fused multiply-add with
        # the sum) rather than as a vector, which costs half a tile operation there
        if self.qa == 0:   # dq: queries along the rows
            rows = self.rows.vec("pre_wmass") * query_scale + gap_mass * w_gap
            denom = over_keys(self.cols.vec("suf_wmass")) * key_scale + over_queries(rows)
        else:              # dk/dv: keys along the rows
            rows = self.cols.vec("suf_wmass") * key_scale + gap_mass * w_gap
            denom = over_queries(self.rows.vec("pre_wmass")) * query_scale + over_keys(rows)
        w_key = decay(self.cols.vec("suf_min") - r, tau)    # used after the sums, each by the
        w_query = decay(self.rows.vec("pre_min") - r, tau)  # sweep whose rows it lies along
        return coef * reciprocal(denom), w_key, w_query, w_gap

    def row_referenced_weights(self, coef, gap_min, gap_mass):
        """(base, key weight, query factor [n, n]; w_query, w_gap [n] over queries), exact for
        any spread. With m_t = min(G, C_t), R = min(A_s, m_t) and y = exp(-|m_t - A_s|/tau): the
        key weight exp(-(A_s - R)/tau) is 1 if A_s < m_t, else y; the query and gap pieces weigh
        w_query, w_gap (relative to m_t) times the query factor (y if A_s < m_t, else 1);
        base = coef / mass."""
        tau = self.cfg.tau
        pre = self.rows.vec("pre_min")
        query_min = jnp.minimum(pre, gap_min)
        w_query, w_gap = decay(pre - query_min, tau), decay(gap_min - query_min, tau)
        diff = lax.broadcast_in_dim(query_min, self.shape, [self.qa]) - self.col("suf_min")
        y = jnp.exp(jnp.abs(diff) * (-1.0 / tau))
        key_first = diff > 0.0
        key_weight = jnp.where(key_first, 1.0, y)
        query_factor = jnp.where(key_first, y, 1.0)
        query_mass = self.rows.vec("pre_mass") * w_query + gap_mass * w_gap
        mass = (self.col("suf_mass") * key_weight
                + lax.broadcast_in_dim(query_mass, self.shape, [self.qa]) * query_factor)
        return (coef * reciprocal(jnp.maximum(mass, 1.0)), key_weight, query_factor, w_query,
                w_gap)


def _gap_update(gap_min, gap_mass, block_min, block_mass, tau):
    """Scalars: the gap's minimum and its soft-min mass relative to it, one block more."""
    new_min = jnp.minimum(gap_min, block_min)
    new_mass = (gap_mass * decay(gap_min - new_min, tau)
                + block_mass * decay(block_min - new_min, tau))
    return new_min, new_mass


def _add_gap_total(gap_s, i, n, total):
    """Store the scalar gap total of tile (query block i, this key block) at lane i mod n of
    chunk i // n of the program's gap vector (each tile is visited once; a scalar store, where
    a masked add over the vector cost 1.5 instructions per pair of the tile)."""
    gap_s[lax.div(i, n), lax.rem(i, n)] = total


# -- the two sweeps' shared frame: one program owns a block (its two tiles, its pack and, for
# FPA, the diagonal's level minima and beta; barriers 0-5) and streams the other side's blocks
# through two slots (two tiles and a pack each; barriers 6 + slot, 8 + slot, 10 + slot)

def _load_own_block(cfg, n, b, h, block, tiles, pack, fpa_inputs, bars):
    """Starts the TMA of the program's own block: tiles = two (gmem, smem) pairs of [B, Tp, H,
    D] arrays, pack its (gmem, smem) pack and, for FPA, fpa_inputs = the row and column level
    minima and beta as (gmem, smem) pairs. Returns the tiles' index (b, rows of the block, h)."""
    at = (b, pl.ds(block * n, n), h)
    for index, (ref, smem) in enumerate(tiles):
        plgpu.copy_gmem_to_smem(ref.at[at], smem, bars.at[index])
    plgpu.copy_gmem_to_smem(pack[0].at[b, h, block], pack[1], bars.at[2])
    if cfg.mode == "fpa":
        (rowd_ref, rowd_s), (cold_ref, cold_s), (beta_ref, beta_s) = fpa_inputs
        minima = pl.ds(0, cfg.diag_levels)  # the diagonal's level minima (for the bias)
        plgpu.copy_gmem_to_smem(rowd_ref.at[b, h, block, minima], rowd_s, bars.at[3])
        plgpu.copy_gmem_to_smem(cold_ref.at[b, h, block, minima], cold_s, bars.at[4])
        plgpu.copy_gmem_to_smem(beta_ref.at[h], beta_s, bars.at[5])
    return at


def _wait_own_block(cfg, bars, beta_s):
    """Waits for `_load_own_block`'s copies; beta as a scalar (FPA) or None."""
    fpa = cfg.mode == "fpa"
    for index in range(3 + (3 if fpa else 0)):
        plgpu.barrier_wait(bars.at[index])
    return beta_s[0, 0] if fpa else None


def _stream_fetch(n, b, h, tiles, pack, bars):
    """fetch(block, slot): the TMA of a streamed block's two tiles and pack into `slot`."""
    def fetch(block, slot):
        at = (b, pl.ds(block * n, n), h)
        for index, (ref, smem) in enumerate(tiles):
            plgpu.copy_gmem_to_smem(ref.at[at], smem.at[slot], bars.at[6 + 2 * index + slot])
        plgpu.copy_gmem_to_smem(pack[0].at[b, h, block], pack[1].at[slot], bars.at[10 + slot])

    return fetch


def _advance_stream(fetch, bars, has_next, next_block, slot):
    """Prefetches the next streamed block into the other slot (if has_next), then waits for
    this slot's block."""
    @pl.when(has_next)
    def _():
        plgpu.commit_smem()  # order the last step's reads of that slot before the TMA
        fetch(next_block, 1 - slot)

    for index in (6, 8, 10):
        plgpu.barrier_wait(bars.at[index + slot])


def _sweep_tile(cfg, compute, state, rows, cols, streamed, gap, beta, diagonal):
    """(state, gap_min, gap_mass) past one tile: compute(state, r=, path=) off the diagonal by
    share path (`_share_path`, `_by_path`),
    not run where the forward pruned the tile; the gap's minimum and mass then take in the
    streamed block (off the diagonal, FPA)."""
    gap_min, gap_mass = gap
    r = path = None
    if cfg.separable and not diagonal:
        r, path = _share_path(cfg, rows, cols, gap_min)
    run = _by_path(functools.partial(compute, r=r, path=path), path)
    if diagonal or not cfg.prunes:
        state = run(state)
    else:
        skip = _skip_tile(cfg, rows, cols, gap_min, beta)
        state = lax.cond(skip, lambda s: s, run, state)
    if cfg.mode == "fpa" and not diagonal:
        gap_min, gap_mass = _gap_update(gap_min, gap_mass, streamed.scalar("bmin"),
                                        streamed.scalar("bmass"), cfg.tau)
    return state, gap_min, gap_mass


def _initial_gap(cfg):
    """The gap's (minimum, soft-min mass) before the first off-diagonal block: scalars for
    FPA, else (None, None)."""
    if cfg.mode == "fpa":
        return jnp.float32(BIG), jnp.float32(0.0)
    return None, None


def _sweep_scratch(cfg, n, head_dim, dtype, row_slots, col_slots):
    """The shared memory of the frame: the own block's two tiles, the streamed blocks' two
    tiles (2 slots), the row and column packs (row_slots, col_slots: 1 for the own block's,
    2 for the streamed one's) and, for FPA, the level minima and beta (None otherwise)."""
    fpa, levels = cfg.mode == "fpa", cfg.diag_levels
    transforms = swizzled_smem((n, head_dim), dtype).transforms
    packs = [plgpu.SMEM(((slots,) if slots > 1 else ()) + (packed_rows(names), n), jnp.float32)
             for slots, names in ((row_slots, cfg.row_names()), (col_slots, cfg.col_names()))]
    return [
        swizzled_smem((n, head_dim), dtype), swizzled_smem((n, head_dim), dtype),
        plgpu.SMEM((2, n, head_dim), dtype, transforms=transforms),
        plgpu.SMEM((2, n, head_dim), dtype, transforms=transforms),
        *packs,
        plgpu.SMEM((levels, n), jnp.float32) if fpa else None,
        plgpu.SMEM((levels, n), jnp.float32) if fpa else None,
        plgpu.SMEM((1, n), jnp.float32) if fpa else None,
    ]


def _field_sums(cfg, tile, p, ds, extra, field, col_acc, row_acc):
    """FPA's field sums of one tile: the key side into col_acc = (dpsi?, dbeta, share) and the
    query side into row_acc = (dpsi?, share, dsum, pgap) (dsum is the caller's), each None
    where the sweep does not compute that side (dk/dv's sweep the key side, dq's the query
    side). Paths 1 / 2 of `_share_path` off the diagonal (separable, row-referenced; path 0
    tiles run as plain softmax tiles and never get here), the exact shares with query levels;
    a diagonal tile adds d level, d beta and pgap only (its shares:
    backward_diagonal_kernel.py). field = (diagonal, path, r, (gap_min, gap_mass), add_gap,
    query_min); add_gap(total) takes the tile's gap share (key side); query_min: a path 3 tile
    (every pair dead, the separable shares)."""
    diagonal, path, r, (gap_min, gap_mass), add_gap, query_min = field
    beta = tile.beta
    keys, queries = col_acc is not None, row_acc is not None
    col_share = 1 if cfg.query_level else 2
    row_share = 1 if cfg.query_level else 0

    def common(accs):
        """(col_acc, row_acc as lists with d level, d beta, pgap added, coef / beta)."""
        col_acc, row_acc = (None if acc is None else list(acc) for acc in accs)
        u = extra["gap"]()
        coef, gap_ds = tile.dead_coef(ds, u, all_dead=query_min)
        if keys:
            at = 0
            if not cfg.query_level:
                col_acc[0] = col_acc[0] - beta * tile.sum_over_queries(coef)
                at = 1
            col_acc[at] = col_acc[at] + tile.sum_over_queries(gap_ds)
        if queries:
            row_acc[-1] = row_acc[-1] + tile.sum_over_keys(p * u)
            if cfg.query_level:
                row_acc[0] = row_acc[0] - beta * tile.sum_over_keys(coef)
        return col_acc, row_acc, coef

    def done(col_acc, row_acc):
        return tuple(None if acc is None else tuple(acc) for acc in (col_acc, row_acc))

    def exact(accs):
        col_acc, row_acc, coef = common(accs)
        if not diagonal:
            key_sum, gap_sum, query_sum = tile.exact_shares(coef, gap_min, gap_mass, keys,
                                                            queries)
            if keys:
                col_acc[col_share] = col_acc[col_share] + beta * key_sum
                add_gap(beta * jnp.sum(gap_sum))
            if queries:
                row_acc[row_share] = row_acc[row_share] + beta * query_sum
        return done(col_acc, row_acc)

    def separable(accs):
        col_acc, row_acc, coef = common(accs)
        base, w_key, w_query, w_gap = tile.separable_weights(coef, r, gap_min, gap_mass)
        if keys:
            per_key = beta * tile.sum_over_queries(base)
            col_acc[col_share] = col_acc[col_share] + w_key * per_key
            add_gap(w_gap * jnp.sum(per_key))
        if queries:
            row_acc[row_share] = row_acc[row_share] + (beta * w_query) * tile.sum_over_keys(base)
        return done(col_acc, row_acc)

    def row_referenced(accs):
        col_acc, row_acc, coef = common(accs)
        base, key_weight, query_factor, w_query, w_gap = tile.row_referenced_weights(
            coef, gap_min, gap_mass)
        if keys:
            col_acc[col_share] = (col_acc[col_share]
                                  + beta * tile.sum_over_queries(base * key_weight))
        per_query = beta * tile.sum_over_keys(base * query_factor)  # query and gap pieces
        if keys:
            add_gap(jnp.sum(per_query * w_gap))
        if queries:
            row_acc[row_share] = row_acc[row_share] + w_query * per_query
        return done(col_acc, row_acc)

    if diagonal or not cfg.separable:
        return exact((col_acc, row_acc))
    if query_min:
        return separable((col_acc, row_acc))
    return lax.cond(path == 1, separable, row_referenced, (col_acc, row_acc))


def _tile_sums(cfg, tile, p, ds, extra, field, col_acc, row_acc):
    """(col_acc, row_acc) past one tile's bias-gradient sums: d col (separable) or FPA's key
    side into col_acc, d row or FPA's dsum and query side into row_acc; None for a side the
    sweep does not compute. field: `_field_sums`' (FPA tiles with field work) or None."""
    if cfg.mode == "separable":
        if col_acc is not None:
            col_acc = (col_acc[0] - tile.sum_over_queries(ds),)
        if row_acc is not None:
            row_acc = (row_acc[0] + tile.sum_over_keys(ds),)
        return col_acc, row_acc
    if cfg.mode != "fpa":
        return col_acc, row_acc
    if row_acc is not None:
        row_acc = (*row_acc[:-2], row_acc[-2] + tile.sum_over_keys(ds), row_acc[-1])
    if field is None:
        return col_acc, row_acc
    return _field_sums(cfg, tile, p, ds, extra, field, col_acc, row_acc)


def dkv_kernel(cfg: KernelConfig, q, k, v, dout, rowp, colp, rowd, cold, beta):
    """One program per (head, key block, batch): dk, dv [B, Tp, H, D], column pack, gap totals."""
    batch, heads, head_dim, n, nb = launch_sizes(cfg, q)
    fpa = cfg.mode == "fpa"
    row_names, col_names = cfg.row_names(), cfg.col_names()
    out_names = cfg.col_out_names()
    chunks = -(-nb // n)

    out_types = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    if out_names:
        out_types.append(jax.ShapeDtypeStruct((batch, heads, nb, len(out_names), n), jnp.float32))
    if fpa:
        out_types.append(jax.ShapeDtypeStruct((batch, heads, nb, chunks, n), jnp.float32))

    def body(*refs):
        (q_ref, k_ref, v_ref, do_ref, rowp_ref, colp_ref, rowd_ref, cold_ref, beta_ref,
         dk_ref, dv_ref, *rest) = refs
        colo_ref = rest.pop(0) if out_names else None
        gapo_ref = rest.pop(0) if fpa else None
        (k_s, v_s, q_s, do_s, rowp_s, colp_s, rowd_s, cold_s, beta_s, p_s, ds_s, colo_s, gap_s,
         bars) = rest
        h = lax.axis_index("h")
        j = lax.axis_index("kb")
        b = lax.axis_index("b")
        fpa_inputs = ((rowd_ref, rowd_s), (cold_ref, cold_s), (beta_ref, beta_s))
        keys = _load_own_block(cfg, n, b, h, j, ((k_ref, k_s), (v_ref, v_s)), (colp_ref, colp_s),
                               fpa_inputs, bars)
        fetch = _stream_fetch(n, b, h, ((q_ref, q_s), (do_ref, do_s)), (rowp_ref, rowp_s), bars)
        fetch(j, 0)
        beta = _wait_own_block(cfg, bars, beta_s)
        cols = Vectors(colp_s, col_names, axis=0)
        diag_cols = Vectors(cold_s, ["suf"], axis=0) if fpa else None
        diag_rows = Vectors(rowd_s, ["pre"], axis=1) if fpa else None
        if gap_s is not None:
            for c in range(chunks):
                gap_s.at[c][...] = zeros((n,), plgpu.Layout.WGMMA.reduce(0))

        if cfg.skips and cfg.segments:  # query blocks past the key block's last document
            end = jnp.minimum(nb, lax.div(cols.scalar("dend").astype(jnp.int32), n) + 1)
        else:
            end = nb

        def step(i, slot, carry, diagonal):
            state, gap_min, gap_mass = carry
            _advance_stream(fetch, bars, i + 1 < end, i + 1, slot)
            rows = Vectors(rowp_s.at[slot], row_names, axis=1)

            def compute(state, r, path, field_work=True, query_min=False):
                dk, dv, col_acc = state
                tile = Tile(cfg, 1, rows, cols, beta)
                probs_of = functools.partial(tile.biased_probs, diagonal=diagonal,
                                             field_work=field_work, diag_rows=diag_rows,
                                             diag_cols=diag_cols, gap_min=gap_min,
                                             query_min=query_min)

                p, extra, dp, dv = _probs_and_dp(
                    cfg, cfg.overlap_dkv, probs_of, (k_s, q_s.at[slot].transpose((1, 0))),
                    (v_s, do_s.at[slot].transpose((1, 0))), (n, n),
                    lambda p: _accumulate(cfg, dv, p, p_s, do_s.at[slot])[0])
                ds = p * (dp - tile.row("delta"))

                field = None
                if fpa and field_work:
                    field = (diagonal, path, r, (gap_min, gap_mass),
                             functools.partial(_add_gap_total, gap_s, i, n), query_min)

                def col_sums(col_acc):  # during dk's matmul
                    return _tile_sums(cfg, tile, p, ds, extra, field, col_acc, None)[0]

                if cfg.content:
                    dk, col_acc = _accumulate(cfg, dk, ds, ds_s, q_s.at[slot], col_sums, col_acc)
                else:
                    col_acc = col_sums(col_acc)
                return dk, dv, col_acc

            return _sweep_tile(cfg, compute, state, rows, cols, rows, (gap_min, gap_mass), beta,
                               diagonal)

        zeros_tile = zeros((n, head_dim), plgpu.Layout.WGMMA)
        col_acc = tuple(zeros((n,), plgpu.Layout.WGMMA.reduce(1)) for _ in out_names)
        carry = ((zeros_tile, zeros_tile, col_acc), *_initial_gap(cfg))
        carry = step(j, lax.rem(j, 1), carry, diagonal=True)  # slot 0, traced (_accumulate)
        carry = lax.fori_loop(j + 1, end,
                              lambda i, c: step(i, lax.rem(i - j, 2), c, diagonal=False), carry)
        (dk, dv, col_acc), _, _ = carry

        k_s[...] = (cfg.scale * dk).astype(k_s.dtype)
        v_s[...] = dv.astype(v_s.dtype)
        _store_rows(colo_s, col_acc)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_s, dk_ref.at[keys])
        plgpu.copy_smem_to_gmem(v_s, dv_ref.at[keys])
        if colo_ref is not None:
            plgpu.copy_smem_to_gmem(colo_s, colo_ref.at[b, h, j])
        if gapo_ref is not None:
            plgpu.copy_smem_to_gmem(gap_s, gapo_ref.at[b, h, j])
        plgpu.wait_smem_to_gmem(0)

    dtype = q.dtype
    scratch = [
        *_sweep_scratch(cfg, n, head_dim, dtype, row_slots=2, col_slots=1),
        None if cfg.lhs_in_registers else swizzled_smem((n, n), dtype),
        None if cfg.lhs_in_registers else swizzled_smem((n, n), dtype),
        plgpu.SMEM((max(len(out_names), 1), n), jnp.float32),
        plgpu.SMEM((chunks, n), jnp.float32) if fpa else None,
        plgpu.Barrier(num_barriers=12),
    ]
    return per_block(body, f"attention_dkv_{cfg.mode}", tuple(out_types), scratch,
                     (batch, heads, nb), "kb")(q, k, v, dout, rowp, colp, rowd, cold, beta)


def dq_kernel(cfg: KernelConfig, q, k, v, dout, rowp, colp, rowd, cold, beta):
    """One program per (head, query block, batch): dq [B, Tp, H, D] and the row pack."""
    batch, heads, head_dim, n, nb = launch_sizes(cfg, q)
    fpa = cfg.mode == "fpa"
    row_names, col_names = cfg.row_names(), cfg.col_names()
    out_names = cfg.row_out_names()

    out_types = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if out_names:
        out_types.append(jax.ShapeDtypeStruct((batch, heads, nb, len(out_names), n), jnp.float32))

    def body(*refs):
        (q_ref, k_ref, v_ref, do_ref, rowp_ref, colp_ref, rowd_ref, cold_ref, beta_ref,
         dq_ref, *rest) = refs
        rowo_ref = rest.pop(0) if out_names else None
        (q_s, do_s, k_s, v_s, rowp_s, colp_s, rowd_s, cold_s, beta_s, ds_s, rowo_s, bars) = rest
        h = lax.axis_index("h")
        i = nb - 1 - lax.axis_index("qb")  # longest rows first
        b = lax.axis_index("b")
        fpa_inputs = ((rowd_ref, rowd_s), (cold_ref, cold_s), (beta_ref, beta_s))
        queries = _load_own_block(cfg, n, b, h, i, ((q_ref, q_s), (do_ref, do_s)),
                                  (rowp_ref, rowp_s), fpa_inputs, bars)
        fetch = _stream_fetch(n, b, h, ((k_ref, k_s), (v_ref, v_s)), (colp_ref, colp_s), bars)
        fetch(i, 0)
        beta = _wait_own_block(cfg, bars, beta_s)
        rows = Vectors(rowp_s, row_names, axis=0)
        diag_cols = Vectors(cold_s, ["suf"], axis=1) if fpa else None
        diag_rows = Vectors(rowd_s, ["pre"], axis=0) if fpa else None

        if cfg.skips and cfg.segments:  # key blocks before the query block's first document
            j_lo = lax.div(rows.scalar("seg").astype(jnp.int32), n)
        else:
            j_lo = 0

        def step(j, slot, carry, diagonal):
            state, gap_min, gap_mass = carry
            _advance_stream(fetch, bars, j - 1 >= j_lo, j - 1, slot)
            cols = Vectors(colp_s.at[slot], col_names, axis=1)

            def compute(state, r, path, field_work=True, query_min=False):
                dq, row_acc = state
                tile = Tile(cfg, 0, rows, cols, beta)
                probs_of = functools.partial(tile.biased_probs, diagonal=diagonal,
                                             field_work=field_work, diag_rows=diag_rows,
                                             diag_cols=diag_cols, gap_min=gap_min,
                                             query_min=query_min)

                p, extra, dp, _ = _probs_and_dp(
                    cfg, cfg.overlap_dq, probs_of, (q_s, k_s.at[slot].transpose((1, 0))),
                    (do_s, v_s.at[slot].transpose((1, 0))), (n, n))
                ds = p * (dp - tile.row("delta"))

                field = None
                if fpa and field_work:
                    field = (diagonal, path, r, (gap_min, gap_mass), None, query_min)

                def row_sums(row_acc):  # during dq's matmul
                    return _tile_sums(cfg, tile, p, ds, extra, field, None, row_acc)[1]

                if cfg.content:
                    dq, row_acc = _accumulate(cfg, dq, ds, ds_s, k_s.at[slot], row_sums,
                                              row_acc)
                else:
                    row_acc = row_sums(row_acc)
                return dq, row_acc

            return _sweep_tile(cfg, compute, state, rows, cols, cols, (gap_min, gap_mass), beta,
                               diagonal)

        zeros_tile = zeros((n, head_dim), plgpu.Layout.WGMMA)
        row_acc = tuple(zeros((n,), plgpu.Layout.WGMMA.reduce(1)) for _ in out_names)
        carry = step(i, lax.rem(i, 1), ((zeros_tile, row_acc), *_initial_gap(cfg)),
                     diagonal=True)  # slot 0, traced (_accumulate)

        def off_diagonal(m, c):
            j = i - 1 - m
            return step(j, lax.rem(m + 1, 2), c, diagonal=False)

        (dq, row_acc), _, _ = lax.fori_loop(0, i - j_lo, off_diagonal, carry)
        q_s[...] = (cfg.scale * dq).astype(q_s.dtype)
        _store_rows(rowo_s, row_acc)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_s, dq_ref.at[queries])
        if rowo_ref is not None:
            plgpu.copy_smem_to_gmem(rowo_s, rowo_ref.at[b, h, i])
        plgpu.wait_smem_to_gmem(0)

    dtype = q.dtype
    scratch = [
        *_sweep_scratch(cfg, n, head_dim, dtype, row_slots=1, col_slots=2),
        None if cfg.lhs_in_registers else swizzled_smem((n, n), dtype),
        plgpu.SMEM((max(len(out_names), 1), n), jnp.float32),
        plgpu.Barrier(num_barriers=12),
    ]
    return per_block(body, f"attention_dq_{cfg.mode}", tuple(out_types), scratch,
                     (batch, heads, nb), "qb")(q, k, v, dout, rowp, colp, rowd, cold, beta)
