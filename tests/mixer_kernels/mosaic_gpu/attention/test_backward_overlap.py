"""The backward sweeps' overlapped schedule (the scores' and dP's matmuls issued together, P
formed while dP's is in flight: backward.OVERLAP, per bias mode) computes what the
sequential schedule computes, bit for bit, in the GPU interpreter, for FPA (diagonal and
off-diagonal tiles, every share path, documents), FoX and softmax; and it lowers for Hopper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_kernels.mosaic_gpu.attention import backward
from mixer_kernels.mosaic_gpu.attention.backward import attention_backward
from tests.mixer_kernels.mosaic_gpu.attention.schedule_cases import (backward_case,
                                                                      interpreted_gradients)
from tests.seeds import case_seed


def _grads(args, bias, segment_ids, overlap, monkeypatch):
    monkeypatch.setattr(backward, "OVERLAP", {mode: (overlap, overlap) for mode in backward.OVERLAP})
    return interpreted_gradients(args, bias, segment_ids)


@pytest.mark.slow
@pytest.mark.parametrize("case, kind", [(0, "fpa"), (1, "fox"), (2, "none")])
def test_overlapped_schedule_matches_the_sequential_one(case, kind, monkeypatch):
    args, bias, segment_ids = backward_case(case_seed(case), kind)
    sequential = _grads(args, bias, segment_ids, False, monkeypatch)
    overlapped = _grads(args, bias, segment_ids, True, monkeypatch)
    assert len(sequential) == len(overlapped) >= 3
    for a, b in zip(sequential, overlapped):
        assert bool(jnp.all(jnp.isfinite(a)))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kind", ["fpa", "fox"])
def test_overlapped_schedule_lowers_for_hopper(kind, monkeypatch):
    monkeypatch.setattr(backward, "OVERLAP", {mode: (True, True) for mode in backward.OVERLAP})
    args, bias, segment_ids = backward_case(0, kind)
    args = tuple(x.astype(jnp.bfloat16) if x.ndim == 4 else x for x in args)
    lowered = jax.jit(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                    segment_ids=segment_ids)).trace(
        *args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
