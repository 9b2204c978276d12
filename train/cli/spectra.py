"""`python -m train spectra RUN [--lengths L ...] [--compare RUN2] [--out DIR]`
(train/experiments/spectra.py).

Prints M_slow, H_slow and mean E_write per distance (a column per run) and writes spectra.json
and PNGs to --out (default RUN/spectra-step<N>). With --compare both runs see the same needle
inputs (those built from RUN's held-out text), so the columns differ only by the weights. The
summary table fits TABLE_WIDTH columns (for paths of ordinary length): a row per run, the
files written named once by their directory and wrapped.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from train.cli import UserError
from train.cli.common import positive_int, start_jax
from train.core.metrics import format_table
from train.experiments.spectra import DEFAULT_LENGTHS, DEFAULT_NEEDLE_POSITION

TABLE_WIDTH = 100


def add_spectra_command(commands) -> None:
    """Register the `spectra` subcommand on the CLI's subparsers."""
    text = "decay-rate spectra and slow-band widths of a GDN checkpoint on needle inputs"
    sub = commands.add_parser("spectra", help=text, description=text)
    sub.add_argument("run_dir", metavar="RUN")
    sub.add_argument("--lengths", type=positive_int, nargs="+", default=list(DEFAULT_LENGTHS),
                     help="context lengths: the needle is read back at position L - 1 "
                          f"(default: {' '.join(map(str, DEFAULT_LENGTHS))})")
    sub.add_argument("--compare", metavar="RUN2", help="a second run (e.g. after extension), "
                                                       "measured on the same inputs and overlaid")
    sub.add_argument("--step", type=int, help="checkpoint step of RUN (default: the newest)")
    sub.add_argument("--needle-position", type=int, default=DEFAULT_NEEDLE_POSITION,
                     help="position of the needle's last token")
    sub.add_argument("--samples", type=positive_int, default=4, help="needle sequences")
    sub.add_argument("--out", help="output directory (default: RUN/spectra-step<N>)")
    sub.set_defaults(handler=command_spectra)


def command_spectra(args: argparse.Namespace) -> int:
    for name in (args.run_dir, args.compare):
        if name is not None and not (Path(name) / "config.json").is_file():
            raise UserError(f"{name}: not a run directory (no config.json)")
    start_jax()
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.core.runs import load_run
    from train.experiments.spectra import spectra, write_report

    def measure(run_dir, step, tokens):
        try:
            return spectra(run_dir, step=step, lengths=args.lengths, tokens=tokens,
                           needle_position=args.needle_position, num_samples=args.samples)
        except ValueError as error:
            raise UserError(str(error)) from None

    summary, first, tokens = measure(args.run_dir, args.step, None)
    results, firsts = [summary], [first]
    if args.compare:
        if load_run(args.compare)[1].fingerprint != load_run(args.run_dir)[1].fingerprint:
            raise UserError(f"--compare: {args.compare} uses another tokenizer than "
                            f"{args.run_dir}; the needle inputs would differ")
        other, other_first, _ = measure(args.compare, None, tokens)
        results.append(other)
        firsts.append(other_first)
    out = Path(args.out) if args.out else Path(args.run_dir) / f"spectra-step{summary['step']}"
    written = write_report(results, firsts, out)
    print(format_table(summary_rows(results, written)))
    return 0


def summary_rows(results: list[dict], written: list[Path]) -> list[tuple[str, str]]:
    """The summary table's rows: the runs, M_slow / H_slow / E_write per distance (one column
    per run), and the written files under their directory, wrapped to TABLE_WIDTH."""
    names = ["run", "compare"][:len(results)]
    heads = " | ".join(dict.fromkeys(str(r["layer_heads"]) for r in results))
    rows = [(name, f"{r['run']} (step {r['step']})") for name, r in zip(names, results)]
    rows.append(("per distance", f"M_slow / H_slow of {heads} layer-heads / E_write"
                 + (f": {' | '.join(names)}" if len(results) > 1 else "")))
    for index, distance in enumerate(results[0]["distances"]):
        rows.append((f"ell={distance}", " | ".join(
            f"{r['m_slow'][index]:.1f} / {r['h_slow'][index]:.1f} / "
            f"{r['e_write_mean'][index]:.3f}" for r in results)))
    directory = written[0].parent
    files = [p.name if p.parent == directory else str(p) for p in written]
    width = TABLE_WIDTH - 3 - max(len(key) for key, _ in rows)
    rows.append(("written", f"{directory}/"))
    rows += [("", line) for line in textwrap.wrap(", ".join(files), width=width,
                                                  break_long_words=False)]
    return rows
