"""mixer_kernels/mosaic_gpu/common.py KERNEL_BARRIERS: with "explicit", the kernels that order
their shared-memory accesses themselves lower for Hopper without Pallas' automatic barriers
(fewer warpgroup barriers), the others as before; a wrong value is refused."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.kernel_op_count import captured_kernels, warpgroup_barriers
from gdn_jax.ops.short_conv import short_conv_pallas
from mixer_kernels.mosaic_gpu import common
from mixer_kernels.mosaic_gpu.gated_delta import vjp

ORDERED = {"delta_rule_forward_states", "delta_rule_backward_states",
           "delta_rule_state_gradients", "delta_rule_chunk_outputs",
           "delta_rule_chunk_outputs_backward", "delta_rule_wy_prepare", "delta_rule_wy_backward",
           "short_conv_forward", "short_conv_backward"}


def _barriers(length):
    """{kernel: warpgroup barriers} of the gated delta rule's and a short convolution's
    gradients (with the outputs), lowered for Hopper; `length` differs per call so that
    nothing is reused from an earlier trace."""
    q = jnp.zeros((1, length, 2, 64), jnp.bfloat16)
    g = jnp.zeros((1, length, 2), jnp.float32)
    x, taps = jnp.zeros((1, length, 128), jnp.bfloat16), jnp.zeros((4, 128), jnp.float32)

    def grads(q, k, v, g, beta, x, taps):
        def loss(q, k, v, g, beta, x, taps):
            out, _ = vjp.chunked_forward_pallas(q, k, v, g, beta, scale=0.125,
                                                initial_state=None, segment_ids=None)
            y = short_conv_pallas(x, taps, None, dtype=x.dtype, normalize_heads=2)
            return jnp.sum(out) + jnp.sum(y.astype(jnp.float32))
        return jax.value_and_grad(loss, argnums=range(7))(q, k, v, g, beta, x, taps)

    with captured_kernels() as kernels:
        jax.jit(grads).trace(q, q, q, g, g, x, taps).lower(lowering_platforms=("cuda",))
    return {name.removesuffix("_mosaic_gpu"): warpgroup_barriers(module)
            for name, module in kernels}


def test_explicit_drops_the_automatic_barriers_of_the_ordered_kernels_only(monkeypatch):
    automatic = _barriers(130)
    monkeypatch.setattr(common, "KERNEL_BARRIERS", "explicit")
    explicit = _barriers(194)
    assert set(automatic) == set(explicit) and ORDERED <= set(automatic)
    for name, count in automatic.items():
        if name in ORDERED:
            assert explicit[name] < count, name
        else:
            assert explicit[name] == count, name


def test_a_wrong_value_is_refused(monkeypatch):
    monkeypatch.setattr(common, "KERNEL_BARRIERS", "none")
    with pytest.raises(ValueError, match="KERNEL_BARRIERS"):
        common.compiler_params()
