"""`python -m train`: the parser of every command (one module each in train/cli/) and `main`,
which turns the errors a user can act on into one `error:` line and an exit code
(train/cli/__init__.py)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback

from train.cli import (EXIT_DIVERGED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USAGE,
                       OneLineParser, UserError)
from train.cli.bench import add_bench_command
from train.cli.config import add_config_command
from train.cli.cpt import add_cpt_command
from train.cli.eval import add_eval_command
from train.cli.export import add_export_command
from train.cli.fit import add_fit_command
from train.cli.generate import add_generate_command
from train.cli.main_preset import add_main_command
from train.cli.plot import add_plot_command
from train.cli.prepare import add_prepare_command
from train.cli.probe import add_probe_command
from train.cli.spectra import add_spectra_command
from train.cli.stages import add_stages_command
from train.core.config import ConfigError

COMMANDS = (add_fit_command, add_cpt_command, add_eval_command, add_prepare_command,
            add_plot_command, add_bench_command, add_main_command, add_config_command,
            add_export_command, add_generate_command, add_stages_command, add_spectra_command,
            add_probe_command)      # in the order `--help` lists them


class Terminated(BaseException):
    """SIGTERM where the training loop's own handler (which checkpoints first) is not
    installed: unwinds like KeyboardInterrupt, so a run directory claimed before the first
    step is removed again, and `main` exits with EXIT_PREEMPTED."""


def _raise_terminated(signum, frame):
    raise Terminated


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM raises Terminated inside the block (main thread only; the previous handler
    comes back afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Options and key=value overrides in any order: an override after an option (`fit
    tiny_fpa --run-dir R optim.lr=1e-3`) joins the others."""
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    rest = [item for item in extra if item not in overrides]
    if overrides and not isinstance(getattr(args, "overrides", None), list):
        rest = extra
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m train",
        description="Train, evaluate and benchmark FPA / GatedDeltaNet language models.",
        epilog="Configs are YAML presets (configs/*.yaml, or a path) with dotted key=value "
               "overrides, e.g. `python -m train fit tiny_fpa model.num_layers=4 optim.lr=1e-3`.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(commands)
    return parser


_RESUMABLE_COMMANDS = ("fit", "cpt", "main", "stages")
_UNQUEUED_COMMANDS = ("generate",)     # SIGTERM: EXIT_INTERRUPTED, a requeue would redo it


def _reported(args, line: str, code: int) -> int:
    """Prints the one `error:` line (after the traceback with -v) and returns the exit code:
    -v never changes the code a scheduler sees."""
    if args.verbose:
        traceback.print_exc()
    print(line, file=sys.stderr)
    return code


def _output_closed() -> int:
    """`... | head` closed the output: one line on stderr, no traceback about it."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    with contextlib.suppress(OSError):
        print("error: the output was closed (broken pipe)", file=sys.stderr)
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(build_parser(), argv)
    except BrokenPipeError:         # a help text piped into `head`
        return _output_closed()
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)     # also when `python -m train` configured it first
    try:
        with _sigterm_unwinds():
            return args.handler(args)
    except Terminated:
        resumable = args.command in _RESUMABLE_COMMANDS
        if args.command in _UNQUEUED_COMMANDS:
            return _reported(args, "error: stopped by SIGTERM (nothing to resume)",
                             EXIT_INTERRUPTED)
        return _reported(args, "error: stopped by SIGTERM" + (
            " before anything new was checkpointed; re-run the same command to continue"
            if resumable else ""), EXIT_PREEMPTED)
    except BrokenPipeError:
        return _output_closed()
    except KeyboardInterrupt:
        resumable = args.command in _RESUMABLE_COMMANDS
        return _reported(args, "error: interrupted" + (
            " before the run could checkpoint" if resumable else ""), EXIT_INTERRUPTED)
    except Exception as error:
        from yaml import YAMLError

        # deferred: keeps orbax, optax and grain out of `--help`, `config` and refusals
        from train.checkpoint.manager import NoReadableCheckpointError, UnreadableCheckpointError
        from train.checkpoint.run_files import RunConfigError
        from train.core.fit import DivergenceError, RunSetupError
        from train.core.memory import DeviceMemoryError
        from train.core.metrics import MetricsFileError
        from train.core.runs import RunLockedError
        from train.core.session import RangeCheckError

        user_errors = (UserError, ConfigError, YAMLError, FileNotFoundError, NotADirectoryError,
                       PermissionError, UnreadableCheckpointError, NoReadableCheckpointError,
                       RunLockedError, DivergenceError, RunSetupError, DeviceMemoryError,
                       RangeCheckError, MetricsFileError, RunConfigError)
        if not isinstance(error, user_errors):
            raise
        what = "malformed YAML: " if isinstance(error, YAMLError) else ""
        code = (EXIT_USAGE if isinstance(error, (ConfigError, YAMLError)) else
                EXIT_DIVERGED if isinstance(error, DivergenceError) else
                error.code if isinstance(error, UserError) else EXIT_ERROR)
        return _reported(args, f"error: {what}{' '.join(str(error).split())}", code)
