"""Trainer reliability, issue 11 items 3, 7, 10, 11: the memory estimate and out-of-memory
errors, metrics that survive crashes and resumes, startup feedback and `config`, the run
record, gradient accumulation.

One real (in-process) fit pair for the parts that need a run; everything else on its pieces.
"""

import json
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train.core.fit
import train.core.memory
from tests.seeds import case_seed
from tests.train import tiny_run
from train.cli.entry import main
from train.core.memory import (DeviceMemoryError, check_fits, estimate_train_memory,
                               out_of_memory_error)
from train.core.metrics import METRICS_FILE, MetricsWriter, read_metrics
from train.core.presets import load_config
from train.core.session import build_session

TINY = tiny_run.TINY


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_run.write_corpus(tmp_path_factory.mktemp("corpus"), seed=case_seed(1200))


def tensorboard_scalars(events_dir: Path) -> list[list[tuple[str, int]]]:
    """(tag, step) of every scalar, per event file (TFRecord framing, tensorboardX's proto)."""
    from tensorboardX.proto.event_pb2 import Event

    files = []
    for path in sorted(events_dir.glob("events.out.tfevents.*")):
        data, offset, scalars = path.read_bytes(), 0, []
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            scalars += [(value.tag, event.step) for value in event.summary.value]
        files.append(scalars)
    return files


# ------------------------------------------------------------------ item 3: memory

def test_memory_estimate_scales_and_refuses_what_cannot_fit():
    config = load_config(None, TINY)
    session = build_session(config, 257)                      # abstract shapes only
    estimate = estimate_train_memory(config, session.abstract_state, 257, (1, 1, 1))
    params = sum(x.size for x in jax.tree.leaves(session.abstract_state["params"]))
    assert estimate.gradient_bytes == 4 * params
    # params + adam mu, nu (+ a few step counters)
    assert 3 * 4 * params <= estimate.state_bytes <= 3 * 4 * params + 64
    assert estimate.tokens_per_device == 2 * 16

    def estimate_for(*more):
        c = load_config(None, [*TINY, *more])
        return estimate_train_memory(c, session.abstract_state, 257, (1, 1, 1))

    doubled = estimate_for("data.batch_size=4")
    assert doubled.activation_bytes == 2 * estimate.activation_bytes
    assert estimate_for("data.batch_size=4", "train.grad_accum=2").activation_bytes == \
        estimate.activation_bytes                              # one micro-batch is live
    deep = estimate_for("model.num_layers=4").activation_bytes
    assert estimate.activation_bytes < deep
    assert estimate_for("model.num_layers=4", "model.remat=true").activation_bytes < deep
    assert estimate_train_memory(config, session.abstract_state, 257,
                                 (2, 1, 1)).tokens_per_device == 16
    assert estimate_train_memory(config, session.abstract_state, 257,
                                 (1, 1, 1, 4)).tokens_per_device == 8   # time split over context

    check_fits(config, estimate, None)                         # CPU: nothing to compare to
    check_fits(config, estimate, estimate.total_bytes)
    with pytest.raises(DeviceMemoryError, match=r"lower data.batch_size \(2\) or data.seq_len "
                                                r"\(16\), raise train.grad_accum"):
        check_fits(config, estimate, estimate.total_bytes - 1)


def test_out_of_memory_becomes_one_error_line(tmp_path, corpus, capsys, monkeypatch):
    config = load_config(None, TINY)
    oom = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17.18GiB.\nmore detail")
    mapped = out_of_memory_error(oom, config)
    assert isinstance(mapped, DeviceMemoryError) and "17.18GiB" in str(mapped)
    assert "set model.remat=true" in str(mapped)
    # XLA's GPU autotuner words it on a later line (seen on an H200, 2026-12-01)
    autotuner = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Failed to get configs for: 5 out of 176 instructions. Example "
        "failure:\n  %fusion = ...\nStatus: RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 128.02GiB with allocator GPU_0_bfc on device 0.")
    assert "(could not allocate 128.02GiB)" in str(out_of_memory_error(autotuner, config))
    assert out_of_memory_error(jax.errors.JaxRuntimeError("INTERNAL: other"), config) is None
    assert out_of_memory_error(MemoryError("host"), config) is None

    argv = ["fit", "tiny_softmax", *TINY, f"data.source={corpus}", "train.steps=2",
            "train.tensorboard=false"]
    # a device that reports 64 KiB: refused before compiling, no run directory left behind
    monkeypatch.setattr(train.core.fit, "device_memory_bytes", lambda: 2**16)
    assert main([*argv, "--run-dir", str(tmp_path / "small")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "compiling" not in "\n".join(err) and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: the train step needs at least") and "64.00 KiB" in err[-1]
    assert not (tmp_path / "small").exists()
    monkeypatch.undo()

    # XLA runs out of memory in the step: one line too
    original = train.core.fit.build_session

    def build_session_that_runs_out(*args, **kwargs):
        session = original(*args, **kwargs)

        def train_step(state, batch):
            raise oom

        session.train_step = train_step
        return session

    monkeypatch.setattr(train.core.fit, "build_session", build_session_that_runs_out)
    assert main([*argv, "--run-dir", str(tmp_path / "oom")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: out of device memory (could not allocate ")
    assert "lower data.batch_size (2)" in last


# ------------------------------------------------------------------ item 7: metrics

def test_torn_line_and_replayed_steps_are_repaired_and_tensorboard_is_one_stream(tmp_path):
    writer = MetricsWriter(tmp_path, resume_step=0)
    for step in range(1, 7):
        writer.write("train", step, {"loss": 1.0 / step})
    writer.write("eval", 6, {"loss": 0.5})
    writer.close()
    with open(tmp_path / METRICS_FILE, "a") as f:            # a crash in the middle of a write
        f.write('{"kind": "train", "step": 7, "lo')

    records = read_metrics(tmp_path)                          # readers skip the torn line
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 7))
    from train.tools.plot import plot_run
    assert [p.name for p in plot_run(tmp_path)] == ["loss.png"]

    # resumed from checkpoint 4: steps 5.. are replayed, so their old records go
    writer = MetricsWriter(tmp_path, resume_step=4)
    for step in range(5, 8):
        writer.write("train", step, {"loss": 2.0 / step})
    writer.close()
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    raw = [json.loads(line) for line in lines]                # every line parses
    assert [(r["kind"], r["step"]) for r in raw] == [("train", s) for s in range(1, 8)]
    assert [r["loss"] for r in raw[4:]] == [2.0 / s for s in range(5, 8)]

    (events,) = tensorboard_scalars(tmp_path / "tensorboard")  # one event file
    assert events == [("train/loss", s) for s in range(1, 8)]  # each step once, in order

    # resumed from checkpoint 6 with TensorBoard switched off: the old stream is cut to match
    MetricsWriter(tmp_path, tensorboard=False, resume_step=6).close()
    (events,) = tensorboard_scalars(tmp_path / "tensorboard")
    assert events == [("train/loss", s) for s in range(1, 7)]


def test_a_damaged_metrics_file_is_a_one_line_error(tmp_path, capsys):
    """Damage before the final line is no crash's torn write: `plot` (and a resume, through
    the same reader) refuses it in one `error:` line naming the line; so does a run with
    nothing to plot."""
    (tmp_path / METRICS_FILE).write_text('{"kind": "train", "step": 1, "loss": 1.0}\n'
                                         '{"kind": "tr\n'
                                         '{"kind": "train", "step": 2, "loss": 0.5}\n')
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / METRICS_FILE}: line 2 is "
                                               "not a JSON record"), err
    (tmp_path / METRICS_FILE).write_text('{"kind": "throughput", "step": 1}\n')
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "no train or eval records" in err[0]


# ------------------------------------------------------------------ items 10, 11: a real run

def test_run_startup_record_and_resume(tmp_path, corpus, capsys):
    run_dir = tmp_path / "run"
    argv = ["fit", "tiny_softmax", *TINY, f"data.source={corpus}", "train.checkpoint_every=2"]
    assert main([*argv, "train.steps=4", "--run-dir", str(run_dir)]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out[0] == f"new run in {run_dir}"
    assert out[1].startswith("config: preset tiny_softmax with ") and "data.seq_len=16" in out[1]
    err = captured.err
    for expected in ("devices: 1 x ", "mesh data=1 fsdp=1 tensor=1", "M parameters",
                     "tokens/step: 2 x 16 = 32", "memory estimate: ", f"run dir: {run_dir}",
                     "compiling the train step...", "compiled; first step done in"):
        assert expected in err, expected
    assert err.index("run dir:") < err.index("compiling") < err.index("step 1/4")

    from train.checkpoint.manager import Checkpointer
    from train.checkpoint.run_files import code_revision
    with Checkpointer(run_dir / "checkpoints", read_only=True) as checkpointer:
        record = checkpointer._manager.restore(4, args=__import__(
            "orbax.checkpoint").checkpoint.args.Composite(
                record=__import__("orbax.checkpoint").checkpoint.args.JsonRestore()))["record"]
    assert record["command_line"] == __import__("sys").argv
    assert record["code"] == code_revision() and len(record["code"]["commit"]) == 40
    assert record["config"] == load_config(
        "tiny_softmax", [*TINY, f"data.source={corpus}", "train.checkpoint_every=2",
                         "train.steps=4"]).to_dict()

    # a crash after step 4 was logged but before checkpoint 4 committed: the resumed run
    # replays steps 3 and 4 and metrics.jsonl holds each step once
    import shutil
    shutil.rmtree(run_dir / "checkpoints" / "4")
    assert main([*argv, "train.steps=5", "optim.lr=2e-3", "--run-dir", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "warning: the config differs from the checkpoint's in optim.lr: 0.003 -> 0.002; " \
           "train.steps: 4 -> 5" in err
    raw = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    train_steps = [r["step"] for r in raw if r["kind"] == "train"]
    assert train_steps == [1, 2, 3, 4, 5]
    (events,) = tensorboard_scalars(run_dir / "tensorboard")
    assert sorted(s for tag, s in events if tag == "train/loss") == [1, 2, 3, 4, 5]


def test_compile_time_stays_out_of_the_eta_and_tokens_per_second():
    """The first step (compiling, here a 0.5 s sleep) is timed apart: the ETA after it
    extrapolates the steps' own time, not the compile time (which would give >= 499 s)."""
    import io
    import re
    import time

    from train.core.fit import _first_step, _StepLog
    from train.core.metrics import ProgressBar

    class Writer:
        def write(self, kind, step, values):
            pass

    class CompilingSession:
        def train_step(self, state, batch):
            time.sleep(0.5)
            return state, {"loss": jnp.float32(1.0)}

    stream = io.StringIO()
    bar = ProgressBar(1000, stream=stream)
    log = _StepLog(Writer(), bar, 1000, 32, start_step=0)
    _, metrics = _first_step(CompilingSession(), {}, {}, bar, log)
    log.add(metrics)
    log.flush(1)
    (line,) = [l for l in stream.getvalue().splitlines() if l.startswith("step 1/1000")]
    hours, minutes, seconds = map(int, re.search(r"ETA (\d+):(\d+):(\d+)$", line).groups())
    assert 3600 * hours + 60 * minutes + seconds < 60, line
    assert np.isnan(log.tokens_per_second())                 # the first window is not timed


def test_config_command_prints_the_resolved_config(capsys):
    import yaml

    assert main(["config", "tiny_softmax", "optim.lr=2e-3", "train.grad_accum=2"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed == load_config("tiny_softmax", ["optim.lr=2e-3",
                                                   "train.grad_accum=2"]).to_dict()
    assert out.splitlines()[-1] == ("# config: preset tiny_softmax with optim.lr=0.002, "
                                    "train.grad_accum=2")
    assert main(["config", "tiny_softmax", "train.grad_accum=3"]) == 2   # 8 rows, 3 parts
    assert "train.grad_accum" in capsys.readouterr().err


# ------------------------------------------------------------------ item 11: accumulation

def test_gradient_accumulation_matches_the_whole_batch():
    """Same loss, gradient norm and updated parameters with 4 micro-batches as with one batch
    of all rows, with documents (and so target counts) of different lengths per row. The
    model is a small bigram table (the accumulation does not depend on the model)."""
    import flax.linen as nn

    from train.core.optimizer import build_optimizer, learning_rate_schedule
    from train.core.step import make_train_step

    traced_rows = []                                            # rows per model call

    class Bigram(nn.Module):
        @nn.compact
        def __call__(self, inputs, segment_ids):
            traced_rows.append(inputs.shape[0])
            hidden = nn.Embed(64, 8)(inputs) * segment_ids[..., None]
            return nn.Dense(64)(jnp.tanh(hidden))

    config = load_config(None, TINY)
    model = Bigram()
    rng = np.random.default_rng(case_seed(1201))
    tokens = jnp.asarray(rng.integers(0, 64, (8, 9)), jnp.int32)
    segments = np.ones((8, 9), np.int32)
    for row in range(8):                                        # 0-3 document starts per row
        for start in sorted(rng.choice(np.arange(2, 8), int(rng.integers(0, 4)), False)):
            segments[row, start:] += 1
    batch = {"tokens": tokens, "segment_ids": jnp.asarray(segments)}
    params = model.init(jax.random.PRNGKey(case_seed(1202)), tokens[:1, :-1],
                        batch["segment_ids"][:1, :-1])["params"]
    optimizer = build_optimizer(config.optim, 10)
    schedule = learning_rate_schedule(config.optim, 10)
    state = {"step": jnp.zeros((), jnp.int32), "params": params,
             "opt_state": optimizer.init(params)}
    whole = jax.jit(make_train_step(model, optimizer, schedule))(state, batch)
    traced_rows.clear()
    accumulated = jax.jit(make_train_step(model, optimizer, schedule, 4))(state, batch)
    assert traced_rows and set(traced_rows) == {2}             # the model saw micro-batches
    for name in ("loss", "grad_norm", "target_tokens"):
        np.testing.assert_allclose(accumulated[1][name], whole[1][name], rtol=2e-6, err_msg=name)
    for got, want in zip(jax.tree.leaves(accumulated[0]["params"]),
                         jax.tree.leaves(whole[0]["params"])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="grad_accum"):
        make_train_step(model, optimizer, schedule, 0)


def test_grad_accum_option_reaches_the_train_step(monkeypatch):
    import train.core.session

    original, passed = train.core.session.make_train_step, []

    def recording(*args):
        passed.append(args[3:])
        return original(*args)

    monkeypatch.setattr(train.core.session, "make_train_step", recording)
    build_session(load_config(None, [*TINY, "train.grad_accum=2"]), 257)
    assert passed == [(2,)]
