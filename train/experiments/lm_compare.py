"""The small language-model comparison as one command: train each model on the same data,
tokens and budget, then evaluate it at and beyond the training length.

    python -m train.experiments.lm_compare --size cpu|h200 [--out DIR] [--runs-dir DIR]
                               [--models fpa,fox,...] [--samples N] [key=value ...]
    python -m train.experiments.lm_compare --merge A/lm_compare.json B/lm_compare.json ... --out DIR

    models      presets configs/lmc_<size>_<model>.yaml: fpa, fox, softmax_rope, selective_rope,
                gdn, hybrid (GDN + FPA); one base per size (configs/base/lmc_<size>.yaml) fixes
                the data,
                context L, batch, steps and optimizer, so every model sees the same tokens;
                key=value overrides apply to every model
    per model   train into RUNS_DIR/<model> (train/core/fit.py; a finished run is resumed, not
                retrained), then
                  held-out loss     at L over train.eval_batches batches, with each
                                    document piece's loss (train/core/evaluate.py)
                  position loss     held-out loss at 4L by document position
                                    (train/experiments/long_eval.py), summarised per span [kL, (k+1)L),
                                    k = 0..3, as the token-weighted mean of its buckets
                  passkey           accuracy at 1L, 2L, 4L, 8L: mean over needle depths
                                    (cpu 0, 0.5, 1; h200 0, 0.25, .., 1) x `samples` samples
                                    (teacher-forced exact match, train/experiments/long_eval_tasks.py)
                  against FoX       the held-out loss difference over the same document
                                    pieces with a paired bootstrap 95% interval, and
                                    passkeys found per length with Fisher's exact test
    output      DIR/lm_compare.json (everything, incl. each model's long_eval result and
                per-document held-out losses), DIR/lm_compare.md (the table, then the
                comparison with FoX), DIR/lm_compare.png (three panels);
                RUNS_DIR/<model>/long-eval/ the long_eval heatmap and position-loss PNGs
    exit        0 done; a mistake is one `error:` line with the codes of `python -m train`
                (train/core/errors.py): 2 for the command line, a config or --merge rows
                that cannot be merged, 1 for a missing file or an unreadable --merge input,
                75 when a signal stopped training (re-run the same command to resume)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from train.core.config import ConfigError
from train.core.errors import (EXIT_PREEMPTED, EXIT_USAGE, OneLineParser, UserError,
                               print_error)

MODELS = ("fpa", "fox", "softmax_rope", "selective_rope", "gdn", "hybrid")
SIZES = ("cpu", "h200")
LENGTH_FACTORS = (1, 2, 4, 8)
POSITION_FACTOR = 4
DEPTHS = {"cpu": (0.0, 0.5, 1.0), "h200": (0.0, 0.25, 0.5, 0.75, 1.0)}


def span_losses(position_loss: dict, train_seq_len: int) -> list[float | None]:
    """Token-weighted mean loss of the buckets starting in [k L, (k+1) L), k = 0..factor-1."""
    factor = position_loss["seq_len"] // train_seq_len
    sums, counts = [0.0] * factor, [0] * factor
    for start, loss, tokens in zip(position_loss["position_bucket_start"],
                                   position_loss["position_loss"],
                                   position_loss["position_tokens"]):
        if loss is not None:
            span = min(start // train_seq_len, factor - 1)
            sums[span] += loss * tokens
            counts[span] += tokens
    return [s / c if c else None for s, c in zip(sums, counts)]


def compare_model(size: str, model: str, runs_dir: Path, overrides: list[str],
                  samples: int) -> dict | None:
    """Train (or resume) one model, then evaluate it; the row of the table and its details
    (None: training was stopped by a signal after checkpointing)."""
    # deferred: `--merge` and `--help` run without the trainer (jax, orbax, optax, grain)
    from train.core.evaluate import evaluate_run
    from train.core.fit import fit
    from train.core.presets import load_config
    from train.experiments.long_eval import evaluate_long

    config = load_config(f"lmc_{size}_{model}", overrides)
    run_dir = runs_dir / model
    print(f"== {model}: training {config.name} in {run_dir}", flush=True)
    started = time.perf_counter()
    result = fit(config, run_dir)
    if result.preempted:
        return None
    train_seconds = time.perf_counter() - started
    started = time.perf_counter()
    heldout = evaluate_run(run_dir, per_document=True)
    seq_len, depths = config.data.seq_len, DEPTHS[size]
    long = evaluate_long(run_dir, lengths=[f * seq_len for f in LENGTH_FACTORS], depths=depths,
                         tasks=("passkey",), num_samples=samples, seed=0,
                         out_dir=run_dir / "long-eval", batch_size=min(samples, 8),
                         position_factor=POSITION_FACTOR, position_buckets=4 * POSITION_FACTOR)
    passkey = [None if any(row[j] is None for row in long["passkey"]["accuracy"])
               else sum(row[j] for row in long["passkey"]["accuracy"]) / len(depths)
               for j in range(len(LENGTH_FACTORS))]
    return {"model": model, "config": config.name, "params": result.params,
            "steps": result.steps, "tokens": result.steps * config.data.batch_size * seq_len,
            "train_seq_len": seq_len, "heldout_loss": heldout["loss"],
            "heldout_documents": {"loss_sum": heldout["document_loss_sum"],
                                  "tokens": heldout["document_tokens"]},
            "span_loss": span_losses(long["position_loss"], seq_len),
            "passkey": passkey, "passkey_counts": passkey_counts(long["passkey"]),
            "train_seconds": round(train_seconds, 1) if result.start_step < result.steps
            else None,
            "tokens_per_second": result.tokens_per_second,
            "eval_seconds": round(time.perf_counter() - started, 1), "long_eval": long}


def passkey_counts(passkey: dict) -> list[list[int] | None]:
    """[correct, total] per length, summed over depths (None where a prompt does not fit);
    each cell's accuracy is a mean over `samples` prompts."""
    samples, out = passkey["samples"], []
    for j in range(len(passkey["lengths"])):
        cells = [row[j] for row in passkey["accuracy"]]
        out.append(None if any(c is None for c in cells)
                   else [int(round(sum(cells) * samples)), samples * len(cells)])
    return out


def paired_bootstrap(loss_a, loss_b, tokens, resamples: int = 2000, seed: int = 0):
    """(difference, low, high): the token-weighted held-out loss of A minus B over the same
    document pieces (loss_a, loss_b: each piece's summed loss; tokens: its scored tokens), and
    the 95% percentile interval over `resamples` resamplings of the pieces with replacement."""
    import numpy as np

    loss_a, loss_b, tokens = (np.asarray(x, np.float64) for x in (loss_a, loss_b, tokens))
    if not (loss_a.shape == loss_b.shape == tokens.shape) or loss_a.ndim != 1 or not len(tokens):
        raise ValueError(f"paired_bootstrap: expected three equal-length non-empty vectors, got "
                         f"{loss_a.shape}, {loss_b.shape}, {tokens.shape}")
    difference = (loss_a - loss_b).sum() / tokens.sum()
    picks = np.random.default_rng(seed).integers(0, len(tokens), (resamples, len(tokens)))
    draws = (loss_a - loss_b)[picks].sum(axis=1) / tokens[picks].sum(axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(difference), float(low), float(high)


def comparison_table(rows: list[dict], anchor: str = "fox") -> str:
    """Each model against `anchor` on the same held-out document pieces (paired bootstrap of
    the loss difference) and the same passkey prompts (Fisher's exact test, one-sided: the
    model finds more passkeys than the anchor); "" without the anchor's row."""
    # deferred: the probes package imports optax and jax, which `--merge` does without
    from train.probes.stats import fisher_greater

    base = next((row for row in rows if row["model"] == anchor), None)
    if base is None:
        return ""
    reference = base["heldout_documents"]
    lengths = [f"{f}L" for f in LENGTH_FACTORS]
    header = ["model", f"loss - {anchor} (95% CI)",
              *(f"passkey {n}: found (p)" for n in lengths)]
    lines = [f"Against {anchor}: held-out loss difference over the same "
             f"{len(reference['tokens'])} document pieces (paired bootstrap, 2000 resamplings); "
             f"passkeys found out of the prompts of each length, and the one-sided Fisher "
             f"exact p-value of finding more than {anchor}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        documents = row["heldout_documents"]
        if documents["tokens"] != reference["tokens"]:
            raise ValueError(f"{row['model']}: its held-out document pieces differ from "
                             f"{anchor}'s (not the same data, seq_len or eval batches)")
        cells = [row["model"]]
        if row is base:
            cells.append("-")
        else:
            diff, low, high = paired_bootstrap(documents["loss_sum"], reference["loss_sum"],
                                               documents["tokens"])
            cells.append(f"{diff:+.4f} ({low:+.4f}, {high:+.4f})")
        for mine, theirs in zip(row["passkey_counts"], base["passkey_counts"]):
            if mine is None or theirs is None:
                cells.append("-")
            elif row is base:
                cells.append(f"{mine[0]}/{mine[1]}")
            else:
                p = fisher_greater(mine[0], mine[1], theirs[0], theirs[1])
                cells.append(f"{mine[0]}/{mine[1]} ({p:.2g})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(rows: list[dict], size: str) -> str:
    """The comparison table (one row per model)."""
    seq_len, passkey = rows[0]["train_seq_len"], rows[0]["long_eval"]["passkey"]
    spans = [f"loss {k}-{k + 1}L" for k in range(POSITION_FACTOR)]
    passkeys = [f"passkey {f}L" for f in LENGTH_FACTORS]
    header = ["model", "params", "tokens", "held-out loss", *spans, *passkeys, "train s"]
    lines = [f"Language-model comparison, size `{size}`: L = {seq_len} tokens (training "
             f"context); loss in nats/token on held-out text; passkey = teacher-forced exact "
             f"match, mean over {len(passkey['depths'])} depths x {passkey['samples']} samples "
             f"('-': the prompt does not fit; train s '-': trained by an earlier call).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["model"], f"{row['params'] / 1e6:.3f}M", f"{row['tokens'] / 1e6:.2f}M",
                 _fmt(row["heldout_loss"], 4), *(_fmt(v, 4) for v in row["span_loss"]),
                 *(_fmt(v, 2) for v in row["passkey"]), _fmt(row["train_seconds"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (bars, positions, passkey) = plt.subplots(1, 3, figsize=(15, 4.2))
    names = [row["model"] for row in rows]
    losses = [row["heldout_loss"] for row in rows]
    bars.bar(names, losses, color="tab:blue")
    bars.set_ylim(min(losses) - 0.1, max(losses) + 0.05)
    bars.set_ylabel("held-out loss at L (nats / token)")
    bars.set_title("held-out loss")
    for row in rows:
        cell = row["long_eval"]["position_loss"]
        x = np.asarray(cell["position_bucket_start"]) / row["train_seq_len"]
        positions.plot(x, [np.nan if v is None else v for v in cell["position_loss"]], "o-",
                       label=row["model"], markersize=3)
        passkey.plot(LENGTH_FACTORS, [np.nan if v is None else v for v in row["passkey"]],
                     "o-", label=row["model"])
    positions.axvline(1.0, color="gray", linestyle="--")
    positions.set_xlabel("document position / L")
    positions.set_ylabel("held-out loss")
    positions.set_title(f"per-position loss to {POSITION_FACTOR}L")
    positions.legend(fontsize=8)
    passkey.set_xscale("log", base=2)
    passkey.set_xticks(LENGTH_FACTORS, [f"{f}L" for f in LENGTH_FACTORS])
    passkey.set_ylim(-0.05, 1.05)
    passkey.set_xlabel("context length")
    passkey.set_ylabel("passkey accuracy")
    passkey.set_title("passkey retrieval")
    passkey.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m train.experiments.lm_compare",
        description="Train FPA, FoX, softmax-RoPE, GDN and a GDN+FPA hybrid on the same data "
                    "and tokens; one table of held-out loss, per-position loss to 4L and "
                    "passkey accuracy at 1L-8L.")
    parser.add_argument("--size", choices=SIZES,
                        help="cpu: a couple of minutes on 2 cores; h200: about a minute of "
                             "training per model on one H200 (required unless --merge)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="train nothing: one table and plot from the rows of earlier "
                             "lm_compare.json files (e.g. one model per machine call), "
                             "written to --out")
    parser.add_argument("--out", help="tables and plot (default runs/lm_compare-<size>)")
    parser.add_argument("--runs-dir", help="the models' run directories (default OUT/runs)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--samples", type=int, default=None,
                        help="passkey samples per (length, depth) cell (default cpu 4, h200 20)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides for every model, e.g. train.steps=500")
    args = parser.parse_args(argv)
    if args.merge:
        if not args.out:
            parser.error("--merge: expected --out DIR for the merged table")
        return args
    if args.size is None:
        parser.error("--size: required (cpu or h200) unless --merge")
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"--models: expected some of {','.join(MODELS)}, got {args.models!r}")
    args.models = models
    if args.samples is None:
        args.samples = 4 if args.size == "cpu" else 20
    if args.samples < 1:
        parser.error(f"--samples: expected an integer >= 1, got {args.samples}")
    return args


def main(argv: list[str] | None = None) -> int:
    """The command (module doc): its exit code; a UserError is its one `error:` line."""
    args = parse_arguments(argv)
    try:
        return merge(args.merge, Path(args.out)) if args.merge else compare(args)
    except UserError as error:
        return print_error(error, error.code)


def compare(args: argparse.Namespace) -> int:
    """Train and evaluate args.models, then write the tables (module doc)."""
    out = Path(args.out or f"runs/lm_compare-{args.size}")
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(args.runs_dir) if args.runs_dir else out / "runs"
    started = time.perf_counter()
    rows = []
    try:
        for model in args.models:
            row = compare_model(args.size, model, runs_dir, args.overrides, args.samples)
            if row is None:
                return print_error(f"{model}: stopped by a signal; re-run the same command to "
                                   f"resume", EXIT_PREEMPTED)
            rows.append(row)
    except ConfigError as error:
        raise UserError(str(error), EXIT_USAGE) from None
    except FileNotFoundError as error:
        raise UserError(str(error)) from None
    (out / "lm_compare.json").write_text(json.dumps(
        {"size": args.size, "overrides": args.overrides, "rows": rows,
         "wall_seconds": round(time.perf_counter() - started, 1)}, indent=1) + "\n")
    write_tables(rows, args.size, out)
    print(f"wall {time.perf_counter() - started:.0f} s; written: {out}/lm_compare.{{json,md,png}}")
    return 0


def write_tables(rows: list[dict], size: str, out: Path) -> None:
    """OUT/lm_compare.md (the table, then the comparison with FoX) and OUT/lm_compare.png."""
    table = markdown_table(rows, size)
    against = comparison_table(rows)
    (out / "lm_compare.md").write_text(table + ("\n" + against if against else ""))
    plot(rows, out / "lm_compare.png")
    print(table)
    print(against)


def merge(paths: list[str], out: Path) -> int:
    """--merge: the rows of earlier runs' lm_compare.json in one table (models in the order
    given; a model given twice is an error, a UserError like an unreadable file)."""
    rows, sizes = [], set()
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise UserError(f"--merge: cannot read {path}: {error}") from None
        sizes.add(data["size"])
        rows.extend(data["rows"])
    names = [row["model"] for row in rows]
    if len(set(names)) != len(names) or len(sizes) != 1:
        raise UserError(f"--merge: expected each model once and one size, got models {names} "
                        f"and sizes {sorted(sizes)}", EXIT_USAGE)
    out.mkdir(parents=True, exist_ok=True)
    try:
        write_tables(rows, sizes.pop(), out)
    except ValueError as error:
        raise UserError(f"--merge: {error}", EXIT_USAGE) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
