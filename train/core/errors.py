"""How a command reports a mistake: the exit codes of `python -m train` (their meanings:
train/cli/__init__.py, which re-exports all of this), UserError, one `error:` line on stderr
(`print_error`) and an argparse parser whose refusals are that one line (`OneLineParser`).

Here, below train/cli, so that the commands that live beside the code they run
(train/probes/cli.py, `python -m train.experiments.lm_compare`) answer with the same lines and
codes as `python -m train`. Standard library only: `--help` imports it.
"""

from __future__ import annotations

import argparse
import sys

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A mistake on the command line or in its inputs: printed as one `error:` line, exit
    `code` (EXIT_ERROR unless given, e.g. EXIT_USAGE for a command line that cannot work)."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


def print_error(message: object, code: int = EXIT_ERROR) -> int:
    """Prints `error: MESSAGE` on stderr as one line (runs of whitespace, newlines included,
    become one space) and returns `code`, the exit code."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return code


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusals are one line, `error: PROG: ...`, exit EXIT_USAGE (the usage
    block is left to --help); the subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see {self.prog} --help)\n")
