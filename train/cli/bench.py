"""`python -m train bench CONFIG [key=value ...] [--context T] [--batch-size B]`: tokens/s, peak
memory and MFU of the train step (train/tools/bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

from train.cli import UserError
from train.cli.common import add_command_with_config, non_negative_int, positive_int, start_jax
from train.core.metrics import format_rate, format_table
from train.core.presets import load_config


def add_bench_command(commands) -> None:
    sub = add_command_with_config(commands, "bench",
                                  "tokens/s, peak memory and MFU of the train step", command_bench)
    sub.add_argument("--context", type=positive_int,
                     help="sequence length (overrides data.seq_len)")
    sub.add_argument("--batch-size", type=positive_int,
                     help="global batch (overrides data.batch_size)")
    sub.add_argument("--steps", type=positive_int, default=10,
                     help="steps per timed window (two windows; the faster counts)")
    sub.add_argument("--warmup", type=non_negative_int, default=2,
                     help="untimed steps after compiling")
    sub.add_argument("--out", help="JSON output (default: runs/bench-<config>-len<T>.json)")
    sub.add_argument("--profile", metavar="DIR",
                     help="also write a jax.profiler trace of 3 more steps to DIR")


def command_bench(args) -> int:
    overrides = list(args.overrides)
    if args.context:
        overrides.append(f"data.seq_len={args.context}")
    if args.batch_size:
        overrides.append(f"data.batch_size={args.batch_size}")
    config = load_config(args.config, overrides)
    start_jax()
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.core.runs import DEFAULT_RUNS_DIR
    from train.tools.bench import benchmark

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
        ("peak memory", f"{result['peak_memory_bytes'] / 2**30:.3f} GiB "
                        f"({result['memory_source']})"),
        ("estimate", f"{result['memory_estimate_bytes'] / 2**30:.3f} GiB (train/core/memory.py; "
                     f"{result['memory_estimate_bytes'] / result['peak_memory_bytes']:.2f} x peak)"),
        ("compile", f"{result['compile_seconds']:.1f} s"),
        ("init", f"{result['init_seconds']:.1f} s (the initial state, train.init_on)"),
        *([("profile", f"{result['profile_dir']} (TensorBoard profile plugin or Perfetto)")]
          if result["profile_dir"] else []),
        *[("  top op" if i == 0 else "", f"{100 * share:4.1f}%  {name[:60]}")
          for i, (name, share) in enumerate(result["top_ops"])],
        ("written", str(out)),
    ]))
    return 0
