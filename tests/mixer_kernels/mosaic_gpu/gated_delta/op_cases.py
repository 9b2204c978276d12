"""Inputs of the gated delta op for the tests of its "pallas" switches: unit-norm q, k, HV = 2H,
g in [gate_low, 0], beta in [0, 1], one document boundary, and a cotangent of the output."""

import jax.numpy as jnp
import numpy as np


def op_arguments(seed, seq_len, *, dim=64, heads=1, group=2, dtype=jnp.float32, gate_low=-0.3,
                 initial_state=False, boundary=None):
    """((q, k, v, g, beta[, initial_state]), segment_ids [1, T] (a new document from
    `boundary`, default T // 3), d_out [1, T, HV, V] float32); g float32, the rest `dtype`."""
    rng = np.random.default_rng(seed)
    value_heads = heads * group

    def unit(shape):
        x = rng.standard_normal(shape)
        return jnp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True), dtype)

    args = [unit((1, seq_len, heads, dim)), unit((1, seq_len, heads, dim)),
            jnp.asarray(rng.standard_normal((1, seq_len, value_heads, dim)), dtype),
            jnp.asarray(rng.uniform(gate_low, 0.0, (1, seq_len, value_heads)), jnp.float32),
            jnp.asarray(rng.uniform(0.0, 1.0, (1, seq_len, value_heads)), dtype)]
    if initial_state:
        args.append(jnp.asarray(0.5 * rng.standard_normal((1, value_heads, dim, dim)),
                                jnp.float32))
    start = seq_len // 3 if boundary is None else boundary
    segment_ids = jnp.asarray((np.arange(seq_len) >= start)[None], jnp.int32)
    d_out = jnp.asarray(rng.standard_normal((1, seq_len, value_heads, dim)), jnp.float32)
    return tuple(args), segment_ids, d_out
