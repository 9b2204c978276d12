"""Inputs and compiled calls of the gated delta rule shared by tests/gdn_jax/ops/test_ops.py,
test_chunk.py and test_naive.py. Keys and queries are L2-normalised and beta lies in (0, 1), as
in the real layer. Compiled functions use XLA's lowest backend optimisation level: it changes
compile time only (several-fold on CPU), not what is computed; `chunked` and `recurrent` are
compiled once per shape for all three files.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gdn_jax.ops import gated_delta_rule, recurrent_gated_delta_rule
from tests.seeds import case_seed

FAST_COMPILE = {"xla_backend_optimization_level": 0}
ARGUMENT_NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def l2_normalise(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def log_decay(rng, shape, regime):
    """g = log alpha in the three regimes that stress an implementation differently."""
    if regime == "normal":        # alpha spread over (0.37, 1)
        return -rng.uniform(1e-3, 1.0, shape)
    if regime == "near_one":      # alpha = 1 - 1e-4: the state keeps almost everything
        return -1e-4 * rng.uniform(0.5, 1.5, shape)
    if regime == "strong":        # alpha ~ exp(-5): chunk-cumulative decays underflow
        return -5.0 * rng.uniform(0.8, 1.2, shape)
    raise ValueError(regime)


def make_inputs(seed, batch, seq_len, heads, v_heads, key_dim, value_dim, *, regime="normal",
                aligned_keys=False, dtype=jnp.float32):
    """Fresh (q, k, v, g, beta, initial_state) for the given seed.

    aligned_keys: nearly parallel keys and beta in (0.9, 1), the strongest intra-chunk coupling.
    Drawn with NumPy: eager jax.random costs seconds of compilation for every new shape.
    """
    rng = np.random.default_rng(case_seed(seed))
    q = l2_normalise(rng.standard_normal((batch, seq_len, heads, key_dim)))
    k = rng.standard_normal((batch, seq_len, heads, key_dim))
    if aligned_keys:
        k = rng.standard_normal((batch, 1, heads, key_dim)) + 0.05 * k
    k = l2_normalise(k)
    v = rng.standard_normal((batch, seq_len, v_heads, value_dim))
    g = log_decay(rng, (batch, seq_len, v_heads), regime)
    beta = 1.0 / (1.0 + np.exp(-2.0 * rng.standard_normal((batch, seq_len, v_heads))))
    if aligned_keys:
        beta = rng.uniform(0.9, 1.0, (batch, seq_len, v_heads))
    state = 0.5 * rng.standard_normal((batch, v_heads, key_dim, value_dim))
    return (tuple(jnp.asarray(x, dtype) for x in (q, k, v, g, beta))
            + (jnp.asarray(state, jnp.float32),))


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-30)


def packed_segment_ids(document_lengths_per_row, ids_per_row):
    """[B, T] int32 ids from per-row document lengths and the id each document gets."""
    rows = [np.repeat(ids, lengths) for lengths, ids in zip(document_lengths_per_row, ids_per_row)]
    return jnp.asarray(np.stack(rows), dtype=jnp.int32)


@functools.partial(jax.jit, static_argnames=("chunk_size",), compiler_options=FAST_COMPILE)
def chunked(q, k, v, g, beta, state, segment_ids=None, *, chunk_size):
    """(out, final_state) of the chunked form; compiled once per shape across tests."""
    return gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                            segment_ids=segment_ids, chunk_size=chunk_size)


@functools.partial(jax.jit, compiler_options=FAST_COMPILE)
def recurrent(q, k, v, g, beta, state, segment_ids=None):
    """(out, final_state) of the token-by-token oracle."""
    return recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                      output_final_state=True, segment_ids=segment_ids)
