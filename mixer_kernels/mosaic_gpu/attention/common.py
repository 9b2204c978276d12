"""Constants and helpers shared by the attention kernels and their XLA pre- and post-passes.

    BLOCK                the kernels' tile size n (queries and keys per block; one
                         warpgroup's wgmma tile)
    BIG, decay           mixer_core/soft_min.py's, shared with FPA's XLA paths
    SUPPORTED_HEAD_DIMS  head dims the kernels are built for
    reciprocal(x)        1 / x of a tile x > 0 (WGMMA layout, finite, normal): one MUFU
                         rcp.approx when compiled (a division would be IEEE's long form);
                         rsqrt(x)^2 in the GPU interpreter, which runs no inline Mosaic GPU
                         code
    COMPILER_PARAMS      the kernels' Mosaic GPU options: approximate exp / exp2 / log /
                         rsqrt (the hardware's ex2 / lg2 / rsqrt, relative error near 2^-22,
                         far below the bf16 rounding of the results; the GPU interpreter of the
                         tests computes them exactly), and the "lane" lowering semantics: the
                         kernels state every register layout, so Mosaic's layout inference
                         (the "warpgroup" default) is skipped. On the H200 lane lowered the
                         FPA train step 5 s faster and ran the FPA backward 5-12% faster
                         (docs/benchmarks.md, "Lowering semantics").
    pack_rows(rows, n)   [B, H, Tp] vectors -> [B, H, nb, R, n], each block's rows together
                         (the packs the kernels copy to shared memory one block at a time)
    launch_sizes(cfg, q)  (batch, heads, head_dim, n, nb) of a kernel over q [B, Tp, H, D] in
                         blocks of n = cfg.block (nb = Tp / n)
    per_block(body, name, out_type, scratch, grid_shape, block_axis)   plgpu.kernel with one
                         program per (head "h", block `block_axis`, batch "b") of
                         grid_shape = (B, H, nb), named `name` in profiles
    zeros(shape, layout) a float32 zero array in a register layout
    pair_levels(t, s)    each pair s < t's dyadic level in a diagonal tile (int32 tiles of the
                         query and key positions): the highest set bit of t XOR s, -1 elsewhere
    row_dots(a, b)       per position sum_d a * b in float32, [B, T, H, D] -> [B, H, T]
                         (the backward's delta = <dout_t, out_t>)
    heads_major_sums(*terms)   [B, T, H] sums -> [B, H, T], fenced off from the transpose
    pruning_norms(qp, kp, scale)   per position scale <q_t, k_t>, scale |q_t|, |k_t|, each
                         [B, H, Tp] float32, from qp, kp [B, Tp, H, D]: the pruning test's
                         per-block scalars come from them (forward.py, backward.py)
    dead_key_bounds, no_dead_floor   the bound under which an off-diagonal FPA tile (level
                         psi_s) has no dead pair: R_ts - psi_s >= min(A_s - psi_s, G - psi_s,
                         C_t - psi_s) >= min(kap_j, min(G, clo_i) - kpmax_j)
"""

import math

import jax.experimental.mosaic.gpu as mgpu
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_core.interpret import interpret_active
from mixer_core.soft_min import BIG, decay  # noqa: F401  (the kernels' names for them)

BLOCK = 64
LOG2E = math.log2(math.e)  # the tiles' base 2: exp2 needs no multiply
SUPPORTED_HEAD_DIMS = (64, 128)
COMPILER_PARAMS = plgpu.CompilerParams(approx_math=True,
                                      lowering_semantics=plgpu.LoweringSemantics.Lane)


def pack_rows(rows, n):
    """list of R vectors [B, H, Tp] (Tp a multiple of n) -> [B, H, nb, R, n]."""
    stacked = jnp.stack(rows, axis=2)  # [B, H, R, Tp]
    b, h, r, tp = stacked.shape
    return jnp.moveaxis(stacked.reshape(b, h, r, tp // n, n), 3, 2)


def launch_sizes(cfg, q):
    batch, tp, heads, head_dim = q.shape
    return batch, heads, head_dim, cfg.block, tp // cfg.block


def per_block(body, name, out_type, scratch, grid_shape, block_axis):
    """`body` launched with one program per (head "h", block `block_axis`, batch "b") of
    grid_shape = (B, H, nb), named `name` in profiles; returns the launch (call it on the
    operands)."""
    batch, heads, nb = grid_shape
    body.__name__ = name
    return plgpu.kernel(body, out_type=out_type, scratch_types=scratch,
                        compiler_params=COMPILER_PARAMS, grid=(heads, nb, batch),
                        grid_names=("h", block_axis, "b"))


def reciprocal(x):
    """1 / x of a tile x > 0 (WGMMA layout, finite, normal)."""
    if interpret_active():
        root = lax.rsqrt(x)
        return root * root
    layout = plgpu.Layout.WGMMA

    @plgpu.inline_mgpu(arg_types=(layout,),
                       return_type=plgpu.ShapeDtypeStruct(x.shape, jnp.float32, layout=layout))
    def approximate(_, tile):
        return tile._pointwise(mgpu.FragmentedArray._lift_fast_instr("rcp.approx.ftz.f32"))

    return approximate(x)


def zeros(shape, layout):
    """A float32 zero array of `shape` in the register layout `layout`."""
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), layout)


def pair_levels(t, s):
    """The dyadic level of each pair s < t of a diagonal tile, -1 elsewhere (t, s: int32 tiles
    of the query and key positions in the block): L with 2^L <= t XOR s < 2^(L + 1), the
    highest set bit of t XOR s, as 31 - clz (one count-leading-zeros instruction)."""
    return jnp.where(s < t, 31 - lax.clz(t ^ s), -1)


def heads_major_sums(*terms):
    """[B, Tp, H] float32 row sums -> [B, H, Tp] each. The sums are fenced off
    (optimization_barrier) before they move heads-major: otherwise XLA fuses the reduction over
    D into the transposing fusion that packs the kernels' rows, which then reads its
    [B, Tp, H, D] operands without coalescing (0.1 ms per call at (8, 2048, 12, 64) on an
    H100, as long as a tenth of the attention backward)."""
    return tuple(jnp.moveaxis(x, 1, 2) for x in lax.optimization_barrier(terms))


def row_dots(a, b):
    """sum_d a[b, t, h, d] * b[b, t, h, d] in float32, [B, T, H, D] -> [B, H, T]."""
    return heads_major_sums(jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32), axis=-1))[0]


def pruning_norms(qp, kp, scale):
    """(scale <q_t, k_t>, scale |q_t|, |k_t|), each [B, H, Tp] float32, from qp, kp
    [B, Tp, H, D]. Reduced over D where it is contiguous and only the [B, Tp, H] results moved
    heads-major (heads_major_sums): moving the [B, Tp, H, D] operands first made XLA write a
    transposed float32 copy of each."""
    q32, k32 = qp.astype(jnp.float32), kp.astype(jnp.float32)
    return heads_major_sums(scale * jnp.sum(q32 * k32, axis=-1),
                            scale * jnp.sqrt(jnp.sum(q32 * q32, axis=-1)),
                            jnp.sqrt(jnp.sum(k32 * k32, axis=-1)))


def dead_key_bounds(suffix_min, psi, n):
    """Per key block of n positions, repeated over them ([..., Tp] each): kap = min_s (A_s -
    psi_s) with A_s the exclusive suffix minimum of the field inside the block, and
    kpmax = max_s psi_s."""
    blocks = lambda x: x.reshape(x.shape[:-1] + (x.shape[-1] // n, n))
    return (jnp.repeat(blocks(suffix_min - psi).min(-1), n, axis=-1),
            jnp.repeat(blocks(psi).max(-1), n, axis=-1))


def no_dead_floor(kap, kpmax, gap_min, query_block_min):
    """A lower bound of R_ts - psi_s over an off-diagonal tile (scalars): >= 0 means no key of
    the tile is dead, so its bias is 0."""
    return jnp.minimum(kap, jnp.minimum(gap_min, query_block_min) - kpmax)
