"""Inputs and comparisons shared by the attention baseline tests in tests/fpa_jax/baselines/:
seeded normal arrays, q, k, v and sorted document ids, a float64 closeness check, an op's output
and input gradients in one compile, and inputs whose content logits are all zero, so that the
output rows are the attention weights."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.seeds import case_seed


def _normal(seed, shape, dtype=jnp.float32):
    """Drawn with NumPy (jax.random would compile a program per shape)."""
    rng = np.random.default_rng(case_seed(seed))
    return jnp.asarray(rng.standard_normal(shape, np.float32).astype(dtype))


def _qkv(seed, shape, dtype=jnp.float32):
    return tuple(_normal(seed * 10 + i, shape, dtype) for i in range(3))


def _segments(seed, batch, length, count=3):
    """Sorted random document ids [B, T] int32 (contiguous documents)."""
    ids = np.random.default_rng(case_seed(seed)).integers(0, count, (batch, length))
    return jnp.asarray(np.sort(ids, axis=1).astype(np.int32))


def _close(actual, expected, tol):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=tol, atol=tol)


def _out_and_grads(fn, weight, *args):
    """One compile: out = fn(*args) and d/d args of sum(out * weight)."""
    def loss(*args):
        out = fn(*args)
        return jnp.sum(out.astype(jnp.float32) * weight), out

    grads, out = jax.jit(jax.grad(loss, argnums=tuple(range(len(args))), has_aux=True))(*args)
    return out, grads


def _uniform_content(length):
    """q = k = 0 (all content logits 0), v = one-hot of the position: out rows = weights."""
    q = jnp.zeros((1, length, 1, 2))
    v = jnp.eye(length).reshape(1, length, 1, length)
    return q, q, v
