"""`python -m train main [key=value ...] [--run-dir DIR] [--new]`: the tiny FPA preset end to
end (what ./dev.sh main runs): train, plot, and a summary table. (Not `main.py`: `from
train.cli import main` would then import this module instead of failing; the function `main`
is train.cli.entry.main.)"""

from __future__ import annotations

from train.cli.common import fit_exit_code, fit_summary, run_dir, start_jax
from train.core.presets import load_config
from train.tools.plot import plot_run

MAIN_PRESET = "tiny_fpa"


def add_main_command(commands) -> None:
    sub = commands.add_parser("main", help=f"train the {MAIN_PRESET} preset on CPU and print a "
                                           "summary (what ./dev.sh main runs)",
                              description=f"train the {MAIN_PRESET} preset and print a summary")
    sub.add_argument("overrides", nargs="*", metavar="key=value")
    sub.add_argument("--run-dir")
    sub.add_argument("--new", action="store_true", help="start another run instead of resuming")
    sub.set_defaults(handler=command_main)


def command_main(args) -> int:
    config = load_config(MAIN_PRESET, args.overrides)
    start_jax()
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.core.fit import fit

    chosen = run_dir(args, MAIN_PRESET, config)
    result = fit(config, chosen)
    plots = plot_run(chosen)
    print(fit_summary(result, config, [("plots", ", ".join(str(p) for p in plots))]))
    return fit_exit_code(result)
