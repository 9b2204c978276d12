"""`python -m train`: the parser of every command, and `main` (exit codes: train/cli/__init__.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from train.cli import (EXIT_DIVERGED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USAGE,
                       UserError)
from train.core.config import Config, ConfigError, load_config
from train.core.runs import DEFAULT_RUNS_DIR

MAIN_PRESET = "tiny_fpa"


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


def _int_at_least(minimum: int):
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


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _run_dir(args, config_source: str | None, config: Config, check=None) -> Path:
    """--run-dir, train.run_dir, or the default derived from the config; prints which run
    (after refusing a run directory another process holds, and after `check(run_dir)`, which
    raises on inputs that make the run impossible, e.g. cpt's reference)."""
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
    print(_differences_line(config_source, config), flush=True)
    return run_dir


def _differences_line(config_source: str | None, config: Config) -> str:
    from train.core.runs import config_differences

    differences = config_differences(load_config(config_source, []), config)
    where = f"preset {config_source}" if config_source else "the defaults"
    if not differences:
        return f"config: {where}, unchanged"
    return f"config: {where} with " + ", ".join(f"{k}={v!r}" for k, v in differences.items())


def _fit_exit_code(result) -> int:
    return EXIT_PREEMPTED if result.preempted else 0


def _format_loss(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _fit_summary(result, config: Config, extra: list[tuple[str, str]] = ()) -> str:
    from train.core.metrics import format_duration, format_rate, format_table

    rows = [
        ("config", config.name),
        ("parameters", f"{result.params / 1e6:.3f}M"),
        ("steps", f"{result.steps} (started at {result.start_step})"
                  + (" -- stopped early by a signal" if result.preempted else "")
                  + (f", {result.skipped_steps} non-finite skipped" if result.skipped_steps
                     else "")),
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
    from train.core.sharding import maybe_initialize_distributed

    maybe_initialize_distributed()


def command_fit(args) -> int:
    config = load_config(args.config, args.overrides)
    _start_jax()
    from train.core.fit import fit

    result = fit(config, _run_dir(args, args.config, config))
    print(_fit_summary(result, config))
    return _fit_exit_code(result)


def command_cpt(args) -> int:
    config = load_config(args.config, args.overrides)
    _start_jax()
    from train.experiments.cpt import checked_reference, continued_pretraining

    run_dir = _run_dir(args, args.config, config,
                       check=lambda run_dir: checked_reference(config, run_dir))
    result = continued_pretraining(config, run_dir)
    print(_fit_summary(result, config))
    return _fit_exit_code(result)


def command_main(args) -> int:
    config = load_config(MAIN_PRESET, args.overrides)
    _start_jax()
    from train.core.fit import fit
    from train.tools.plot import plot_run

    run_dir = _run_dir(args, MAIN_PRESET, config)
    result = fit(config, run_dir)
    plots = plot_run(run_dir)
    print(_fit_summary(result, config, [("plots", ", ".join(str(p) for p in plots))]))
    return _fit_exit_code(result)


def command_eval(args) -> int:
    _start_jax()
    if args.suite == "long":
        from train.cli.eval_long import run_long_suite
        return run_long_suite(args)
    from train.core.evaluate import evaluate_run
    from train.core.metrics import format_table

    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir}: run directory does not exist")
    result = evaluate_run(args.run_dir, seq_len=args.seq_len, num_batches=args.batches,
                          step=args.step, batch_size=args.batch_size)
    print(f"evaluated step {result['step']} of {args.run_dir}", flush=True)
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
    """Every ValueError (and an existing manifest) here is about the user's --source, --out or
    sizes: raised as a one-line UserError."""
    from train.data.pipeline import resolve_source, write_arrayrecord_shards
    from train.data.tokenizer import ByteTokenizer, train_bpe

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} is a file, expected a directory")
    try:
        if args.vocab_size:
            corpus = resolve_source(args.source, max_documents=args.max_documents)
            if not hasattr(corpus, "relative_paths"):
                raise ValueError(f"--source: BPE training needs a text source, got "
                                 f"{args.source!r}")
            files = [Path(corpus.root) / p for p in corpus.relative_paths]
            tokenizer = train_bpe(files, args.vocab_size)
        else:
            tokenizer = ByteTokenizer()
        shards = write_arrayrecord_shards(source=args.source, tokenizer=tokenizer, out_dir=out,
                                          num_shards=args.num_shards,
                                          max_documents=args.max_documents)
    except (ValueError, FileExistsError) as error:
        raise UserError(str(error)) from error
    if args.vocab_size and tokenizer.vocab_size < args.vocab_size:
        print(f"note: the tokenizer has {tokenizer.vocab_size} entries, fewer than --vocab-size "
              f"{args.vocab_size}: BPE adds a merge only for a pair of adjacent tokens seen at "
              f"least twice, and the text had no more such pairs (more text gives more)",
              file=sys.stderr, flush=True)
    print(f"wrote {len(shards)} shards and the tokenizer ({tokenizer!r}) to {out}\n"
          f"use: data.source=arrayrecord:{out} data.tokenizer={out / 'tokenizer'}")
    return 0


def command_plot(args) -> int:
    from train.tools.plot import plot_run

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
    from train.tools.bench import benchmark
    from train.core.metrics import format_rate, format_table

    if args.profile and Path(args.profile).exists() and not Path(args.profile).is_dir():
        raise UserError(f"--profile: {args.profile} is a file, expected a directory")
    result = benchmark(config, steps=args.steps, warmup=args.warmup, profile_dir=args.profile)
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
        ("model FLOPs / token", f"{result['model_flops_per_token'] / 1e6:,.2f} M (6 x params "
                                f"+ attention + recurrence; train/tools/bench.py)"),
        ("achieved", f"{result['achieved_tflops_per_device']:.2f} TFLOP/s per device"),
        ("bf16 matmul ceiling", f"{result['matmul_ceiling_tflops']:.2f} TFLOP/s "
                                f"({result['matmul_ceiling_size']}^3, measured now)"),
        ("MFU", f"{100 * result['mfu']:.1f}%"),
        ("peak memory", f"{result['peak_memory_bytes'] / 2**30:.3f} GiB ({result['memory_source']})"),
        ("estimate", f"{result['memory_estimate_bytes'] / 2**30:.3f} GiB (train/core/memory.py; "
                     f"{result['memory_estimate_bytes'] / result['peak_memory_bytes']:.2f} x peak)"),
        ("compile", f"{result['compile_seconds']:.1f} s"),
        *([("profile", f"{result['profile_dir']} (TensorBoard profile plugin or Perfetto)")]
          if result["profile_dir"] else []),
        *[("  top op" if i == 0 else "", f"{100 * share:4.1f}%  {name[:60]}")
          for i, (name, share) in enumerate(result["top_ops"])],
        ("written", str(out)),
    ]))
    return 0


def command_config(args) -> int:
    import yaml

    config = load_config(args.config, args.overrides)
    print(yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False), end="")
    print("# " + _differences_line(args.config, config))
    return 0


def command_probe(args) -> int:
    from train.probes.cli import main as probe_main
    return probe_main(args.rest)


class _Parser(argparse.ArgumentParser):
    """argparse whose refusals are one line, `error: ...`, exit 2 (the usage block is left to
    --help); the subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class _ProbeHelp(argparse.Action):
    """`probe --help`: generated from the probe code (train/probes/cli.py), imported only
    here; `probe TASK --help` reaches the probe command itself."""

    def __call__(self, parser, namespace, values, option_string=None):
        from train.probes.cli import general_help

        print(general_help())
        parser.exit()


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
    parser = _Parser(
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
                                           "runs/<config>[-<hash of the overrides>])")
        sub.add_argument("--new", action="store_true",
                         help="start another run instead of resuming the default directory's")

    sub = commands.add_parser("eval", help="held-out loss of a run's newest checkpoint",
                              description="held-out loss of a run's newest checkpoint")
    sub.add_argument("run_dir")
    sub.add_argument("--seq-len", type=_positive_int, help="evaluate at this context length")
    sub.add_argument("--batch-size", type=_positive_int,
                     help="sequences per eval batch (default: the run's data.batch_size)")
    sub.add_argument("--batches", type=_positive_int,
                     help="eval batches (default: train.eval_batches)")
    sub.add_argument("--step", type=int, help="checkpoint step (default: the newest readable; "
                                              "an unreadable requested step is an error)")
    sub.add_argument("--out", help="JSON output (default: RUN_DIR/eval-step<N>-len<L>.json); "
                                   "--suite long: a directory (default: one per setting, "
                                   "RUN_DIR/long-eval-step<N>-<tasks>-len<lengths>[-depths..]"
                                   "[-samples..][-seed..][-batches..]); long-eval files "
                                   "already there are replaced, with a note")
    from train.cli.eval_long import add_long_arguments

    add_long_arguments(sub)
    sub.set_defaults(handler=command_eval)

    sub = commands.add_parser("prepare", help="tokenizer + pre-tokenised ArrayRecord shards",
                              description="tokenizer + pre-tokenised ArrayRecord shards")
    sub.add_argument("--source", default="stdlib",
                     help="stdlib, a directory or a glob (default: %(default)s)")
    sub.add_argument("--out", required=True, help="output directory")
    sub.add_argument("--vocab-size", type=_non_negative_int, default=0,
                     help="train a byte-level BPE of this size (default: %(default)s, the byte "
                          "tokenizer)")
    sub.add_argument("--num-shards", type=_positive_int, default=4,
                     help="ArrayRecord shards to write (default: %(default)s)")
    sub.add_argument("--max-documents", type=_positive_int, default=None,
                     help="read at most this many documents (default: all)")
    sub.set_defaults(handler=command_prepare)

    sub = commands.add_parser("plot", help="PNG loss curves and per-position loss of a run",
                              description="PNG loss curves and per-position loss of a run")
    sub.add_argument("run_dir")
    sub.add_argument("--out", help="output directory (default: the run directory)")
    sub.set_defaults(handler=command_plot)

    sub = with_config("bench", "tokens/s, peak memory and MFU of the train step", command_bench)
    sub.add_argument("--context", type=_positive_int,
                     help="sequence length (overrides data.seq_len)")
    sub.add_argument("--batch-size", type=_positive_int,
                     help="global batch (overrides data.batch_size)")
    sub.add_argument("--steps", type=_positive_int, default=10,
                     help="steps per timed window (two windows; the faster counts)")
    sub.add_argument("--warmup", type=_non_negative_int, default=2,
                     help="untimed steps after compiling")
    sub.add_argument("--out", help="JSON output (default: runs/bench-<config>-len<T>.json)")
    sub.add_argument("--profile", metavar="DIR",
                     help="also write a jax.profiler trace of 3 more steps to DIR")

    sub = commands.add_parser("main", help=f"train the {MAIN_PRESET} preset on CPU and print a "
                                           "summary (what ./dev.sh main runs)",
                              description=f"train the {MAIN_PRESET} preset and print a summary")
    sub.add_argument("overrides", nargs="*", metavar="key=value")
    sub.add_argument("--run-dir")
    sub.add_argument("--new", action="store_true", help="start another run instead of resuming")
    sub.set_defaults(handler=command_main)

    with_config("config", "print the resolved config (preset + overrides) as YAML",
                command_config)

    from train.cli.export import add_export_command
    from train.cli.generate import add_generate_command
    from train.cli.spectra import add_spectra_command
    from train.experiments.stages import add_stages_command

    add_export_command(commands)
    add_generate_command(commands)
    add_stages_command(commands)
    add_spectra_command(commands)
    sub = commands.add_parser("probe", help="synthetic-task probes over many seeds "
                              "(`probe --help`: tasks, keys and defaults)", add_help=False)
    sub.add_argument("-h", "--help", action=_ProbeHelp, nargs=0,
                     help="the tasks, the key=value options and their defaults")
    sub.add_argument("rest", nargs=argparse.REMAINDER, metavar="TASK [key=value ...]")
    sub.set_defaults(handler=command_probe)
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


def main(argv: list[str] | None = None) -> int:
    args = _parse(build_parser(), argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)     # also when `python -m train` configured it first
    from train.checkpoint.manager import (NoReadableCheckpointError, RunConfigError,
                                          UnreadableCheckpointError)
    from train.core.memory import DeviceMemoryError
    from train.core.runs import RunLockedError

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
    except BrokenPipeError:         # `... | head` closed the output: no traceback about it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(OSError):
            print("error: the output was closed (broken pipe)", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        resumable = args.command in _RESUMABLE_COMMANDS
        return _reported(args, "error: interrupted" + (
            " before the run could checkpoint" if resumable else ""), EXIT_INTERRUPTED)
    except Exception as error:
        from train.core.fit import DivergenceError, RunSetupError
        from train.core.metrics import MetricsFileError
        from train.core.session import RangeCheckError

        from yaml import YAMLError

        user_errors = (UserError, ConfigError, YAMLError, FileNotFoundError, NotADirectoryError,
                       PermissionError, UnreadableCheckpointError, NoReadableCheckpointError,
                       RunLockedError, DivergenceError, RunSetupError, DeviceMemoryError,
                       RangeCheckError, MetricsFileError, RunConfigError)
        if not isinstance(error, user_errors):
            raise
        what = "malformed YAML: " if isinstance(error, YAMLError) else ""
        code = (EXIT_USAGE if isinstance(error, (ConfigError, YAMLError)) else
                EXIT_DIVERGED if isinstance(error, DivergenceError) else EXIT_ERROR)
        return _reported(args, f"error: {what}{' '.join(str(error).split())}", code)
