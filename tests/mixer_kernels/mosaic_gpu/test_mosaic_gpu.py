"""The Mosaic GPU kernel families together: layers that call the kernels (attention, gated
delta rule, short convolution) with equal shapes share one lowered program.

Each kernel's Mosaic GPU lowering takes seconds (layout inference), so a model whose layers
each lowered their own copy would compile for minutes; each family calls its kernels through
one `jax.jit` per static configuration (attention/vjp.py `_program`, gated_delta/vjp.py,
short_conv/common.py `kernel_program`). Lowered for a Hopper GPU on the CPU: the number of
kernel custom calls in a differentiated stack of FPA layers, of gated delta rule layers or of
short convolutions does not grow with its depth; and a program the GPU interpreter ran is not
reused when the same shapes are lowered for the GPU.
"""

import jax
import jax.numpy as jnp
import pytest

from mixer_core import interpret
from mixer_kernels.mosaic_gpu.attention.vjp import fpa_pallas
from mixer_kernels.mosaic_gpu.gated_delta.vjp import chunked_forward_pallas
from gdn_jax.ops.short_conv import short_conv_pallas


def _fpa_layer(x):
    phi = jnp.zeros(x.shape[:3], jnp.float32)
    beta = jnp.ones(x.shape[2:3], jnp.float32)
    return fpa_pallas(x, x, x, phi, phi, beta, None, scale=0.125)


def _gdn_layer(x):
    gates = jnp.full(x.shape[:3], -0.1, jnp.float32)
    out, _ = chunked_forward_pallas(x, x, x, gates, jnp.full(x.shape[:3], 0.5, x.dtype),
                                    scale=0.125, initial_state=None, segment_ids=None)
    return out


def _conv_layer(x):
    channels = x.shape[2] * x.shape[3]
    y = short_conv_pallas(x.reshape(*x.shape[:2], channels), jnp.ones((4, channels)), None,
                          dtype=x.dtype, normalize_heads=x.shape[2])
    return y.reshape(x.shape)


SHAPE = (1, 70, 2, 64)
SMALL = (1, 64, 1, 64)   # one block, one head: the interpreter is slow


def _stack(layer, layers):
    def stack(x):
        for _ in range(layers):
            x = layer(x).astype(x.dtype)
        return jnp.sum(x.astype(jnp.float32))
    return stack


def _kernel_calls(layer, layers):
    q = jnp.zeros(SHAPE, jnp.bfloat16)
    lowered = jax.jit(jax.grad(_stack(layer, layers))).trace(q).lower(
        lowering_platforms=("cuda",))
    return lowered.as_text().count("stablehlo.custom_call @mosaic_gpu")


@pytest.mark.parametrize("layer", [_fpa_layer, _gdn_layer, _conv_layer],
                         ids=["fpa", "gdn", "short_conv"])
@pytest.mark.slow
def test_kernel_calls_do_not_grow_with_depth(layer):
    two, three = _kernel_calls(layer, 2), _kernel_calls(layer, 3)
    assert two >= 1  # the kernels are there
    assert three == two, f"{two} kernel calls for 2 layers, {three} for 3"


@pytest.mark.parametrize("layer", [_fpa_layer, _gdn_layer], ids=["fpa", "gdn"])
def test_an_interpreted_program_is_not_reused_for_the_gpu(layer):
    """The shared jitted programs are traced again outside the interpreter: the forward
    lowered for the GPU after an interpreted forward of the same shapes still holds its Mosaic
    GPU kernels."""
    def calls():
        lowered = jax.jit(layer).trace(jnp.zeros(SMALL, jnp.bfloat16)).lower(
            lowering_platforms=("cuda",))
        return lowered.as_text().count("stablehlo.custom_call @mosaic_gpu")

    before = calls()
    interpret.reset()
    with interpret.gpu_interpret(detect_races=False):
        jax.block_until_ready(jax.jit(layer)(jnp.full(SMALL, 0.1, jnp.bfloat16)))
    assert calls() == before >= 1
