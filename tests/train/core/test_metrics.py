"""Metrics (train/core/metrics.py): a metrics file that survives crashes and resumes, one
TensorBoard stream, the progress bar's rates."""

import io
import json

import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.tensorboard_events import tensorboard_scalars
from train.cli.entry import main
from train.core.metrics import (METRICS_FILE, MetricsWriter, ProgressBar, format_duration,
                                format_rate, format_table, read_metrics, truncate_metrics)


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


def test_durations_rates_and_tables_by_hand():
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(59.5) == "0:01:00"
    assert format_duration(float("nan")) == "?" and format_duration(-1) == "?"
    assert format_rate(999) == "999" and format_rate(1500) == "1.5k"
    assert format_rate(2_340_000) == "2.3M"
    assert format_table([("a", "1"), ("long key", "22")]).splitlines() == [
        "-" * 13, "a        | 1", "long key | 22", "-" * 13]


def test_progress_bar_lines_when_stderr_is_not_a_terminal():
    stream = io.StringIO()
    bar = ProgressBar(8, stream=stream, width=8)
    bar.update(2, loss=2.5, tokens_per_second=1234.0, eta_seconds=61)
    bar.message("note")
    bar.close()
    assert stream.getvalue() == ("step 2/8 [=>      ] loss 2.5000 | 1.2k tok/s | ETA 0:01:01\n"
                                 "note\n")


def test_read_metrics_keeps_the_latest_record_per_kind_and_step(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.write("train", 2, {"loss": 3.0})
    writer.write("eval", 2, {"loss": 3.5})
    writer.write("train", 1, {"loss": 4.0})
    writer.write("train", 2, {"loss": 2.0})
    writer.close()
    records = read_metrics(tmp_path)
    assert [(r["kind"], r["step"], r["loss"]) for r in records] == [
        ("eval", 2, 3.5), ("train", 1, 4.0), ("train", 2, 2.0)]
    assert not (tmp_path / "tensorboard").exists()
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_metrics(tmp_path / "elsewhere")


def test_truncate_metrics_keeps_the_steps_up_to_the_checkpoint(tmp_path):
    (tmp_path / METRICS_FILE).write_text(
        "".join(json.dumps({"kind": "train", "step": s, "loss": float(s)}) + "\n"
                for s in (1, 2, 3, 4)) + '{"kind": "train", "st')
    kept = truncate_metrics(tmp_path, 2)
    assert [r["step"] for r in kept] == [1, 2]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert (tmp_path / METRICS_FILE).read_text().endswith("\n")
