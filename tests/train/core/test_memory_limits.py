"""Early memory checks where the platform reports no device memory (CPU: the host's memory is
the limit) and for `eval` (a forward's lower bound, checked before anything is restored or
compiled; XLA's out-of-memory there as one line naming --seq-len / --batch-size).

Nothing here runs a step that needs the memory it is refused: the limits are faked through
the sysconf / cgroup readers of train/core/memory.py, never device_memory_bytes itself.
"""

import gc
import types

import jax
import jax.numpy as jnp
import pytest

import train.core.evaluate
import train.core.memory
from tests.seeds import case_seed
from tests.train import tiny_run
from train.checkpoint.run_files import save_run_files
from train.cli.entry import main
from train.core.memory import (cgroup_memory_limit_bytes, check_fits, describe_limit,
                               device_memory_bytes, estimate_eval_memory, estimate_train_memory)
from train.core.presets import load_config
from train.core.session import build_session
from train.data.tokenizer import load_tokenizer

TINY = tiny_run.TINY
KIB, GIB = 2**10, 2**30


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_run.write_corpus(tmp_path_factory.mktemp("corpus"), seed=case_seed(1400),
                                 documents=8)


def host_memory(monkeypatch, physical, cgroup=None):
    monkeypatch.setattr(train.core.memory, "physical_memory_bytes", lambda: physical)
    monkeypatch.setattr(train.core.memory, "cgroup_memory_limit_bytes", lambda: cgroup)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ------------------------------------------------------------------ CPU: the host's memory

def test_cpu_device_memory_is_the_smaller_of_ram_and_the_cgroup_limit(monkeypatch, tmp_path):
    assert jax.local_devices()[0].platform == "cpu"
    devices = len(jax.local_devices())
    host_memory(monkeypatch, 8 * GIB)
    assert device_memory_bytes() == 8 * GIB // devices
    host_memory(monkeypatch, 8 * GIB, cgroup=3 * GIB)
    assert device_memory_bytes() == 3 * GIB // devices
    host_memory(monkeypatch, None, cgroup=5 * GIB)
    assert device_memory_bytes() == 5 * GIB // devices
    host_memory(monkeypatch, None)
    assert device_memory_bytes() is None
    assert describe_limit(None) == " (device memory not reported)"
    assert describe_limit(3 * GIB) == " of 3.00 GiB of host memory" + (
        f" (1/{devices} of it per CPU device)" if devices > 1 else "")

    # the cgroup reader: v2 "max" at the root, this process's cgroup and its parent (the
    # lowest wins), v1's "unlimited"; a process outside any memory limit reads None
    root, self_cgroup = tmp_path / "cgroup", tmp_path / "self_cgroup"
    (root / "jobs" / "job7").mkdir(parents=True)
    (root / "memory.max").write_text("max\n")
    (root / "jobs" / "memory.max").write_text(f"{6 * GIB}\n")
    (root / "jobs" / "job7" / "memory.max").write_text(f"{7 * GIB}\n")
    self_cgroup.write_text("0::/jobs/job7\n")
    assert cgroup_memory_limit_bytes(root, self_cgroup) == 6 * GIB
    (root / "memory" / "slurm").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "slurm" / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    self_cgroup.write_text("4:memory:/slurm\n2:cpu,cpuacct:/other\n")
    assert cgroup_memory_limit_bytes(root, self_cgroup) == 2 * GIB
    self_cgroup.write_text("4:memory:/\n")
    assert cgroup_memory_limit_bytes(root, self_cgroup) is None
    assert cgroup_memory_limit_bytes(tmp_path / "absent", tmp_path / "absent") is None


def test_cpu_fit_refuses_a_step_beyond_host_memory_and_tiny_runs_fit(tmp_path, corpus, capsys,
                                                                     monkeypatch):
    config = load_config(None, TINY)
    session = build_session(config, 257)
    estimate = estimate_train_memory(config, session.abstract_state, 257, (1, 1, 1))
    check_fits(config, estimate, device_memory_bytes())       # this machine's real host limit

    host_memory(monkeypatch, 64 * KIB, cgroup=48 * KIB)
    argv = ["fit", "tiny_softmax", *TINY, f"data.source={corpus}", "train.steps=2",
            "train.tensorboard=false", "--run-dir", str(tmp_path / "run")]
    gc.collect()   # an earlier test's garbage, freed during the run, would lower the count
    live = len(jax.live_arrays())
    assert main(argv) == 1
    line = one_error_line(capsys)
    assert line.startswith("error: the train step needs at least ")
    assert "more than the 48.00 KiB of host memory" in line and "lower data.batch_size (2)" in line
    assert len(jax.live_arrays()) == live and not (tmp_path / "run").exists()


# ------------------------------------------------------------------ eval

def make_run_dir(tmp_path, corpus, *more):
    """A run directory with its config and tokenizer only: the eval check needs no
    checkpoint, since it comes before the restore."""
    config = load_config(None, [*TINY, f"data.source={corpus}", *more])
    run_dir = tmp_path / "run"
    save_run_files(run_dir, config=config.to_dict(), tokenizer=load_tokenizer("byte"))
    return run_dir


class Restored(Exception):
    """Raised by the faked restore: the eval got past its memory check."""


def test_eval_refuses_a_forward_that_cannot_fit_before_restoring(tmp_path, corpus, capsys,
                                                                 monkeypatch):
    run_dir = make_run_dir(tmp_path, corpus)

    def restore(*args, **kwargs):
        raise Restored

    monkeypatch.setattr(train.core.evaluate, "restore_run_state", restore)
    monkeypatch.setattr(train.core.evaluate, "make_split_dataset", restore)
    host_memory(monkeypatch, 8 * GIB)
    gc.collect()   # an earlier test's garbage, freed during the run, would lower the count
    live = len(jax.live_arrays())
    assert main(["eval", str(run_dir), "--seq-len", "50000000", "--batches", "1"]) == 1
    line = one_error_line(capsys)
    assert line.startswith("error: the eval forward needs at least ")
    assert "a lower bound" in line and "more than the 8.00 GiB of host memory" in line
    assert line.endswith("lower --seq-len (50000000) or --batch-size (2)")
    assert len(jax.live_arrays()) == live                     # nothing allocated
    assert not list(run_dir.glob("eval-*"))

    # --batch-size counts too, and the advice names it
    host_memory(monkeypatch, 4 * GIB)
    assert main(["eval", str(run_dir), "--seq-len", "1000000", "--batch-size", "40"]) == 1
    assert one_error_line(capsys).endswith("lower --seq-len (1000000) or --batch-size (40)")
    # the same lengths fit where the host has room: on to the restore
    host_memory(monkeypatch, 1024 * GIB)
    with pytest.raises(Restored):
        main(["eval", str(run_dir), "--seq-len", "1000000", "--batch-size", "40"])
    assert main(["eval", str(run_dir), "--suite", "long", "--batch-size", "4"]) == 1
    assert one_error_line(capsys) == "error: --batch-size: not used by --suite long"


def test_out_of_memory_during_eval_is_one_line_naming_seq_len_and_batch_size(
        tmp_path, corpus, capsys, monkeypatch):
    run_dir = make_run_dir(tmp_path, corpus)
    monkeypatch.setattr(train.core.evaluate, "restore_run_state",
                        lambda *args, **kwargs: types.SimpleNamespace(step=3,
                                                                      state={"params": None}))
    monkeypatch.setattr(train.core.evaluate, "make_split_dataset", lambda *args, **kwargs: [])

    def evaluate(*args, **kwargs):
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 3.50GiB.\nmore")

    monkeypatch.setattr(train.core.evaluate, "evaluate", evaluate)
    assert main(["eval", str(run_dir), "--seq-len", "4096"]) == 1
    assert one_error_line(capsys) == ("error: out of device memory (could not allocate "
                                      "3.50GiB): lower --seq-len (4096) or --batch-size (2)")


@pytest.mark.parametrize("more", [[], ["model.dtype=bfloat16", "data.seq_len=37",
                                       "data.batch_size=3"]])
def test_eval_estimate_is_a_lower_bound_of_what_xla_allocates(more):
    """The eval estimate against XLA's own buffer assignment for the compiled eval step
    (arguments + outputs + temporaries): never above it, so nothing that fits is refused."""
    config = load_config(None, [*TINY, *more])
    session = build_session(config, 257)
    params = session.abstract_state["params"]
    estimate = estimate_eval_memory(config, params, 257, (1, 1, 1))
    rows, length = config.data.batch_size, config.data.seq_len
    assert estimate.tokens_per_device == rows * length
    batch = {name: jax.ShapeDtypeStruct((rows, length + 1), jnp.int32)
             for name in ("tokens", "segment_ids")}
    stats = session.eval_step.lower(params, batch).compile().memory_analysis()
    allocated = (stats.argument_size_in_bytes + stats.output_size_in_bytes
                 + stats.temp_size_in_bytes)
    assert estimate.total_bytes <= allocated
    assert estimate.total_bytes > allocated / 4                # and not a trivial bound
    # far below the train step's; split over the mesh as the model shards it
    train_estimate = estimate_train_memory(config, session.abstract_state, 257, (1, 1, 1))
    assert estimate.total_bytes < train_estimate.total_bytes / 2
    split = estimate_eval_memory(config, params, 257, (2, 1, 2, 2))
    assert split.tokens_per_device == -(-rows * length // 4)
    assert split.param_bytes == -(-estimate.param_bytes // 2)
    assert split.activation_bytes_per_token < estimate.activation_bytes_per_token
    with pytest.raises(ValueError, match="mesh_shape"):
        estimate_eval_memory(config, params, 257, (1, 0, 1))
