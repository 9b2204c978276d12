"""Mesh sharding: rules table, and multi-device training equal to one device (8 CPU devices).

The 8-device checks run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8
(the flag must be set before JAX starts).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.devices import run_on_cpu_devices, xla_flags
from train.core.config import ConfigError
from train.core.presets import load_config
from train.core.sharding import LOGICAL_AXIS_RULES, make_mesh, maybe_initialize_distributed
from train.core.validation import validate_for_devices

REPO = Path(__file__).resolve().parents[3]

MULTI_DEVICE_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from train.checkpoint.manager import Checkpointer
    from train.core.config import ConfigError
    from train.core.presets import load_config
    from train.core.session import build_session, host_init, to_global
    from train.core.sharding import make_mesh, mesh_context
    from train.core.validation import validate_for_devices

    assert jax.device_count() == 8, jax.devices()
    config = load_config(None, [
        "model.d_model=32", "model.pattern=GA", "model.vocab_multiple=64",
        "attention.kind=softmax", "attention.position=rope", "attention.num_heads=2",
        "attention.head_dim=16", "gdn.num_heads=2", "gdn.head_dim=16",
        "gdn.implementation=reference", "data.seq_len=32", "data.batch_size=8",
        "optim.warmup_steps=1", "train.steps=10", "optim.lr=3e-3"])
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(5):
        tokens = rng.integers(0, 257, (8, 33), dtype=np.int32)
        cut = rng.integers(1, 32, 8)
        segments = np.where(np.arange(33)[None] < cut[:, None], 1, 2).astype(np.int32)
        batches.append({"tokens": tokens, "segment_ids": segments})

    def steps(session, state, first, last):
        losses = []
        with mesh_context(session.mesh):
            for batch in batches[first:last]:
                state, metrics = session.train_step(state, to_global(session, batch))
                losses.append(float(metrics["loss"]))
        return state, losses

    single = build_session(config, 257, make_mesh((1, 1, 1), jax.devices()[:1]))
    with mesh_context(single.mesh):
        initial = jax.device_get(single.init_state())
    state, reference = steps(single, jax.device_put(initial, single.state_shardings), 0, 3)
    out = {"reference": reference, "runs": {}}

    # fsdp 4 x tensor 2 (data parallel alone: test_multi_gpu_script_on_eight_cpu_devices)
    sharded = build_session(config, 257, make_mesh((1, 4, 2)))
    sharded_state, losses = steps(sharded, jax.device_put(initial, sharded.state_shardings), 0, 3)
    out["runs"]["(1, 4, 2)"] = losses
    params = sharded_state["params"]
    out["specs"] = {
        "embedding": str(params["embed"]["embedding"].sharding.spec),
        "query": str(params["layers_1"]["mixer"]["query"]["kernel"].sharding.spec),
        "a_proj": str(params["layers_0"]["mixer"]["a_proj"]["kernel"].sharding.spec),
        "mlp_down": str(params["layers_0"]["mlp"]["down"]["kernel"].sharding.spec),
        "adam_mu_up": str(sharded_state["opt_state"][1].inner_states["default"]
                          .inner_state[0].mu["layers_0"]["mlp"]["up"]["kernel"].sharding.spec),
        "step": str(sharded_state["step"].sharding.spec),
    }
    out["embedding_shard_shape"] = list(params["embed"]["embedding"].addressable_shards[0].data.shape)

    # the state drawn on the host and placed on the shards (train.init_on="host", the
    # default) is the device-jitted init's, leaf by leaf and sharding by sharding
    with mesh_context(sharded.mesh):
        hosted, jitted = sharded.init_state(), sharded.init_jit(config.train.seed)
    pairs = list(zip(jax.tree.leaves(hosted), jax.tree.leaves(jitted)))
    out["host_init_equal"] = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    out["host_init_shardings"] = all(a.sharding.is_equivalent_to(b.sharding, a.ndim)
                                     for a, b in pairs)
    # ... and is drawn on the host's first CPU device inside the mesh's context too (under
    # jax.set_mesh a jitted program without committed inputs goes to the mesh's devices)
    drawn_on = set()

    def recording_init(seed):
        state = jax.jit(sharded.init_fn, static_argnums=0)(seed)
        drawn_on.update(d.id for leaf in jax.tree.leaves(state) for d in leaf.sharding.device_set)
        return state

    with mesh_context(sharded.mesh):
        host_init(recording_init, config.train.seed, sharded.state_shardings)
    out["host_init_devices"] = sorted(drawn_on)
    out["host_device"] = jax.local_devices(backend="cpu")[0].id

    # save on one device, restore onto fsdp 4 x tensor 2, continue: same losses as one device
    directory = tempfile.mkdtemp()
    with Checkpointer(directory, save_interval_steps=1, async_save=False) as checkpointer:
        checkpointer.save(3, state=state)
        restored = checkpointer.restore_latest(sharded.abstract_state)
    _, continued_single = steps(single, state, 3, 5)
    restored_state, continued_sharded = steps(sharded, restored.state, 3, 5)
    out["continued_single"] = continued_single
    out["continued_sharded"] = continued_sharded
    out["restored_query_spec"] = str(
        restored.state["params"]["layers_1"]["mixer"]["query"]["kernel"].sharding.spec)
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_eight_devices_train_like_one_and_restore_across_device_counts():
    """One test (one subprocess, so pytest-xdist runs it once): fsdp 4 x tensor 2 gives the
    one-device losses for 3 steps (a GDN + softmax model; data parallelism alone is checked
    by test_multi_gpu_script_on_eight_cpu_devices); params and Adam moments follow the rules table; a
    checkpoint saved on one device restores onto fsdp 4 x tensor 2 and continues identically;
    the state drawn on the host lands on the shards as the device-jitted init's."""
    result = run_on_cpu_devices(MULTI_DEVICE_SCRIPT)
    reference = result["reference"]
    assert len(set(reference)) == 3 and all(np.isfinite(reference))
    np.testing.assert_allclose(result["runs"]["(1, 4, 2)"], reference, rtol=0, atol=1e-5)

    specs = result["specs"]
    assert specs["embedding"] == str(P("tensor", "fsdp"))       # ("vocab", "embed")
    assert specs["query"] == str(P("fsdp", "tensor", None))     # ("embed", "heads", "head_dim")
    assert specs["a_proj"] == str(P("fsdp", "tensor"))          # ("embed", "v_heads")
    assert specs["mlp_down"] == str(P("tensor", "fsdp"))        # ("mlp", "embed")
    assert specs["adam_mu_up"] == str(P("fsdp", "tensor"))      # Adam moment = its param's
    assert specs["step"] == str(P())
    assert result["embedding_shard_shape"] == [160, 8]          # vocab / 2, embed / 4
    assert result["host_init_equal"] and result["host_init_shardings"]
    assert result["host_init_devices"] == [result["host_device"]]

    assert result["restored_query_spec"] == str(P("fsdp", "tensor", None))
    np.testing.assert_allclose(result["continued_sharded"], result["continued_single"],
                               rtol=0, atol=1e-5)


def test_rules_table_maps_each_logical_axis_once():
    names = [name for name, _ in LOGICAL_AXIS_RULES]
    assert len(names) == len(set(names))
    rules = dict(LOGICAL_AXIS_RULES)
    assert rules["batch"] == ("data", "fsdp") and rules["embed"] == "fsdp"
    assert {rules[n] for n in ("vocab", "mlp", "heads", "heads_x_dim", "v_heads")} == {"tensor"}


def test_indivisible_dimensions_fall_back_to_replication():
    from jax.sharding import AbstractMesh, AxisType

    from train.core.sharding import _fit_to_shape

    mesh = AbstractMesh((2, 4, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    assert _fit_to_shape(P("tensor", "fsdp"), (257, 32), mesh) == P(None, "fsdp")
    assert _fit_to_shape(P(("data", "fsdp"), None), (8, 33), mesh) == P(("data", "fsdp"), None)
    assert _fit_to_shape(P(("data", "fsdp"), None), (12, 33), mesh) == P(None, None)
    assert _fit_to_shape(P("fsdp"), (8, 3), mesh) == P("fsdp", None)


def test_single_process_environment_does_not_initialize_distributed(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert maybe_initialize_distributed() is False


def test_make_mesh_checks_the_device_count():
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    with pytest.raises(ValueError, match="sizes"):
        make_mesh((2, 1, 1), jax.devices()[:1])
    with pytest.raises(ConfigError, match="does not divide"):
        validate_for_devices(load_config(None, ["mesh.tensor=2"]), 1)


@pytest.mark.slow
def test_multi_gpu_script_on_eight_cpu_devices(tmp_path):
    """benchmarks/multi_gpu.py at a tiny size: the three layouts (data parallel, fsdp x tensor,
    context parallel over all 8 devices: softmax's ring path, 2 tokens per device) train like
    one device (float32), and their checkpoints restore on one device and continue identically;
    the context layout is timed on one device's batch (1 row), the others on 8 rows."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(8),
               JAX_PLATFORMS="cpu")
    completed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "multi_gpu.py"), "--config", "tiny_softmax",
         "--steps", "1", "--loss-steps", "2", "--batch-per-device", "1", "--context", "16",
         "--loss-tol", "1e-4", "--out", str(tmp_path), "model.d_model=16", "model.num_layers=1",
         "attention.num_heads=2", "attention.head_dim=8"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "fsdp x tensor" in completed.stdout and "scaling" in completed.stdout
    assert "x context 8" in completed.stdout and "speed ratio" in completed.stdout
    result = json.loads((tmp_path / "multi_gpu-tiny_softmax-8dev.json").read_text())
    assert result["devices"] == 8 and len(result["one_device"]["losses"]) == 2
    assert result["skipped"] == {}
    meshes = {name: layout["mesh"] for name, layout in result["layouts"].items()}
    assert meshes == {"data parallel": {"data": 8, "fsdp": 1, "tensor": 1, "context": 1},
                      "fsdp x tensor": {"data": 1, "fsdp": 4, "tensor": 2, "context": 1},
                      "context parallel": {"data": 1, "fsdp": 1, "tensor": 1, "context": 8}}
    assert {name: layout["timed_rows"] for name, layout in result["layouts"].items()} == {
        "data parallel": 8, "fsdp x tensor": 8, "context parallel": 1}
    for layout in result["layouts"].values():
        assert layout["losses_agree"] and layout["max_loss_difference"] < 1e-4
        assert layout["restore_agrees"] and layout["restored_step"] == 2
        assert len(layout["continued_on_one_device"]) == 2
        assert layout["tokens_per_second"] > 0 and layout["scaling"] > 0
        assert layout["speed_ratio"] == pytest.approx(8 * layout["scaling"])


def test_multi_gpu_context_layout_only_for_presets_that_split_sequences():
    from benchmarks.multi_gpu import CONTEXT_LAYOUT, context_layout, table

    config, sizes = context_layout(load_config("tiny_hybrid", ["data.batch_size=8"]), 8, 2)
    assert sizes == (4, 1, 1, 2) and config.mesh.context == 2 and config.mesh.data == 4
    with pytest.raises(ConfigError, match="supports attention.kind"):
        context_layout(load_config("tiny_softmax", ["attention.kind=selective"]), 8, 8)
    with pytest.raises(ConfigError, match="divisible by mesh.context"):
        context_layout(load_config("tiny_fpa", ["data.seq_len=100"]), 8, 8)
    skipped = {"config": "tiny_selective", "devices": 8, "device": "cpu", "platform": "cpu",
               "seq_len": 16, "batch_per_device": 1, "one_device": {"tokens_per_second": 1.0},
               "layouts": {}, "skipped": {CONTEXT_LAYOUT: "no ring path"}}
    assert [[part.strip() for part in line.split(" | ")] for line in table(skipped).splitlines()
            if line.startswith(CONTEXT_LAYOUT)] == [
        [CONTEXT_LAYOUT, "skipped for tiny_selective: no ring path"]]


def test_multi_gpu_script_refuses_a_context_split_that_does_not_fit(capsys):
    from benchmarks.multi_gpu import main

    assert main(["--config", "tiny_softmax", "--devices", "1", "--context-devices", "3"]) == 2
    assert capsys.readouterr().err.startswith("error: --context-devices 3")


def test_multi_gpu_script_refuses_more_devices_than_present(capsys):
    from benchmarks.multi_gpu import main

    assert main(["--config", "tiny_softmax", "--devices", str(jax.local_device_count() + 1)]) == 2
    assert capsys.readouterr().err.startswith("error: --devices")
