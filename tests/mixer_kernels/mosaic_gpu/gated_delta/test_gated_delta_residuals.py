"""What the "pallas" gated delta rule keeps for its backward pass: the chunk-major internals
(W, Kw, P, U and the entering states), so that the backward runs no forward kernel again; and
the op's gradient lowers for Hopper."""

import jax
import jax.numpy as jnp
from jax._src.ad_checkpoint import saved_residuals

from gdn_jax.ops import api
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import vjp
from tests.mixer_kernels.mosaic_gpu.gated_delta.op_cases import op_arguments
from tests.seeds import case_seed

BATCH, DIM = 1, 64


def test_the_backward_keeps_the_chunk_major_internals():
    args, segment_ids, d_out = op_arguments(case_seed(380), 130, dim=DIM, initial_state=True)

    def loss(q, k, v, g, beta, s0):
        out, final = api.gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                          output_final_state=True, segment_ids=segment_ids,
                                          implementation="pallas")
        return jnp.sum(d_out * out) + jnp.sum(final ** 2)

    with interpret.gpu_interpret():
        saved = saved_residuals(loss, *args)
    # rank >= 5: chunk-major [N, B, HV, ...]; W, Kw, P, U and the entering states, 3 chunks
    internals = [aval.shape for aval, _ in saved if aval.ndim >= 5]
    assert len([shape for shape in internals if shape[:2] == (3, BATCH)]) >= 5, internals


def test_the_op_gradient_lowers_for_hopper():
    """The whole op's gradient (forward kernels, custom VJP, backward kernels) lowers to Mosaic
    GPU kernels with bf16 operands, as on the GPU."""
    (q, k, v, g, beta, s0), segment_ids, d_out = op_arguments(case_seed(383), 130, dim=DIM,
                                                              initial_state=True)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))

    def loss(q, k, v, g, beta, s0):
        out, final = vjp.chunked_forward_pallas(q, k, v, g, beta, scale=DIM ** -0.5,
                                                initial_state=s0, segment_ids=segment_ids)
        return jnp.sum(d_out * out) + jnp.sum(final ** 2)

    lowered = jax.jit(jax.grad(loss, argnums=range(6))).trace(q, k, v, g, beta, s0).lower(
        lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
