"""The one-sweep backward (backward.ONE_SWEEP: the dk/dv kernel also forms dq and the row
sums and adds them into float32 accumulators by TMA reductions) computes what the two sweeps
compute, up to the order of float32 additions, in the GPU interpreter (whose TMA reduction
mixer_core.interpret supplies), for FPA with key and query levels and without content, FoX and
softmax, over diagonal, off-diagonal and ragged tiles and documents; and it lowers for Hopper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_kernels.mosaic_gpu.attention import backward
from mixer_kernels.mosaic_gpu.attention.backward import attention_backward
from tests.mixer_kernels.mosaic_gpu.attention.schedule_cases import (backward_case,
                                                                      interpreted_gradients)
from tests.seeds import case_seed

pytestmark = pytest.mark.slow   # a non-default schedule: the full suite runs it


def _grads(args, bias, segment_ids, one_sweep, monkeypatch):
    monkeypatch.setattr(backward, "ONE_SWEEP", {mode: one_sweep for mode in backward.ONE_SWEEP})
    return interpreted_gradients(args, bias, segment_ids, prune=True)


@pytest.mark.parametrize("case, kind", [(0, "fpa"), (1, "fpa_query"), (2, "fpa_no_content"),
                                        (3, "fox"), (4, "none")])
def test_one_sweep_matches_two_sweeps(case, kind, monkeypatch):
    args, bias, segment_ids = backward_case(case_seed(case), kind)
    two = _grads(args, bias, segment_ids, False, monkeypatch)
    one = _grads(args, bias, segment_ids, True, monkeypatch)
    assert len(two) == len(one) >= 3
    for a, b in zip(two, one):
        a, b = np.asarray(a), np.asarray(b)
        assert np.all(np.isfinite(b))
        scale = max(float(np.abs(a).max()), 1e-6)
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("kind", ["fpa", "fox", "none"])
def test_one_sweep_lowers_for_hopper(kind, monkeypatch):
    monkeypatch.setattr(backward, "ONE_SWEEP", {mode: True for mode in backward.ONE_SWEEP})
    args, bias, segment_ids = backward_case(0, kind)
    args = tuple(x.astype(jnp.bfloat16) if x.ndim == 4 else x for x in args)
    lowered = jax.jit(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                    segment_ids=segment_ids, prune=True)).trace(
        *args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
