"""Run logging: a one-line progress bar on stderr, JSONL records and TensorBoard scalars.

    <run_dir>/metrics.jsonl   one JSON object per line: {"kind": "train"|"eval"|..., "step": n, ...}
    <run_dir>/tensorboard/    tensorboardX event files, scalars tagged "<kind>/<name>"
    stderr                    "step 120/400 [=====>    ] loss 2.3512 | 41.2k tok/s | ETA 0:01:05"

Only process 0 writes (multi-host runs log once).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import jax

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


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
    """Append records to metrics.jsonl and scalars to TensorBoard."""

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = True):
        self.enabled = _is_writer()
        self.path = Path(run_dir) / METRICS_FILE
        self._file = None
        self._tensorboard = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(Path(run_dir) / TENSORBOARD_DIR))

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": int(step), "time": time.time(), **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(f"{kind}/{name}", value, int(step))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a run; a resumed run keeps only the latest record per (kind, step)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {run_dir} a run directory?)")
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                record = json.loads(line)
                latest[(record["kind"], record["step"])] = record
    return sorted(latest.values(), key=lambda r: (r["kind"], r["step"]))


def format_table(rows: list[tuple[str, str]]) -> str:
    """Two-column text table."""
    width = max(len(key) for key, _ in rows)
    rule = "-" * (width + 3 + max(len(value) for _, value in rows))
    return "\n".join([rule] + [f"{key:<{width}} | {value}" for key, value in rows] + [rule])
