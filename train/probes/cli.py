"""`python -m train probe TASK [key=value ...]`: run a probe and write its table, JSON, CSV, PNG.

Keys: methods=fpa,fox,...  reference=fpa  out=DIR (default runs/probe-TASK-<time>), any
ProbeConfig field (seeds, steps, eval_every, batch_size, lr, head_dim, num_layers, ...) and any
size keyword of the task's generator (e.g. rungs=10 for ladder). Values are parsed by the type
of the default. A task may set its own ProbeConfig defaults (two_walks: num_heads=2,
head_dim=2); keys on the command line override them. The reference (default: fpa when it is
among the methods, else the first method) must be one of the methods: a reference that is not
run is refused, since no p-value could be computed. A mistake prints one `error:` line and
exits 2 (EXIT_USAGE, train/core/errors.py). `python -m train probe list` prints the tasks,
their sizes and the methods;
`probe plot PATH ... [out=PNG] [columns=N]` draws every seed's final accuracy of the probe.json
files given (a folder: its */probe.json) into one PNG (report.plot_per_seed);
`probe --help` the keys and their defaults, `probe TASK --help` one task's (both generated from
ProbeConfig, TASKS and the generators' signatures). While it trains, a line on stderr before and
after each method (its seeds train at once, in one vmapped program).
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
import time
from pathlib import Path

from train.core.errors import EXIT_USAGE, print_error
from train.core.metrics import progress_line
from train.probes.model import METHODS
from train.probes.report import (find_results, format_table, load_result, plot_per_seed,
                                 write_outputs)
from train.probes.runner import ProbeConfig, run_probe
from train.probes.tasks import TASKS, task_sizes

DEFAULT_METHODS = "fpa,fox"
DEFAULT_REFERENCE = "fpa"
HELP_FLAGS = ("-h", "--help")
USAGE = ("usage: python -m train probe TASK [key=value ...]  |  probe list  |  probe [TASK] --help"
         "  |  probe plot PATH ... [out=PNG] [columns=N]")
PLOT_DEFAULT = "per_seed.png"


def _wrapped(items: list[str], indent: str = "  ") -> str:
    return textwrap.fill("  ".join(items), width=96, initial_indent=indent,
                         subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def _size_items(task: str) -> list[str]:

    return [f"{key}={'(derived)' if value is None else value}"
            for key, value in task_sizes(task).items()]


def _config_items(overrides: dict) -> list[str]:
    """ProbeConfig's fields with their defaults; a task's own default is marked `*`."""

    return [f"{field.name}={overrides[field.name]}*" if field.name in overrides
            else f"{field.name}={field.default}" for field in dataclasses.fields(ProbeConfig)]


def _common_keys(task: str = "TASK") -> str:
    column = 20
    return "\n".join([
        f"  {'methods=' + DEFAULT_METHODS:<{column}}comma-separated methods to train "
        f"(`probe --help` lists them)",
        f"  {'reference=' + DEFAULT_REFERENCE:<{column}}compared with each other method by a "
        f"one-sided Fisher p-value; one of",
        f"  {'':<{column}}the methods (default: {DEFAULT_REFERENCE} if it runs, else the "
        f"first method)",
        f"  {'out=DIR':<{column}}probe.json, probe.csv, probe.png (default: "
        f"runs/probe-{task}-<time>)"])


def general_help() -> str:
    """`probe --help`: the keys with their defaults, the tasks, the methods."""

    tasks = []
    for name, task in TASKS.items():
        own = "  " + " ".join(f"{k}={v}" for k, v in task.config.items()) if task.config else ""
        tasks.append(f"  {name:<20} threshold {task.threshold}  {' '.join(_size_items(name))}"
                     f"{own}")
    return "\n".join([
        USAGE, "",
        "Synthetic-task probes: trains every method on TASK over many seeds at once (vmap), "
        "counts\nthe seeds whose final held-out accuracy exceeds the task's threshold, and "
        "compares the\nreference method with each other method (one-sided Fisher exact test).",
        "", "keys (default):", _common_keys(),
        "training (ProbeConfig fields; a task may set its own defaults, listed with it):",
        _wrapped(_config_items({})),
        "task sizes: the keywords of the task's generator (below; `probe TASK --help` explains "
        "them)", "",
        "tasks (success threshold, sizes, own training defaults):", *tasks, "",
        "methods:", _wrapped(list(METHODS)), "",
        "e.g. python -m train probe two_walks methods=fpa,selective,dcp seeds=15 rungs=6"])


def task_help(task: str) -> str:
    """`probe TASK --help`: the task's description, sizes and training keys with defaults."""

    task_sizes(task)                    # an unknown task: ValueError naming the tasks
    spec = TASKS[task]
    return "\n".join([
        f"usage: python -m train probe {task} [key=value ...]", "",
        inspect.getdoc(spec.generate) or "", "",
        f"success: final held-out accuracy > threshold {spec.threshold}", "",
        "sizes (the generator's keywords; (derived): computed from the others):",
        _wrapped(_size_items(task)),
        "training (ProbeConfig fields; *: this task's own default):",
        _wrapped(_config_items(spec.config)),
        "other keys (default):", _common_keys(task), "",
        "methods: `python -m train probe --help`"])


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

    if not argv:
        raise ValueError("usage: python -m train probe TASK [key=value ...] (TASK=list lists them)")
    task, pairs = argv[0], argv[1:]
    defaults = task_sizes(task)
    config_defaults = {f.name: f.default for f in dataclasses.fields(ProbeConfig)}
    methods, reference, out = DEFAULT_METHODS, None, None
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
    if reference is None:
        reference = (DEFAULT_REFERENCE if DEFAULT_REFERENCE in method_list or not method_list
                     else method_list[0])
    elif method_list and reference not in method_list:
        raise ValueError(f"reference={reference} is not among methods={','.join(method_list)}, "
                         f"so no p-value could be computed; add it to methods or name one of "
                         f"them as the reference")
    config = {**TASKS[task].config, **config}   # the task's defaults, then the command line
    out = out or Path("runs") / f"probe-{task}-{time.strftime('%Y%m%d-%H%M%S')}"
    return task, method_list, reference, out, ProbeConfig(**config), sizes


def plot_main(argv: list[str]) -> int:
    """`probe plot PATH ... [out=PNG] [columns=N]`: the per-seed figure of the given results;
    out defaults to per_seed.png in the first folder given (or beside the first file)."""

    paths, out, columns = [], None, 4
    try:
        for arg in argv:
            key, sep, value = arg.partition("=")
            if sep and key == "out":
                out = Path(value)
            elif sep and key == "columns":
                columns = _parse_value("columns", value, 4)
                if columns < 1:
                    raise ValueError(f"columns must be >= 1, got {columns}")
            elif sep:
                raise ValueError(f"unknown key {key!r}: probe plot takes paths, out= and columns=")
            else:
                paths.append(arg)
        if not paths:
            raise ValueError("probe plot needs at least one probe.json or folder of them")
        files = find_results(paths)
        results = []
        for file in files:
            result = load_result(file)
            results.append((f"{file.parent.name}: {result['task']}", result))
        first = Path(paths[0])
        out = out or (first if first.is_dir() else first.parent) / PLOT_DEFAULT
        written = plot_per_seed(results, out, columns=columns)
    except ValueError as error:
        return print_error(f"probe plot: {error}", EXIT_USAGE)
    print(f"{len(results)} results; written: {written}")
    return 0


def main(argv: list[str]) -> int:

    if argv[:1] == ["plot"]:
        if any(flag in argv[1:] for flag in HELP_FLAGS):
            print(USAGE)
            print(plot_main.__doc__)
            return 0
        return plot_main(argv[1:])
    if argv[:1] and (argv[0] in HELP_FLAGS or argv[0] == "list" and argv[1:2]):
        print(general_help())
        return 0
    if any(flag in argv[1:] for flag in HELP_FLAGS):
        try:
            print(task_help(argv[0]))
        except ValueError as error:
            return print_error(f"probe: {error}", EXIT_USAGE)
        return 0
    if argv[:1] == ["list"]:
        for name, task in TASKS.items():
            defaults = f"  config {task.config}" if task.config else ""
            print(f"{name:<20} threshold {task.threshold}  sizes {task_sizes(name)}{defaults}")
        print("methods:", ", ".join(METHODS))
        return 0
    try:
        task, methods, reference, out, config, sizes = parse_arguments(argv)
        start = time.perf_counter()
        result = run_probe(task, methods, config, sizes, reference=reference,
                           progress=progress_line,
                           after_method=lambda partial: write_outputs(partial, out))
    except (ValueError, TypeError) as error:
        return print_error(f"probe: {error}", EXIT_USAGE)
    paths = write_outputs(result, out)
    print(format_table(result))
    if not result["fisher"]:
        print(f"no p-values: only the reference method {reference} ran; add methods=... to "
              f"compare it with others")
    print(f"wall {time.perf_counter() - start:.1f} s; written: " + ", ".join(map(str, paths.values())))
    return 0
