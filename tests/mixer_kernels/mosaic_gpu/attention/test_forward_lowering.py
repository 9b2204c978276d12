"""The attention forward kernel lowers for a Hopper GPU on a machine without one.

`jit(...).lower(lowering_platforms=("cuda",))` runs the Pallas -> Mosaic GPU lowering, Mosaic's
layout inference and dialect lowering (arch sm_90 when no GPU is present) and verifies the
module: the compile steps the GPU interpreter of the other tests skips. Only the final LLVM /
ptxas stage is left to the GPU machine.
"""

import jax
import jax.numpy as jnp
import pytest

from mixer_kernels.mosaic_gpu.attention.forward import attention_forward
from tests.mixer_kernels.mosaic_gpu.attention.lowering_cases import placeholder_bias


@pytest.mark.parametrize("kind, dim, dtype, segments, prune, stats, p_in_registers", [
    ("none", 64, jnp.bfloat16, False, True, False, True),
    ("none", 128, jnp.float16, True, True, False, True),
    ("separable", 64, jnp.bfloat16, False, True, True, True),
    ("fpa", 64, jnp.bfloat16, False, True, True, True),
    ("fpa", 128, jnp.bfloat16, True, False, False, True),
    ("fpa_no_content", 64, jnp.bfloat16, False, True, False, True),
    ("fpa_query", 64, jnp.float16, True, True, True, True),
])  # P through shared memory (p_in_registers=False, the interpreted form) ran on an H200:
    # benchmarks/results/attention_kernels_h200.txt
def test_forward_lowers_for_hopper(kind, dim, dtype, segments, prune, stats, p_in_registers):
    batch, length, heads = 2, 200, 3
    q = jnp.zeros((batch, length, heads, dim), dtype)
    bias = placeholder_bias(kind, batch, length, heads)
    segment_ids = jnp.zeros((batch, length), jnp.int32) if segments else None

    def forward(q, k, v):
        return attention_forward(q, k, v, bias, scale=dim ** -0.5, segment_ids=segment_ids,
                                 prune=prune, return_stats=stats,
                                 p_in_registers=p_in_registers,
                                 float32_out=kind.startswith("fpa"))  # FPA's VJP residual

    lowered = jax.jit(forward).trace(q, q, q).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
