"""Attention and delta-rule ops under shard_map (mixer_core/shard.py): batch over data x
fsdp, heads over tensor, on 8 CPU devices.

The 8-device checks run in one subprocess (XLA_FLAGS must be set before JAX starts):
  * fpa, fox, softmax (ALiBi) and gdn through the wrapper on a (2, 2, 2) mesh equal the
    unsplit op on one device, values and gradients (the "xla" paths), and their programs
    hold a shard_map whose body sees B / 4 rows and H / 2 heads;
  * the Pallas kernels (fpa, fox, gdn; forward and backward) lowered for a Hopper GPU on that
    mesh get per-shard operands and no all-gather. The GPU interpreter cannot run the kernels
    of several devices at once (its shared-memory model is one global state), so on CPU the
    sharded numerics are those of the XLA paths, and the kernels' own numerics are their
    interpret-mode tests;
  * the trainer's step (an FPA + GDN model on fsdp 4 x tensor 2) traces one shard_map per
    mixer.
"""

import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType

from mixer_core.shard import (FPA_LAYOUTS, GDN_LAYOUTS, bound_axis_size, plan,
                               shard_batch_and_heads)
from tests.devices import run_on_cpu_devices
from tests.seeds import case_seed


SCRIPT = textwrap.dedent("""
    import json, re, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType
    import fpa_jax, gdn_jax
    from mixer_core import shard

    assert jax.device_count() == 8
    seed = int(sys.argv[1])
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    B, T, H, D = 4, 21, 2, 8
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 16))
    normal = lambda *shape: jax.random.normal(next(keys), shape)
    q, k, v = normal(B, T, H, D), normal(B, T, H, D), normal(B, T, H, D)
    cut = np.random.default_rng(seed).integers(1, T, B)
    segment_ids = jnp.asarray(np.where(np.arange(T)[None] < cut[:, None], 1, 2), jnp.int32)
    phi, psi = fpa_jax.fields(-jnp.abs(normal(B, T, H)) * 0.3, normal(B, T, H) * 0.5,
                              normal(B, T, H) * 0.5)
    beta = jnp.array([0.6, 1.4])
    log_forget = jax.nn.log_sigmoid(normal(B, T, H) + 2.0)
    HV = 4
    gq = normal(B, T, H, D); gq = gq / jnp.linalg.norm(gq, axis=-1, keepdims=True)
    gk = normal(B, T, H, D); gk = gk / jnp.linalg.norm(gk, axis=-1, keepdims=True)
    gv, gg, gb = normal(B, T, HV, D), -jnp.abs(normal(B, T, HV)) * 0.2, jax.nn.sigmoid(normal(B, T, HV))

    cases = {
        "fpa": (fpa_jax.fpa_attention, (q, k, v, phi, psi, beta), shard.FPA_LAYOUTS, "BTHD",
                dict(segment_ids=segment_ids, tau=0.7, implementation="xla")),
        "fox": (fpa_jax.fox_attention, (q, k, v, log_forget), shard.FOX_LAYOUTS, "BTHD",
                dict(segment_ids=segment_ids, implementation="xla")),
        "softmax_alibi": (fpa_jax.softmax_attention, (q, k, v), shard.SOFTMAX_LAYOUTS, "BTHD",
                          dict(segment_ids=segment_ids, alibi_slopes=fpa_jax.alibi_slopes(H),
                               implementation="xla")),
        "gdn": (gdn_jax.gated_delta_rule, (gq, gk, gv, gg, gb), shard.GDN_LAYOUTS,
                shard.GDN_OUT_LAYOUTS, dict(segment_ids=segment_ids, chunk_size=8,
                                            output_final_state=True, implementation="xla")),
    }
    out = {}
    for name, (op, args, layouts, out_layouts, kwargs) in cases.items():
        weights = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size).reshape(x.shape)),
                               jax.eval_shape(lambda *a: op(*a, **kwargs), *args))

        def loss(*a, wrapped):
            result = (shard.shard_batch_and_heads(op, *a, layouts=layouts,
                                                  out_layouts=out_layouts, **kwargs)
                      if wrapped else op(*a, **kwargs))
            return sum(jnp.sum(r * w) for r, w in zip(jax.tree.leaves(result),
                                                      jax.tree.leaves(weights))), result

        # the outputs and the gradients are compared; the scalar loss is not (it sums terms of
        # both signs, so its own size says nothing about the error of the terms)
        grad = lambda wrapped: jax.jit(jax.grad(
            lambda *a: loss(*a, wrapped=wrapped), argnums=tuple(range(len(args))), has_aux=True))
        want = grad(False)(*args)
        with jax.set_mesh(mesh):
            got = grad(True)(*args)
            text = str(jax.make_jaxpr(lambda *a: loss(*a, wrapped=True))(*args))
        out[name] = {
            "errors": [float(np.max(np.abs(a - b)) / (1e-6 + np.max(np.abs(b))))
                       for a, b in zip(jax.device_get(jax.tree.leaves(got)),
                                       jax.device_get(jax.tree.leaves(want)))],
            "shard_maps": text.count("shard_map["),
            "per_shard_q": f"f32[{B // 4},{T},{H // 2},{D}]" in text,
        }

    # Pallas kernels lowered for a Hopper GPU on the mesh: per-shard operands, no gather
    from mixer_kernels.mosaic_gpu.attention.vjp import fpa_pallas, fox_pallas
    from mixer_kernels.mosaic_gpu.gated_delta.register import gated_delta_rule_pallas
    PT, PD = 128, 64
    bq = jnp.zeros((B, PT, H, PD), jnp.bfloat16)
    vec, pseg = jnp.zeros((B, PT, H)), jnp.ones((B, PT), jnp.int32)
    bgv, bvec = jnp.zeros((B, PT, HV, PD), jnp.bfloat16), jnp.zeros((B, PT, HV))
    kernels = {
        "fpa": (lambda *a, segment_ids: fpa_pallas(*a, segment_ids, scale=0.125, tau=1.0,
                                                   query_level=False, content=True),
                (bq, bq, bq, vec, vec, jnp.ones((H,))), shard.FPA_LAYOUTS, "BTHD"),
        "fox": (lambda *a, segment_ids: fox_pallas(*a, segment_ids, scale=0.125),
                (bq, bq, bq, vec), shard.FOX_LAYOUTS, "BTHD"),
        "gdn": (lambda *a, segment_ids: gated_delta_rule_pallas(
                    *a, scale=0.125, initial_state=None, segment_ids=segment_ids, chunk_size=64),
                (bq, bq, bgv, bvec, bvec), shard.GDN_LAYOUTS, shard.GDN_OUT_LAYOUTS),
    }
    lowered = {}
    for name, (op, args, layouts, out_layouts) in kernels.items():
        def kernel_loss(*a):
            result = shard.shard_batch_and_heads(op, *a, layouts=layouts, out_layouts=out_layouts,
                                                 segment_ids=pseg)
            return sum(jnp.sum(r.astype(jnp.float32)) for r in jax.tree.leaves(result))
        try:   # one kernel failing to lower fails its own test only
            with jax.set_mesh(mesh):
                text = jax.jit(jax.grad(kernel_loss, argnums=tuple(range(len(args))))).trace(
                    *args).lower(lowering_platforms=("cuda",)).as_text()
        except Exception as error:
            lowered[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
            continue
        lowered[name] = {"mosaic": text.count("mosaic_gpu") > 0,
                         "all_gather": "all_gather" in text or "all-gather" in text,
                         "per_shard": f"tensor<{B // 4}x{PT}x{H // 2}x{PD}xbf16>" in text}
    out["lowered"] = lowered

    # the trainer: one shard_map per mixer in the train step
    from train.core.presets import load_config
    from train.core.session import build_session, to_global
    from train.core.sharding import make_mesh, mesh_context
    config = load_config(None, ["model.d_model=32", "model.num_layers=2", "model.pattern=GA",
        "attention.kind=fpa", "attention.num_heads=2", "attention.head_dim=16",
        "gdn.num_heads=2", "gdn.head_dim=16", "data.seq_len=16", "data.batch_size=8",
        "mesh.fsdp=4", "mesh.tensor=2"])
    session = build_session(config, 257, make_mesh((1, 4, 2)))
    batch = {"tokens": np.zeros((8, 17), np.int32), "segment_ids": np.ones((8, 17), np.int32)}
    with mesh_context(session.mesh):
        traced = session.train_step.trace(session.abstract_state, to_global(session, batch))
    out["trainer_shard_maps"] = str(traced.jaxpr).count("shard_map[")
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def eight_devices():
    return run_on_cpu_devices(SCRIPT, str(case_seed(1201)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fpa", "fox", "softmax_alibi", "gdn"])
def test_ops_split_over_batch_and_heads_equal_one_device(eight_devices, name):
    result = eight_devices[name]
    assert result["shard_maps"] >= 1 and result["per_shard_q"]
    assert max(result["errors"]) < 5e-5, result["errors"]  # float32, reductions reordered


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fpa", "fox", "gdn"])
def test_pallas_kernels_lower_per_shard_without_gathering(eight_devices, name):
    lowered = eight_devices["lowered"][name]
    assert lowered == {"mosaic": True, "all_gather": False, "per_shard": True}


@pytest.mark.slow
def test_the_trainer_step_runs_each_mixer_under_shard_map(eight_devices):
    # forward and backward of the GDN and the FPA layer
    assert eight_devices["trainer_shard_maps"] >= 2


def _mesh(data, fsdp, tensor):
    return AbstractMesh((data, fsdp, tensor), ("data", "fsdp", "tensor"),
                        axis_types=(AxisType.Auto,) * 3)


def test_plan_uses_the_axes_that_divide():
    def arrays(batch, heads, v_heads=None):
        shapes = [(batch, 5, heads, 4)] * 2 + [(batch, 5, v_heads or heads, 4)]
        shapes += [(batch, 5, v_heads or heads)] * 2
        return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]

    assert plan(GDN_LAYOUTS, arrays(8, 2, 4), _mesh(2, 2, 2)) == (("data", "fsdp"), ("tensor",))
    assert plan(GDN_LAYOUTS, arrays(8, 2, 4), _mesh(1, 4, 2)) == (("fsdp",), ("tensor",))
    assert plan(GDN_LAYOUTS, arrays(6, 2, 4), _mesh(2, 2, 2)) == ((), ("tensor",))
    assert plan(GDN_LAYOUTS, arrays(8, 3, 6), _mesh(2, 2, 2)) == (("data", "fsdp"), ())
    assert plan(GDN_LAYOUTS, arrays(8, 2, 4), _mesh(1, 1, 1)) == ((), ())
    assert plan(GDN_LAYOUTS, arrays(8, 2, 4), None) == ((), ())
    manual = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"),
                          axis_types=(AxisType.Manual,) * 3)
    assert plan(GDN_LAYOUTS, arrays(8, 2, 4), manual) == ((), ())


def test_without_a_mesh_the_op_is_called_and_layouts_are_checked():
    calls = []

    def op(q, k, v, phi, psi, beta, *, segment_ids=None, tau):
        calls.append((q.shape, segment_ids, tau))
        return q

    q = jnp.ones((2, 3, 4, 5))
    vec = jnp.ones((2, 3, 4))
    out = shard_batch_and_heads(op, q, q, q, vec, vec, jnp.ones(4), layouts=FPA_LAYOUTS, tau=0.5)
    assert out is q and calls == [((2, 3, 4, 5), None, 0.5)]
    with pytest.raises(ValueError, match=r"layouts\[3\]"):
        shard_batch_and_heads(op, q, q, q, q, vec, jnp.ones(4), layouts=FPA_LAYOUTS, tau=0.5)
    with pytest.raises(ValueError, match="one per argument"):
        shard_batch_and_heads(op, q, q, q, layouts=FPA_LAYOUTS, tau=0.5)


def test_bound_axis_size_inside_a_shard_map_and_its_error_outside():
    mesh = jax.make_mesh((1,), ("context",), axis_types=(AxisType.Auto,))
    sizes = jax.shard_map(lambda x: x * bound_axis_size("context"), mesh=mesh,
                          in_specs=jax.sharding.PartitionSpec("context"),
                          out_specs=jax.sharding.PartitionSpec("context"))(jnp.ones(1))
    assert sizes.tolist() == [1.0]
    with pytest.raises(ValueError, match="'context' is not a mesh axis bound here"):
        bound_axis_size("context")
