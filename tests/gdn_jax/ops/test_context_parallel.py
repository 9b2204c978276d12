"""Context-parallel gated delta rule (gdn_jax/ops/context_parallel.py) against the unsplit op.

The multi-device checks run in one subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag must be set before JAX starts):
values, final state and gradients of every input.
"""

import textwrap

import jax.numpy as jnp
import pytest

from gdn_jax.ops.context_parallel import context_parallel_gated_delta_rule
from tests.devices import run_on_cpu_devices
from tests.seeds import case_seed


SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    from gdn_jax.ops import gated_delta_rule
    from gdn_jax.ops.context_parallel import context_parallel_gated_delta_rule

    FAST = {"xla_backend_optimization_level": 0}

    def inputs(seed, batch, length, heads, v_heads, key_dim, value_dim):
        rng = np.random.default_rng(seed)
        unit = lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
        f32 = lambda x: jnp.asarray(x, jnp.float32)
        return (f32(unit(rng.standard_normal((batch, length, heads, key_dim)))),
                f32(unit(rng.standard_normal((batch, length, heads, key_dim)))),
                f32(rng.standard_normal((batch, length, v_heads, value_dim))),
                f32(-rng.uniform(0.0, 0.4, (batch, length, v_heads))),   # g: mild decay
                f32(rng.uniform(0.0, 1.0, (batch, length, v_heads))),
                f32(rng.standard_normal((batch, v_heads, key_dim, value_dim))))

    def compare(devices, args, segment_ids, with_initial, chunk):
        mesh = jax.make_mesh((devices,), ("context",), axis_types=(jax.sharding.AxisType.Auto,),
                             devices=jax.devices()[:devices])
        segment_ids = None if segment_ids is None else jnp.asarray(segment_ids)
        def unsplit(q, k, v, g, beta, state):
            return gated_delta_rule(q, k, v, g, beta, initial_state=state if with_initial else None,
                                    output_final_state=True, segment_ids=segment_ids,
                                    chunk_size=chunk)
        def split(q, k, v, g, beta, state):
            time = P(None, "context")
            def local(q, k, v, g, beta, state, segment_ids):
                return context_parallel_gated_delta_rule(
                    q, k, v, g, beta, axis_name="context",
                    initial_state=state if with_initial else None, output_final_state=True,
                    segment_ids=segment_ids, chunk_size=chunk)
            seg_spec = None if segment_ids is None else time
            return jax.shard_map(local, mesh=mesh, in_specs=(time,) * 5 + (P(), seg_spec),
                                 out_specs=(time, P()))(q, k, v, g, beta, state, segment_ids)
        weights = jnp.asarray(np.random.default_rng(1).standard_normal(args[5].shape), jnp.float32)
        def loss(fn):
            def value(*a):
                out, final = fn(*a)
                return jnp.sum(jnp.sin(out)) + jnp.sum(weights * final), (out, final)
            return jax.jit(jax.grad(value, argnums=tuple(range(6)), has_aux=True),
                           compiler_options=FAST)(*args)
        (grads, (out, final)), (want_grads, (want_out, want_final)) = loss(split), loss(unsplit)
        err = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))   # on the host
                                 / (1e-6 + np.max(np.abs(np.asarray(b)))))
        names = ("q", "k", "v", "g", "beta", "initial_state")
        return {"out": err(out, want_out), "final": err(final, want_final),
                **{name: err(g, w) for name, g, w in zip(names, grads, want_grads)
                   if with_initial or name != "initial_state"}}

    result = {}
    # 4 devices x 13 tokens, chunk 8 (ragged), grouped value heads, an initial state, one
    # document starting exactly at device 1's first token and one inside device 2
    segments = np.ones((2, 52), np.int32)
    segments[0, 13:] = 2
    segments[1, 31:] = 3
    result["documents"] = compare(4, inputs(SEED, 2, 52, 1, 2, 4, 3), segments, True, 8)
    # 8 devices x 1 token, no initial state, no documents
    result["one_token_each"] = compare(8, inputs(SEED + 1, 1, 8, 2, 2, 3, 5), None, False, 4)
    print("RESULT " + json.dumps(result))
""")


@pytest.mark.slow
def test_context_parallel_matches_unsplit_values_state_and_gradients():
    result = run_on_cpu_devices(SCRIPT.replace("SEED", str(case_seed(120))))
    for case, errors in result.items():
        for name, error in errors.items():
            assert error < 2e-5, (case, name, error)   # relative to the largest entry


def test_outside_shard_map_names_the_axis():
    x = jnp.zeros((1, 4, 1, 2))
    gates = jnp.zeros((1, 4, 1))
    with pytest.raises(ValueError, match="axis_name: 'context'"):
        context_parallel_gated_delta_rule(x, x, x, gates, gates, axis_name="context")
