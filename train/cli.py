"""Command line: `python -m train COMMAND ...` (see `python -m train --help`).

    fit CONFIG [key=value ...]      train (resumes if the run directory has checkpoints)
    cpt CONFIG [key=value ...]      SpectralShift continued pretraining from cpt.reference
    eval RUN_DIR                    held-out loss (and per-position loss) of a run's checkpoint
    prepare --source S --out DIR    tokenizer (byte or trained BPE) + ArrayRecord shards
    plot RUN_DIR                    loss.png and position_loss.png
    bench CONFIG [key=value ...]    tokens/s and peak memory of the train step
    main [key=value ...]            the tiny FPA preset end to end, with a summary table
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from pathlib import Path

from train.config import Config, ConfigError, load_config

DEFAULT_RUNS_DIR = Path("runs")
MAIN_PRESET = "tiny_fpa"
NOT_IMPLEMENTED = {
    "probe": "synthetic-task probes (ladder, flip-flop, MQAR, ...)",
    "generate": "sampling text from a checkpoint",
    "export": "exporting parameters of a checkpoint",
}


def _default_run_dir(config: Config) -> Path:
    if config.train.run_dir:
        return Path(config.train.run_dir)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return DEFAULT_RUNS_DIR / f"{config.name}-{stamp}"


def _run_dir(args, config: Config) -> Path:
    return Path(args.run_dir) if args.run_dir else _default_run_dir(config)


def _format_loss(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _fit_summary(result, config: Config, extra: list[tuple[str, str]] = ()) -> str:
    from train.metrics import format_duration, format_rate, format_table

    rows = [
        ("config", config.name),
        ("parameters", f"{result.params / 1e6:.3f}M"),
        ("steps", f"{result.steps} (started at {result.start_step})"
                  + (" -- stopped early by a signal" if result.preempted else "")),
        ("final train loss", _format_loss(result.train_loss)),
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


def _start_jax() -> None:
    from train.sharding import maybe_initialize_distributed

    maybe_initialize_distributed()


def command_fit(args) -> int:
    config = load_config(args.config, args.overrides)
    _start_jax()
    from train.fit import fit

    result = fit(config, _run_dir(args, config))
    print(_fit_summary(result, config))
    return 0


def command_cpt(args) -> int:
    config = load_config(args.config, args.overrides)
    _start_jax()
    from train.cpt import continued_pretraining

    result = continued_pretraining(config, _run_dir(args, config))
    print(_fit_summary(result, config))
    return 0


def command_main(args) -> int:
    config = load_config(MAIN_PRESET, args.overrides)
    _start_jax()
    from train.fit import fit
    from train.plot import plot_run

    run_dir = _run_dir(args, config)
    result = fit(config, run_dir)
    plots = plot_run(run_dir)
    print(_fit_summary(result, config, [("plots", ", ".join(str(p) for p in plots))]))
    return 0


def command_eval(args) -> int:
    _start_jax()
    from train.evaluate import evaluate_run
    from train.metrics import format_table

    result = evaluate_run(args.run_dir, seq_len=args.seq_len, num_batches=args.batches)
    out = Path(args.out) if args.out else Path(args.run_dir) / (
        f"eval-step{result['step']}-len{result['seq_len']}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    rows = [("step", str(result["step"])), ("seq_len", str(result["seq_len"])),
            ("eval loss", f"{result['loss']:.4f}"), ("tokens", str(result["tokens"]))]
    rows += [(f"  positions {start}+", _format_loss(loss))
             for start, loss in zip(result["position_bucket_start"], result["position_loss"])]
    rows.append(("written", str(out)))
    print(format_table(rows))
    return 0


def command_prepare(args) -> int:
    from train.data import resolve_source, write_arrayrecord_shards
    from train.tokenizer import ByteTokenizer, train_bpe

    out = Path(args.out)
    if args.vocab_size:
        corpus = resolve_source(args.source, max_documents=args.max_documents)
        if not hasattr(corpus, "relative_paths"):
            raise ValueError(f"--source: BPE training needs a text source, got {args.source!r}")
        files = [Path(corpus.root) / p for p in corpus.relative_paths]
        tokenizer = train_bpe(files, args.vocab_size)
    else:
        tokenizer = ByteTokenizer()
    shards = write_arrayrecord_shards(source=args.source, tokenizer=tokenizer, out_dir=out,
                                      num_shards=args.num_shards, max_documents=args.max_documents)
    print(f"wrote {len(shards)} shards and the tokenizer ({tokenizer!r}) to {out}\n"
          f"use: data.source=arrayrecord:{out} data.tokenizer={out / 'tokenizer'}")
    return 0


def command_plot(args) -> int:
    from train.plot import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def command_bench(args) -> int:
    overrides = list(args.overrides)
    if args.context:
        overrides.append(f"data.seq_len={args.context}")
    if args.batch_size:
        overrides.append(f"data.batch_size={args.batch_size}")
    config = load_config(args.config, overrides)
    _start_jax()
    from train.bench import benchmark
    from train.metrics import format_rate, format_table

    result = benchmark(config, steps=args.steps, warmup=args.warmup)
    out = Path(args.out) if args.out else DEFAULT_RUNS_DIR / (
        f"bench-{config.name}-len{config.data.seq_len}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(format_table([
        ("config", result["config"]),
        ("device", f"{result['devices']} x {result['device']} ({result['platform']})"),
        ("context x batch", f"{result['seq_len']} x {result['batch_size']}"),
        ("params", f"{result['params'] / 1e6:.2f}M"),
        ("steps timed", str(result["steps"])),
        ("ms / step", f"{1e3 * result['seconds_per_step']:.1f}"),
        ("tokens/s", format_rate(result["tokens_per_second"])),
        ("peak memory", f"{result['peak_memory_bytes'] / 2**30:.3f} GiB ({result['memory_source']})"),
        ("compile", f"{result['compile_seconds']:.1f} s"),
        ("written", str(out)),
    ]))
    return 0


def command_not_implemented(args) -> int:
    print(f"error: `{args.command}` ({NOT_IMPLEMENTED[args.command]}) is not implemented yet",
          file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m train",
        description="Train, evaluate and benchmark FPA / GatedDeltaNet language models.",
        epilog="Configs are YAML presets (configs/*.yaml, or a path) with dotted key=value "
               "overrides, e.g. `python -m train fit tiny_fpa model.num_layers=4 optim.lr=1e-3`.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name, help_text, handler):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("config", help="preset name (configs/NAME.yaml) or YAML path")
        sub.add_argument("overrides", nargs="*", metavar="key=value",
                         help="dotted overrides, e.g. optim.lr=1e-3")
        sub.set_defaults(handler=handler)
        return sub

    for name, text, handler in [
        ("fit", "train a model (resumes from the run directory's newest checkpoint)", command_fit),
        ("cpt", "SpectralShift continued pretraining from cpt.reference", command_cpt),
    ]:
        sub = with_config(name, text, handler)
        sub.add_argument("--run-dir", help="run directory (default: train.run_dir or "
                                           "runs/<config>-<timestamp>)")

    sub = commands.add_parser("eval", help="held-out loss of a run's newest checkpoint",
                              description="held-out loss of a run's newest checkpoint")
    sub.add_argument("run_dir")
    sub.add_argument("--seq-len", type=int, help="evaluate at this context length")
    sub.add_argument("--batches", type=int, help="eval batches (default: train.eval_batches)")
    sub.add_argument("--out", help="JSON output (default: RUN_DIR/eval-step<N>-len<L>.json)")
    sub.set_defaults(handler=command_eval)

    sub = commands.add_parser("prepare", help="tokenizer + pre-tokenised ArrayRecord shards",
                              description="tokenizer + pre-tokenised ArrayRecord shards")
    sub.add_argument("--source", default="stdlib", help="stdlib, a directory or a glob")
    sub.add_argument("--out", required=True, help="output directory")
    sub.add_argument("--vocab-size", type=int, default=0,
                     help="train a byte-level BPE of this size (0: byte tokenizer)")
    sub.add_argument("--num-shards", type=int, default=4)
    sub.add_argument("--max-documents", type=int, default=None)
    sub.set_defaults(handler=command_prepare)

    sub = commands.add_parser("plot", help="PNG loss curves and per-position loss of a run",
                              description="PNG loss curves and per-position loss of a run")
    sub.add_argument("run_dir")
    sub.add_argument("--out", help="output directory (default: the run directory)")
    sub.set_defaults(handler=command_plot)

    sub = with_config("bench", "tokens/s and peak memory of the train step", command_bench)
    sub.add_argument("--context", type=int, help="sequence length (overrides data.seq_len)")
    sub.add_argument("--batch-size", type=int, help="global batch (overrides data.batch_size)")
    sub.add_argument("--steps", type=int, default=10, help="timed steps")
    sub.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    sub.add_argument("--out", help="JSON output (default: runs/bench-<config>-len<T>.json)")

    sub = commands.add_parser("main", help=f"train the {MAIN_PRESET} preset on CPU and print a "
                                           "summary (what ./dev.sh main runs)",
                              description=f"train the {MAIN_PRESET} preset and print a summary")
    sub.add_argument("overrides", nargs="*", metavar="key=value")
    sub.add_argument("--run-dir")
    sub.set_defaults(handler=command_main)

    for name, what in NOT_IMPLEMENTED.items():
        sub = commands.add_parser(name, help=f"{what} (not implemented yet)",
                                  description=f"{what} (not implemented yet)")
        sub.add_argument("rest", nargs=argparse.REMAINDER)
        sub.set_defaults(handler=command_not_implemented)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
