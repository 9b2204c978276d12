"""Run logging: a one-line progress bar on stderr, JSONL records and TensorBoard scalars.

    <run_dir>/metrics.jsonl   one JSON object per line: {"kind": "train"|"eval"|..., "step": n, ...}
    <run_dir>/tensorboard/    tensorboardX event files, scalars tagged "<kind>/<name>"
    stderr                    "step 120/400 [=====>    ] loss 2.3512 | 41.2k tok/s | ETA 0:01:05"

Only process 0 writes (multi-host runs log once).

Crashes and resumes: a resumed run replays the steps after its checkpoint, so the writer
opened with `resume_step=S` first rewrites metrics.jsonl keeping only the complete records
with step <= S (a torn final line, from a crash mid-write, is dropped too; the trainer
flushes every record up to S before it saves checkpoint S), then rebuilds the TensorBoard
events from those records into one fresh event file: one event stream per run, without
duplicated steps. `read_metrics` skips a torn final line (with a warning) and keeps the
latest record per (kind, step).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import jax

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
log = logging.getLogger(__name__)


class MetricsFileError(ValueError):
    """metrics.jsonl is damaged before its final line (a crash tears only the final line,
    which readers skip and a resume repairs), or holds nothing to plot."""


def _is_writer() -> bool:
    return jax.process_index() == 0


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_rate(tokens_per_second: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if tokens_per_second >= size:
            return f"{tokens_per_second / size:.1f}{unit}"
    return f"{tokens_per_second:.0f}"


def progress_line(text: str) -> None:
    """One progress line on stderr, from process 0 only: what a command other than `fit`
    (eval --suite long, probe, generate) reports while it works, as fit's messages are."""
    if _is_writer():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


class ProgressBar:
    """Redraws one status line (carriage return) when stderr is a terminal, else prints lines."""

    def __init__(self, total_steps: int, stream: TextIO | None = None, width: int = 24):
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self.width = width
        self.interactive = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = _is_writer()

    def update(self, step: int, loss: float, tokens_per_second: float, eta_seconds: float) -> None:
        if not self.enabled:
            return
        filled = int(self.width * step / max(self.total_steps, 1))
        bar = "=" * max(filled - 1, 0) + (">" if filled else "") + " " * (self.width - filled)
        line = (f"step {step}/{self.total_steps} [{bar}] loss {loss:.4f} | "
                f"{format_rate(tokens_per_second)} tok/s | ETA {format_duration(eta_seconds)}")
        if self.interactive:
            self.stream.write("\r" + line + "\033[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r\033[K" if self.interactive else "") + text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.interactive:
            self.stream.write("\n")
            self.stream.flush()


class MetricsWriter:
    """Append records to metrics.jsonl and scalars to TensorBoard.

    resume_step: None for a fresh run; S for a run resumed from checkpoint S (a fresh run
    over a directory that holds records passes 0): records after S are dropped and the
    TensorBoard events rebuilt from the rest (module doc)."""

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = True,
                 resume_step: int | None = None):
        self.enabled = _is_writer()
        self.path = Path(run_dir) / METRICS_FILE
        self._file = None
        self._tensorboard = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = truncate_metrics(run_dir, resume_step) if resume_step is not None else []
        self._file = open(self.path, "a")
        events = Path(run_dir) / TENSORBOARD_DIR
        stale = resume_step is not None and events.exists()   # may hold steps after S
        if stale:
            shutil.rmtree(events)
        if tensorboard or stale:    # rebuilt from the kept records even if no longer written
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(events))
            for record in kept:
                self._add_scalars(record["kind"], record["step"], record)
            if not tensorboard:
                self._tensorboard.close()
                self._tensorboard = None

    def _add_scalars(self, kind: str, step: int, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if name not in ("kind", "step", "time") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                self._tensorboard.add_scalar(f"{kind}/{name}", value, int(step))

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": int(step), "time": time.time(), **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            self._add_scalars(kind, step, values)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def _parse_lines(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The records of a metrics file and whether its final line was torn (left out)."""
    with open(path) as f:
        lines = [(number, line) for number, line in enumerate(f.read().split("\n"), 1)
                 if line.strip()]
    records, torn = [], False
    for index, (number, line) in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if index < len(lines) - 1:
                raise MetricsFileError(
                    f"{path}: line {number} is not a JSON record (only a torn final line is "
                    f"skipped); repair or delete that line") from None
            torn = True
    return records, torn


def truncate_metrics(run_dir: str | os.PathLike, keep_through_step: int) -> list[dict[str, Any]]:
    """Rewrite metrics.jsonl with its complete records of step <= keep_through_step (atomic
    replace); returns them."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records, torn = _parse_lines(path)
    kept = [r for r in records if r["step"] <= keep_through_step]
    if torn or len(kept) < len(records) or not path.read_bytes().endswith(b"\n"):
        dropped = [f"{len(records) - len(kept)} record(s) after step {keep_through_step}"
                   ] if len(kept) < len(records) else []
        dropped += ["a torn final line"] if torn else []
        if dropped:
            log.warning("%s: dropped %s (replayed from the checkpoint)", path,
                        " and ".join(dropped))
        scratch = path.with_name(path.name + ".tmp")
        scratch.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(scratch, path)
    return kept


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a run, the latest record per (kind, step); a torn final line (a crash
    mid-write) is skipped with a warning."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {run_dir} a run directory?)")
    records, torn = _parse_lines(path)
    if torn:
        log.warning("%s: skipped a torn final line", path)
    latest = {(record["kind"], record["step"]): record for record in records}
    return sorted(latest.values(), key=lambda r: (r["kind"], r["step"]))


def format_table(rows: list[tuple[str, str]]) -> str:
    """Two-column text table."""
    width = max(len(key) for key, _ in rows)
    rule = "-" * (width + 3 + max(len(value) for _, value in rows))
    return "\n".join([rule] + [f"{key:<{width}} | {value}" for key, value in rows] + [rule])
