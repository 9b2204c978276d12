"""`python -m train fit CONFIG [key=value ...] [--run-dir DIR] [--new]`: train a model, resuming
from the run directory's newest checkpoint."""

from __future__ import annotations

from train.cli.common import (add_command_with_config, add_run_dir_options, fit_exit_code,
                              fit_summary, run_dir, start_jax)
from train.core.presets import load_config


def add_fit_command(commands) -> None:
    sub = add_command_with_config(
        commands, "fit", "train a model (resumes from the run directory's newest checkpoint)",
        command_fit)
    add_run_dir_options(sub)


def command_fit(args) -> int:
    config = load_config(args.config, args.overrides)
    start_jax()
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.core.fit import fit

    result = fit(config, run_dir(args, args.config, config))
    print(fit_summary(result, config))
    return fit_exit_code(result)
