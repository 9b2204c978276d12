"""Inputs of the gated delta op for the tests of its "pallas" switches: unit-norm q, k, HV = 2H,
g in [gate_low, 0], beta in [0, 1], one document boundary, and a cotangent of the output; and
the check of the interpreted op against the token-by-token oracle."""

import jax
import jax.numpy as jnp
import numpy as np

from gdn_jax.ops import api
from mixer_core import interpret


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


def assert_op_matches_the_oracle(args, segment_ids, d_out, bound=1e-4):
    """The "pallas" op, interpreted, against "reference": output and the gradients of q, k, v,
    g, beta, each within `bound` relative error."""
    def run(implementation):
        def loss(*xs):
            out, _ = api.gated_delta_rule(*xs, segment_ids=segment_ids,
                                          implementation=implementation)
            return jnp.sum(d_out * out), out
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))(
            *args)
        return (out, *grads)

    with interpret.gpu_interpret():
        got = run("pallas")
    for label, a, b in zip(("out", "dq", "dk", "dv", "dg", "dbeta"), got, run("reference")):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        error = np.linalg.norm(a - b) / np.linalg.norm(b)
        assert error < bound, (label, error)
