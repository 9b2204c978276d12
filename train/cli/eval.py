"""`python -m train eval RUN_DIR [--seq-len L] [--batches N] [--step S] [--out FILE]`: held-out
loss (and per-position loss) of a run's checkpoint; `--suite long` runs the long-context
suite instead (train/cli/eval_long.py)."""

from __future__ import annotations

import json
from pathlib import Path

from train.cli import UserError
from train.cli.common import format_loss, positive_int, start_jax
from train.cli.eval_long import add_long_arguments, run_long_suite
from train.core.metrics import format_table


def add_eval_command(commands) -> None:
    sub = commands.add_parser("eval", help="held-out loss of a run's newest checkpoint",
                              description="held-out loss of a run's newest checkpoint")
    sub.add_argument("run_dir")
    sub.add_argument("--seq-len", type=positive_int, help="evaluate at this context length")
    sub.add_argument("--batch-size", type=positive_int,
                     help="sequences per eval batch (default: the run's data.batch_size)")
    sub.add_argument("--batches", type=positive_int,
                     help="eval batches (default: train.eval_batches)")
    sub.add_argument("--step", type=int, help="checkpoint step (default: the newest readable; "
                                              "an unreadable requested step is an error)")
    sub.add_argument("--out", help="JSON output (default: RUN_DIR/eval-step<N>-len<L>.json); "
                                   "--suite long: a directory (default: one per setting, "
                                   "RUN_DIR/long-eval-step<N>-<tasks>-len<lengths>[-depths..]"
                                   "[-samples..][-seed..][-batches..]); long-eval files "
                                   "already there are replaced, with a note")
    add_long_arguments(sub)
    sub.set_defaults(handler=command_eval)


def command_eval(args) -> int:
    start_jax()
    if args.suite == "long":
        return run_long_suite(args)
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.core.evaluate import evaluate_run

    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir}: run directory does not exist")
    result = evaluate_run(args.run_dir, seq_len=args.seq_len, num_batches=args.batches,
                          step=args.step, batch_size=args.batch_size)
    print(f"evaluated step {result['step']} of {args.run_dir}", flush=True)
    out = Path(args.out) if args.out else Path(args.run_dir) / (
        f"eval-step{result['step']}-len{result['seq_len']}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    rows = [("step", str(result["step"])), ("seq_len", str(result["seq_len"])),
            ("eval loss", f"{result['loss']:.4f}"), ("tokens", str(result["tokens"]))]
    rows += [(f"  positions {start}+", format_loss(loss))
             for start, loss in zip(result["position_bucket_start"], result["position_loss"])]
    rows.append(("written", str(out)))
    print(format_table(rows))
    return 0
