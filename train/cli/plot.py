"""`python -m train plot RUN_DIR [--out DIR]`: PNG loss curves and per-position loss."""

from __future__ import annotations

from train.tools.plot import plot_run


def add_plot_command(commands) -> None:
    sub = commands.add_parser("plot", help="PNG loss curves and per-position loss of a run",
                              description="PNG loss curves and per-position loss of a run")
    sub.add_argument("run_dir")
    sub.add_argument("--out", help="output directory (default: the run directory)")
    sub.set_defaults(handler=command_plot)


def command_plot(args) -> int:
    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0
