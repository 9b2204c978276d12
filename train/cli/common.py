"""What several commands share: argparse number types, the run directory of fit / cpt / main
(and its two report lines), jax's start-up and the summary table of a finished fit."""

from __future__ import annotations

import argparse
from pathlib import Path

from train.cli import EXIT_PREEMPTED, UserError
from train.core.config import Config, changed_from_preset
from train.core.metrics import format_duration, format_rate, format_table
from train.core.presets import load_config
from train.core.sharding import maybe_initialize_distributed


def int_at_least(minimum: int):
    """argparse type: an integer >= minimum, else a one-line refusal naming both."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def add_command_with_config(commands, name: str, help_text: str,
                            handler) -> argparse.ArgumentParser:
    """A subcommand taking CONFIG [key=value ...]."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.add_argument("config", help="preset name (configs/NAME.yaml) or YAML path")
    sub.add_argument("overrides", nargs="*", metavar="key=value",
                     help="dotted overrides, e.g. optim.lr=1e-3")
    sub.set_defaults(handler=handler)
    return sub


def add_run_dir_options(sub: argparse.ArgumentParser) -> None:
    """--run-dir and --new of the commands that train (fit, cpt)."""
    sub.add_argument("--run-dir", help="run directory (default: train.run_dir or "
                                       "runs/<config>[-<hash of the overrides>])")
    sub.add_argument("--new", action="store_true",
                     help="start another run instead of resuming the default directory's")


def run_dir(args, config_source: str | None, config: Config, check=None) -> Path:
    """--run-dir, train.run_dir, or the default derived from the config; prints which run
    (after refusing a run directory another process holds, and after `check(run_dir)`, which
    raises on inputs that make the run impossible, e.g. cpt's reference)."""
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.core.runs import checkpoint_steps, default_run_dir, require_unlocked

    if args.run_dir or config.train.run_dir:
        run_dir = Path(args.run_dir or config.train.run_dir)
        if args.new and checkpoint_steps(run_dir):
            raise UserError(f"--new: {run_dir} already holds a run; leave out --run-dir "
                            f"(and train.run_dir) or name a fresh directory")
    else:
        run_dir = default_run_dir(config_source, config, new=args.new)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} is a file, expected a directory")
    require_unlocked(run_dir)
    if check is not None:
        check(run_dir)
    steps = checkpoint_steps(run_dir)
    print(f"resuming {run_dir} from step {steps[-1]}" if steps else f"new run in {run_dir}",
          flush=True)
    print(differences_line(config_source, config), flush=True)
    return run_dir


def differences_line(config_source: str | None, config: Config) -> str:
    differences = changed_from_preset(load_config(config_source, []), config)
    where = f"preset {config_source}" if config_source else "the defaults"
    if not differences:
        return f"config: {where}, unchanged"
    return f"config: {where} with " + ", ".join(f"{k}={v!r}" for k, v in differences.items())


def fit_exit_code(result) -> int:
    return EXIT_PREEMPTED if result.preempted else 0


def format_loss(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def fit_summary(result, config: Config, extra: list[tuple[str, str]] = ()) -> str:
    rows = [
        ("config", config.name),
        ("parameters", f"{result.params / 1e6:.3f}M"),
        ("steps", f"{result.steps} (started at {result.start_step})"
                  + (" -- stopped early by a signal" if result.preempted else "")
                  + (f", {result.skipped_steps} non-finite skipped" if result.skipped_steps
                     else "")),
        ("final train loss", format_loss(result.train_loss)),
        ("eval loss", "n/a" if result.eval_loss is None
         else f"{result.eval_loss:.4f} (step {result.eval_step})"),
        ("tokens/s", "n/a" if result.tokens_per_second != result.tokens_per_second
         else format_rate(result.tokens_per_second)),
        ("checkpoint", f"{result.checkpoint_dir}/{result.latest_checkpoint}"),
        ("run dir", str(result.run_dir)),
        ("wall time", format_duration(result.wall_seconds)),
        *extra,
    ]
    return format_table(rows)


def start_jax() -> None:
    maybe_initialize_distributed()
