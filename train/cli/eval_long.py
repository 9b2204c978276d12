"""`python -m train eval RUN --suite long [--lengths 256,512 --depths 0,0.5,1 --samples N
--tasks passkey,... --out DIR]`: the long-context suite of train/experiments/long_eval.py.

Prints a progress line per (task, length) on stderr, then one table per task (rows: depths,
columns: lengths) and the per-position loss, and writes long_eval.json and the PNGs into --out.
One directory per setting, so results of different settings never mix: the default --out is
RUN_DIR/long-eval-step<N>-<setting>, the setting being the tasks (`all`: every task), `len` and
the lengths, then depths, samples, seed and batches where they differ from their defaults:

    eval RUN --suite long                       RUN/long-eval-step600-all-len256,512,1024,2048
    eval RUN --suite long --tasks passkey \
        --lengths 256,512 --samples 5           RUN/long-eval-step600-passkey-len256,512-samples5

An --out that already holds long-eval files (of whatever setting) has them removed first, which
a `note:` line says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from train.cli import UserError
from train.cli.common import positive_int
from train.core.metrics import progress_line
from train.experiments.long_eval_tasks import DEFAULT_DEPTHS, TASKS

DEFAULT_SAMPLES = 20


def _number_list(convert, allowed, what):
    """An argparse type: comma-separated `convert`ed numbers, each `allowed`, else an error
    saying "expected comma-separated `what`"."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(convert(v) for v in text.split(",") if v.strip())
        except ValueError:
            values = ()
        if not values or not all(allowed(v) for v in values):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        return values

    return parse


_int_list = _number_list(int, lambda v: v >= 2, "integers >= 2")
_depth_list = _number_list(float, lambda v: 0.0 <= v <= 1.0, "depths in [0, 1]")


def _task_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in values if v not in TASKS]
    if unknown or not values:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(TASKS)}, got {text!r}")
    return values


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_long_arguments(sub: argparse.ArgumentParser) -> None:
    """The `eval` options of the long-context suite."""
    group = sub.add_argument_group("--suite long (train/experiments/long_eval.py)")
    group.add_argument("--suite", choices=("default", "long"), default="default",
                       help="default: held-out and per-position loss; long: passkey and "
                            "needle retrieval over lengths x depths, per-position loss to 4x")
    group.add_argument("--lengths", type=_int_list,
                       help="context lengths in tokens (default: 1,2,4,8 x the training length)")
    group.add_argument("--depths", type=_depth_list, default=DEFAULT_DEPTHS,
                       help="needle depths in [0, 1] (default: 0,0.25,0.5,0.75,1)")
    group.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES,
                       help="samples per cell (default: %(default)s)")
    group.add_argument("--tasks", type=_task_list, help="subset of the retrieval tasks")
    group.add_argument("--seed", type=_seed, default=0,
                       help="seed of the samples, >= 0 (default: %(default)s)")


def setting_name(tasks, lengths, depths, samples: int, seed: int, batches: int | None) -> str:
    """The setting part of the default output directory (module docstring), e.g.
    `passkey-len256,512` or `all-len256,512-depths0,1-samples5`."""
    chosen = [t for t in TASKS if t in tasks]
    parts = ["all" if len(chosen) == len(TASKS) else ",".join(chosen),
             "len" + ",".join(str(n) for n in lengths)]
    if tuple(float(d) for d in depths) != tuple(DEFAULT_DEPTHS):
        parts.append("depths" + ",".join(f"{d:g}" for d in depths))
    if samples != DEFAULT_SAMPLES:
        parts.append(f"samples{samples}")
    if seed:
        parts.append(f"seed{seed}")
    if batches:
        parts.append(f"batches{batches}")
    return "-".join(parts)


def run_long_suite(args) -> int:
    """`eval --suite long`: evaluate, write the outputs, print the tables."""
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.experiments.long_eval import (earlier_outputs, evaluate_long, format_table,
                                             task_names, write_outputs)

    if args.seq_len is not None:
        raise UserError("--seq-len: not used by --suite long (pass --lengths)")
    if args.batch_size is not None:
        raise UserError("--batch-size: not used by --suite long")
    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir}: run directory does not exist")
    result = evaluate_long(args.run_dir, step=args.step, lengths=args.lengths,
                           depths=args.depths, tasks=args.tasks or TASKS,
                           num_samples=args.samples, seed=args.seed,
                           position_batches=args.batches, progress=progress_line)
    tasks = task_names(result)
    setting = setting_name(tasks, result[tasks[0]]["lengths"], args.depths, args.samples,
                           args.seed, args.batches)
    out = (Path(args.out) if args.out
           else Path(args.run_dir) / f"long-eval-step{result['step']}-{setting}")
    earlier = earlier_outputs(out)
    if earlier:
        print(f"note: {out} held {len(earlier)} long-eval file(s) of an earlier run; replaced "
              f"by this run's ({setting})", file=sys.stderr, flush=True)
    write_outputs(result, out)
    print(format_table(result))
    print(f"written: {out}/long_eval.json and PNGs")
    return 0
