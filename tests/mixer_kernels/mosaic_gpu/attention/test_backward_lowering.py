"""The attention backward kernels lower for a Hopper GPU on a machine without one.

`jit(...).lower(lowering_platforms=("cuda",))` runs the Pallas -> Mosaic GPU lowering, Mosaic's
layout inference and dialect lowering and verifies the module: the compile steps that the GPU
interpreter of the other tests skips (layout inference is where unsupported constructs fail).
Only the final LLVM / ptxas stage is left to the GPU machine.
"""

import jax
import jax.numpy as jnp
import pytest

from mixer_kernels.mosaic_gpu.attention.backward import attention_backward
from tests.mixer_kernels.mosaic_gpu.attention.lowering_cases import placeholder_bias


@pytest.mark.parametrize("kind, dim, dtype, segments, prune", [
    ("none", 128, jnp.float16, True, True),
    ("separable", 64, jnp.bfloat16, True, True),
    ("fpa", 128, jnp.bfloat16, True, True),
    ("fpa_query", 64, jnp.float16, False, True),
    ("fpa_no_content", 64, jnp.bfloat16, False, False),
])
def test_backward_lowers_for_hopper(kind, dim, dtype, segments, prune):
    batch, length, heads = 2, 200, 3
    q = jnp.zeros((batch, length, heads, dim), dtype)
    lse = jnp.zeros((batch, heads, length), jnp.float32)
    bias = placeholder_bias(kind, batch, length, heads)
    segment_ids = jnp.zeros((batch, length), jnp.int32) if segments else None

    def backward(q, k, v, out, dout):
        return attention_backward(q, k, v, out, lse, dout, bias, scale=dim ** -0.5,
                                  segment_ids=segment_ids, prune=prune)

    lowered = jax.jit(backward).trace(q, q, q, q, q).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("kind", ["fpa", "separable"])
def test_registers_variant_lowers_for_hopper(kind):
    """The compiled-only variant with P and dS fed to wgmma from registers, with the row /
    column sums during the dk and dq matmuls."""
    from mixer_kernels.mosaic_gpu.attention import backward as bwd
    batch, length, heads = 1, 130, 2
    q = jnp.zeros((batch, length, heads, 64), jnp.bfloat16)
    lse = jnp.zeros((batch, heads, length), jnp.float32)
    bias = placeholder_bias(kind, batch, length, heads)
    cfg = bwd.kernel_config(bias, 0.125, None, length, lhs_in_registers=True)

    def backward(q, k, v, out, dout):
        args, phi = bwd.prepare(cfg, q, k, v, out, lse, dout, bias, None)
        return bwd.run_kernels(cfg, args)

    lowered = jax.jit(backward).trace(q, q, q, q, q).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
