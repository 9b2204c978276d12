"""`python -m train probe TASK [key=value ...]`: synthetic-task probes over many seeds; the
command itself is train/probes/cli.py."""

from __future__ import annotations

import argparse


class _ProbeHelp(argparse.Action):
    """`probe --help`: generated from the probe code (train/probes/cli.py), imported only
    here; `probe TASK --help` reaches the probe command itself."""

    def __call__(self, parser, namespace, values, option_string=None):
        # deferred: the probes package imports optax, which `--help` does without
        from train.probes.cli import general_help

        print(general_help())
        parser.exit()


def add_probe_command(commands) -> None:
    sub = commands.add_parser("probe", help="synthetic-task probes over many seeds "
                              "(`probe --help`: tasks, keys and defaults)", add_help=False)
    sub.add_argument("-h", "--help", action=_ProbeHelp, nargs=0,
                     help="the tasks, the key=value options and their defaults")
    sub.add_argument("rest", nargs=argparse.REMAINDER, metavar="TASK [key=value ...]")
    sub.set_defaults(handler=command_probe)


def command_probe(args) -> int:
    # deferred: the probes package imports optax, which `--help` does without
    from train.probes.cli import main as probe_main

    return probe_main(args.rest)
