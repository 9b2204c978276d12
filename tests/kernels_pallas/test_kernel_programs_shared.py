"""Layers that call the attention kernels with equal shapes share one lowered program.

Each kernel's Mosaic GPU lowering takes seconds (layout inference), so a model whose layers
each lowered their own copy compiled for minutes (kernels_pallas/attention/vjp.py `_program`).
Lowered for a Hopper GPU on the CPU: the number of kernel custom calls in a differentiated
stack of FPA layers does not grow with its depth.
"""

import jax
import jax.numpy as jnp

from kernels_pallas.attention.vjp import fpa_pallas


def _kernel_calls(layers):
    q = jnp.zeros((1, 70, 2, 64), jnp.bfloat16)
    phi = jnp.zeros((1, 70, 2), jnp.float32)
    beta = jnp.ones((2,), jnp.float32)

    def stack(x):
        for _ in range(layers):
            x = fpa_pallas(x, x, x, phi, phi, beta, None, scale=0.125).astype(x.dtype)
        return jnp.sum(x.astype(jnp.float32))

    lowered = jax.jit(jax.grad(stack)).trace(q).lower(lowering_platforms=("cuda",))
    return lowered.as_text().count("stablehlo.custom_call @mosaic_gpu")


def test_kernel_calls_do_not_grow_with_depth():
    two, five = _kernel_calls(2), _kernel_calls(5)
    assert two >= 3  # forward, dk/dv and dq kernels are there
    assert five == two, f"{two} kernel calls for 2 layers, {five} for 5"
