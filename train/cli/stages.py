"""`python -m train stages CURRICULUM [key=value ...] [--out DIR] [--reference RUN] [--stage
NAME]`: staged SpectralShift extension, a chain of cpt runs (train/experiments/stages.py)."""

from __future__ import annotations

from pathlib import Path

from train.cli import EXIT_PREEMPTED
from train.cli.common import fit_summary, start_jax


def add_stages_command(commands) -> None:
    """Register `python -m train stages CURRICULUM [key=value ...]` on the CLI's subparsers."""
    text = "staged SpectralShift extension: a chain of cpt runs (configs/stages/*.yaml)"
    sub = commands.add_parser("stages", help=text, description=text)
    sub.add_argument("curriculum", help="configs/stages/NAME.yaml preset name, or a YAML path")
    sub.add_argument("overrides", nargs="*", metavar="key=value",
                     help="overrides for every stage, e.g. train.steps=50")
    sub.add_argument("--out", help="directory of the stage runs (default: runs/<curriculum>)")
    sub.add_argument("--reference", help="the run stage 1 extends (default: the file's)")
    sub.add_argument("--stage", help="run this stage only (its reference must be finished)")
    sub.set_defaults(handler=command_stages)


def command_stages(args) -> int:
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.experiments.stages import (PlannedStage, default_out_dir, load_curriculum, plan,
                                          run_curriculum)

    curriculum = load_curriculum(args.curriculum)
    out_dir = Path(args.out) if args.out else default_out_dir(curriculum)
    plan(curriculum, out_dir, tuple(args.overrides), args.reference)   # config errors first
    start_jax()

    def summarize(stage: PlannedStage, result) -> None:
        print(f"stage {stage.stage.name}:\n{fit_summary(result, stage.config)}", flush=True)

    results = run_curriculum(curriculum, out_dir, overrides=tuple(args.overrides),
                             reference=args.reference, only=args.stage,
                             report=lambda line: print(line, flush=True), summarize=summarize)
    if results and results[-1][1] is not None and results[-1][1].preempted:
        return EXIT_PREEMPTED
    return 0
