"""`python -m train probe TASK [key=value ...]`: run a probe and write its table, JSON, CSV, PNG.

Keys: methods=fpa,fox,...  reference=fpa  out=DIR (default runs/probe-TASK-<time>), any
ProbeConfig field (seeds, steps, eval_every, batch_size, lr, head_dim, num_layers, ...) and any
size keyword of the task's generator (e.g. rungs=10 for ladder). Values are parsed by the type
of the default. A task may set its own ProbeConfig defaults (two_walks: num_heads=2,
head_dim=2); keys on the command line override them. A mistake prints one `error:` line and
exits 2. `python -m train probe list` prints the tasks, their sizes and the methods.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

DEFAULT_METHODS = "fpa,fox"


def _parse_value(key: str, text: str, default):
    try:
        if default is None:  # optional int sizes (None: the generator's own default)
            return int(text)
        if isinstance(default, bool):
            if text.lower() not in ("1", "0", "true", "false"):
                raise ValueError(text)
            return text.lower() in ("1", "true")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise ValueError(f"{key}: expected a {type(default).__name__}, got {text!r}") from None
    return text


def parse_arguments(argv: list[str]):
    """argv = [TASK, key=value, ...] -> (task, methods, reference, out, ProbeConfig, sizes)."""
    from train.probes.runner import ProbeConfig
    from train.probes.tasks import TASKS, task_sizes

    if not argv:
        raise ValueError("usage: python -m train probe TASK [key=value ...] (TASK=list lists them)")
    task, pairs = argv[0], argv[1:]
    defaults = task_sizes(task)
    config_defaults = {f.name: f.default for f in dataclasses.fields(ProbeConfig)}
    methods, reference, out = DEFAULT_METHODS, "fpa", None
    config, sizes = {}, {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {pair!r}")
        if key == "methods":
            methods = text
        elif key == "reference":
            reference = text
        elif key == "out":
            out = Path(text)
        elif key in config_defaults:
            config[key] = _parse_value(key, text, config_defaults[key])
        elif key in defaults:
            sizes[key] = _parse_value(key, text, defaults[key])
        else:
            raise ValueError(f"unknown key {key!r}: expected methods, reference, out, one of "
                             f"{sorted(config_defaults)} or a size of {task}: {sorted(defaults)}")
    method_list = [m for m in methods.split(",") if m]
    config = {**TASKS[task].config, **config}   # the task's defaults, then the command line
    out = out or Path("runs") / f"probe-{task}-{time.strftime('%Y%m%d-%H%M%S')}"
    return task, method_list, reference, out, ProbeConfig(**config), sizes


def main(argv: list[str]) -> int:
    from train.probes.model import METHODS
    from train.probes.report import format_table, write_outputs
    from train.probes.runner import run_probe
    from train.probes.tasks import TASKS, task_sizes

    if argv[:1] == ["list"]:
        for name, task in TASKS.items():
            defaults = f"  config {task.config}" if task.config else ""
            print(f"{name:<20} threshold {task.threshold}  sizes {task_sizes(name)}{defaults}")
        print("methods:", ", ".join(METHODS))
        return 0
    try:
        task, methods, reference, out, config, sizes = parse_arguments(argv)
        start = time.perf_counter()
        result = run_probe(task, methods, config, sizes, reference=reference)
    except (ValueError, TypeError) as error:
        print(f"error: probe: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    paths = write_outputs(result, out)
    print(format_table(result))
    print(f"wall {time.perf_counter() - start:.1f} s; written: " + ", ".join(map(str, paths.values())))
    return 0
