"""`python -m train eval RUN --suite long [--lengths 256,512 --depths 0,0.5,1 --samples N
--tasks passkey,... --out DIR]`: the long-context suite of train/long_eval.py.

Prints one table per task (rows: depths, columns: lengths) and the per-position loss, and
writes long_eval.json and the PNGs into --out (default RUN_DIR/long-eval-step<N>).
"""

from __future__ import annotations

import argparse
from pathlib import Path


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
    from train.long_eval_tasks import TASKS

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
    from train.long_eval_tasks import DEFAULT_DEPTHS

    def positive(text):
        from train.cli import _positive_int
        return _positive_int(text)

    group = sub.add_argument_group("--suite long (train/long_eval.py)")
    group.add_argument("--suite", choices=("default", "long"), default="default",
                       help="default: held-out and per-position loss; long: passkey and "
                            "needle retrieval over lengths x depths, per-position loss to 4x")
    group.add_argument("--lengths", type=_int_list,
                       help="context lengths in tokens (default: 1,2,4,8 x the training length)")
    group.add_argument("--depths", type=_depth_list, default=DEFAULT_DEPTHS,
                       help="needle depths in [0, 1] (default: 0,0.25,0.5,0.75,1)")
    group.add_argument("--samples", type=positive, default=20,
                       help="samples per cell (default: %(default)s)")
    group.add_argument("--tasks", type=_task_list, help="subset of the retrieval tasks")
    group.add_argument("--seed", type=_seed, default=0,
                       help="seed of the samples, >= 0 (default: %(default)s)")


def run_long_suite(args) -> int:
    """`eval --suite long`: evaluate, write the outputs, print the tables."""
    from train.cli import UserError
    from train.long_eval import TASKS, evaluate_long, format_table, write_outputs

    if args.seq_len is not None:
        raise UserError("--seq-len: not used by --suite long (pass --lengths)")
    if args.batch_size is not None:
        raise UserError("--batch-size: not used by --suite long")
    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir}: run directory does not exist")
    result = evaluate_long(args.run_dir, step=args.step, lengths=args.lengths,
                           depths=args.depths, tasks=args.tasks or TASKS,
                           num_samples=args.samples, seed=args.seed,
                           position_batches=args.batches)
    out = Path(args.out) if args.out else Path(args.run_dir) / f"long-eval-step{result['step']}"
    write_outputs(result, out)
    print(format_table(result))
    print(f"written: {out}/long_eval.json and PNGs")
    return 0
