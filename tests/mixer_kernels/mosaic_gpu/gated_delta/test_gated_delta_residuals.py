"""What the "pallas" gated delta rule keeps for its backward pass (`vjp.RESIDUALS`): with
"inputs" no chunk-major internal (W, Kw, P, U, the entering states) is saved, and the
gradients are those of "internals" (the same kernels run again) and of the oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from gdn_jax.ops import api
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import vjp
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


def _chunk_major(residuals):
    """The saved arrays of rank >= 5 (chunk-major [N, B, HV, ...] internals)."""
    return [aval.shape for aval, _ in residuals if aval.ndim >= 5]


@pytest.mark.parametrize("residuals", ["internals", "inputs"])
def test_inputs_keep_no_chunk_major_internal(residuals, monkeypatch):
    monkeypatch.setattr(vjp, "RESIDUALS", residuals)
    args, segment_ids, d_out = _inputs(case_seed(380), 130)
    with interpret.gpu_interpret():
        saved = saved_residuals(_loss("pallas", segment_ids, d_out), *args)
    internals = _chunk_major(saved)
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


def test_inputs_variant_lowers_for_hopper(monkeypatch):
    """The recomputing backward lowers to Mosaic GPU kernels (bf16 operands, as on the GPU)."""
    monkeypatch.setattr(vjp, "RESIDUALS", "inputs")
    (q, k, v, g, beta, s0), segment_ids, d_out = _inputs(case_seed(383), 130)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))

    def loss(q, k, v, g, beta, s0):
        out, final = vjp.chunked_forward_pallas(q, k, v, g, beta, scale=DIM ** -0.5,
                                                initial_state=s0, segment_ids=segment_ids)
        return jnp.sum(d_out * out) + jnp.sum(final ** 2)

    lowered = jax.jit(jax.grad(loss, argnums=range(6))).trace(q, k, v, g, beta, s0).lower(
        lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
