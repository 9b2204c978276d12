"""Inputs and runs of the tests that compare two schedules or forms of the backward (overlapped
matmuls, field passes): one head of dim 64 over three blocks (diagonal,
off-diagonal and a ragged last block), two documents, float32, in the GPU interpreter."""

import jax
import jax.numpy as jnp
import numpy as np

from mixer_core import interpret
from mixer_kernels.mosaic_gpu.attention.backward import (FPABias, NoBias, SeparableBias,
                                                         attention_backward)

SHAPE = (1, 130, 1, 64)


def backward_case(seed, kind):
    """((q, k, v, out, lse, dout), bias, segment_ids); kind: fpa | fpa_query | fpa_no_content |
    fox | none (FPA's field a drifting walk, its level the walk plus noise)."""
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


def interpreted_gradients(args, bias, segment_ids, prune=False):
    """attention_backward's leaves, traced afresh under the current module switches and run in
    the GPU interpreter; asserts that the race detector found nothing."""
    interpret.reset()
    with interpret.gpu_interpret():
        grads = jax.jit(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                      segment_ids=segment_ids, prune=prune))(*args)
        grads = jax.block_until_ready(grads)
    assert not interpret.races_found()
    return jax.tree.leaves(grads)
