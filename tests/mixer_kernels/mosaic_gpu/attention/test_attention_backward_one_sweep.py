"""The one-sweep backward (backward.ONE_SWEEP: the dk/dv kernel also forms dq and the row
sums and adds them into float32 accumulators by TMA reductions) computes what the two sweeps
compute, up to the order of float32 additions, in the GPU interpreter (whose TMA reduction
mixer_core.interpret supplies), for FPA with key and query levels and without content, FoX and
softmax, over diagonal, off-diagonal and ragged tiles and documents; and it lowers for Hopper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_core import interpret
from mixer_kernels.mosaic_gpu.attention import backward
from mixer_kernels.mosaic_gpu.attention.backward import FPABias, NoBias, SeparableBias, attention_backward
from tests.seeds import case_seed

SHAPE = (1, 130, 1, 64)     # three blocks: diagonal, off-diagonal and a ragged last block


def _inputs(seed, kind):
    rng = np.random.default_rng(seed)
    q, k, v, out, dout = (jnp.asarray(rng.standard_normal(SHAPE), jnp.float32) for _ in range(5))
    lse = jnp.asarray(rng.standard_normal((1, 1, SHAPE[1])) + 4.0, jnp.float32)
    walk = jnp.asarray(np.cumsum(rng.normal(-0.3, 1.0, (1, SHAPE[1], 1)), axis=1), jnp.float32)
    level = walk + jnp.asarray(rng.normal(0, 1, walk.shape), jnp.float32)
    beta = jnp.ones((1,), jnp.float32)
    bias = {"fpa": FPABias(walk, level, beta),
            "fpa_query": FPABias(walk, level, beta, query_level=True),
            "fpa_no_content": FPABias(walk, level, beta, content=False),
            "fox": SeparableBias(walk, walk), "none": NoBias()}[kind]
    segment_ids = jnp.asarray((np.arange(SHAPE[1]) >= 90)[None].astype(np.int32))
    return (q, k, v, out, lse, dout), bias, segment_ids


def _grads(args, bias, segment_ids, one_sweep, monkeypatch):
    monkeypatch.setattr(backward, "ONE_SWEEP", {mode: one_sweep for mode in backward.ONE_SWEEP})
    interpret.reset()
    with interpret.gpu_interpret():
        grads = jax.jit(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                      segment_ids=segment_ids, prune=True))(*args)
        grads = jax.block_until_ready(grads)
    assert not interpret.races_found()
    return jax.tree.leaves(grads)


@pytest.mark.parametrize("case, kind", [(0, "fpa"), (1, "fpa_query"), (2, "fpa_no_content"),
                                        (3, "fox"), (4, "none")])
def test_one_sweep_matches_two_sweeps(case, kind, monkeypatch):
    args, bias, segment_ids = _inputs(case_seed(case), kind)
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
    args, bias, segment_ids = _inputs(0, kind)
    args = tuple(x.astype(jnp.bfloat16) if x.ndim == 4 else x for x in args)
    lowered = jax.jit(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                    segment_ids=segment_ids, prune=True)).trace(
        *args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
