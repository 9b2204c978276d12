"""Constants and helpers shared by the attention kernels and their XLA pre- and post-passes.

    BLOCK                the kernels' tile size n (queries and keys per block; one
                         warpgroup's wgmma tile)
    BIG, decay           mixer_core/soft_min.py's, shared with FPA's XLA paths
    SUPPORTED_HEAD_DIMS  head dims the kernels are built for
    reciprocal(x)        1 / x for x > 0 as rsqrt(x)^2 (one MUFU op instead of a division)
    COMPILER_PARAMS      the kernels' Mosaic GPU options: approximate exp / exp2 / log /
                         rsqrt (the hardware's ex2 / lg2 / rsqrt, relative error near 2^-22,
                         far below the bf16 rounding of the results; the GPU interpreter of the
                         tests computes them exactly), and the "lane" lowering semantics: the
                         kernels state every register layout, so Mosaic's layout inference
                         (the "warpgroup" default) is skipped. On the H200 lane lowered the
                         FPA train step 5 s faster and ran the FPA backward 5-12% faster
                         (docs/benchmarks.md, "Lowering semantics").
    dead_key_bounds, no_dead_floor   the bound under which an off-diagonal FPA tile (level
                         psi_s) has no dead pair: R_ts - psi_s >= min(A_s - psi_s, G - psi_s,
                         C_t - psi_s) >= min(kap_j, min(G, clo_i) - kpmax_j)
"""

import math

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_core.soft_min import BIG, decay  # noqa: F401  (the kernels' names for them)

BLOCK = 64
LOG2E = math.log2(math.e)  # the tiles' base 2: exp2 needs no multiply
SUPPORTED_HEAD_DIMS = (64, 128)
COMPILER_PARAMS = plgpu.CompilerParams(approx_math=True,
                                      lowering_semantics=plgpu.LoweringSemantics.Lane)


def reciprocal(x):
    """1 / x for x > 0 (finite, normal): rsqrt(x)^2."""
    root = lax.rsqrt(x)
    return root * root


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
