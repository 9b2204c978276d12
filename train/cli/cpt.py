"""`python -m train cpt CONFIG [key=value ...] [--run-dir DIR] [--new]`: SpectralShift continued
pretraining from cpt.reference (train/experiments/cpt.py)."""

from __future__ import annotations

from train.cli.common import (add_command_with_config, add_run_dir_options, fit_exit_code,
                              fit_summary, run_dir, start_jax)
from train.core.presets import load_config


def add_cpt_command(commands) -> None:
    sub = add_command_with_config(
        commands, "cpt", "SpectralShift continued pretraining from cpt.reference", command_cpt)
    add_run_dir_options(sub)


def command_cpt(args) -> int:
    config = load_config(args.config, args.overrides)
    start_jax()
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.experiments.cpt import checked_reference, continued_pretraining

    chosen = run_dir(args, args.config, config,
                     check=lambda run_dir: checked_reference(config, run_dir))
    result = continued_pretraining(config, chosen)
    print(fit_summary(result, config))
    return fit_exit_code(result)
