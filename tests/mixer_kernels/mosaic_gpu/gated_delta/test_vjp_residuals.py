"""What the "pallas" gated delta rule keeps for its backward pass (`vjp.RESIDUALS`): with
"internals" the chunk-major internals (W, Kw, P, U and the entering states); with "inputs" none
of them, the gradients of "internals" (the same kernels run again) and of the oracle, and a
recomputation behind an optimization barrier; the op's gradient lowers for Hopper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from gdn_jax.ops import api
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import register, vjp
from tests.mixer_kernels.mosaic_gpu.gated_delta.op_cases import op_arguments
from tests.seeds import case_seed

BATCH, DIM = 1, 64


def _inputs(seed, seq_len):
    return op_arguments(seed, seq_len, dim=DIM, initial_state=True)


def _loss(implementation, segment_ids, d_out):
    def loss(q, k, v, g, beta, s0):
        out, final = api.gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                          output_final_state=True, segment_ids=segment_ids,
                                          implementation=implementation)
        return jnp.sum(d_out * out) + jnp.sum(final ** 2)
    return loss


@pytest.mark.parametrize("residuals", ["internals", "inputs"])
def test_what_the_backward_keeps(residuals, monkeypatch):
    monkeypatch.setattr(vjp, "RESIDUALS", residuals)
    args, segment_ids, d_out = _inputs(case_seed(380), 130)
    with interpret.gpu_interpret():
        saved = saved_residuals(_loss("pallas", segment_ids, d_out), *args)
    # rank >= 5: chunk-major [N, B, HV, ...] internals
    internals = [aval.shape for aval, _ in saved if aval.ndim >= 5]
    # what the backend tells the trainer's memory estimate (register.keeps_chunk_states)
    assert register.keeps_chunk_states() is (residuals == "internals")
    if residuals == "internals":    # W, Kw, P, U and the entering states: [3 chunks, B, ...]
        assert len([shape for shape in internals if shape[:2] == (3, BATCH)]) >= 5, internals
    else:
        assert internals == [], internals


def test_bad_residuals_setting_is_named(monkeypatch):
    monkeypatch.setattr(vjp, "RESIDUALS", "states")
    args, segment_ids, d_out = _inputs(case_seed(381), 8)
    with interpret.gpu_interpret(), pytest.raises(ValueError, match="RESIDUALS"):
        _loss("pallas", segment_ids, d_out)(*args)


@pytest.mark.slow
def test_inputs_give_the_gradients_of_internals_and_the_oracle(monkeypatch):
    args, segment_ids, d_out = _inputs(case_seed(382), 100)

    def gradients(implementation, residuals):
        monkeypatch.setattr(vjp, "RESIDUALS", residuals)
        return jax.jit(jax.grad(_loss(implementation, segment_ids, d_out),
                                argnums=range(6)))(*args)

    with interpret.gpu_interpret():
        got = jax.block_until_ready(gradients("pallas", "inputs"))
        assert not interpret.races_found()
        kept = gradients("pallas", "internals")
    oracle = gradients("reference", "internals")
    for label, a, b, c in zip(("dq", "dk", "dv", "dg", "dbeta", "ds0"), got, kept, oracle):
        a, b, c = (np.asarray(x, np.float64) for x in (a, b, c))
        assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b), label
        assert np.linalg.norm(a - c) < 1e-4 * np.linalg.norm(c), label


@pytest.mark.parametrize("residuals", [pytest.param("internals", marks=pytest.mark.slow),
                                       "inputs"])
def test_the_op_gradient_lowers_for_hopper(residuals, monkeypatch):
    """The whole op's gradient (forward kernels, custom VJP, backward kernels) lowers to Mosaic
    GPU kernels with bf16 operands, as on the GPU; "inputs" runs the forward kernels again
    behind an optimization barrier (else XLA merges them with the forward pass's calls)."""
    monkeypatch.setattr(vjp, "RESIDUALS", residuals)
    (q, k, v, g, beta, s0), segment_ids, d_out = _inputs(case_seed(383), 130)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))

    def loss(q, k, v, g, beta, s0):
        out, final = vjp.chunked_forward_pallas(q, k, v, g, beta, scale=DIM ** -0.5,
                                                initial_state=s0, segment_ids=segment_ids)
        return jnp.sum(d_out * out) + jnp.sum(final ** 2)

    text = jax.jit(jax.grad(loss, argnums=range(6))).trace(q, k, v, g, beta, s0).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
    assert ("optimization_barrier" in text) == (residuals == "inputs")
