"""Multi-GPU readiness of the trainer on one host: throughput scaling, loss agreement with one
device, and a checkpoint saved on N devices restored on one.

    python benchmarks/multi_gpu.py [--config softmax_rope_125m] [--devices N] [--context 2048]
        [--batch-per-device 8] [--context-devices C] [--steps 10] [--loss-steps 4] [--out DIR]
        [key=value ...]

One process drives the first N local devices (default: all). Layouts, each a mesh
data x fsdp x tensor x context:
    data parallel      N x 1 x 1 x 1
    fsdp x tensor      1 x N/2 x 2 x 1                    (N even)
    context parallel   N/C x 1 x 1 x C, C = --context-devices (default N: data 1, every sequence
                       split into N stretches of T/N tokens, the long-context layout); N >= 2,
                       and only for presets whose mixers all have a context-parallel op (the
                       config refuses the others, and T not divisible by C: the table then says
                       the layout is skipped and why)
The same random token batches (fixed seed, two documents per row) feed every layout; the train
state starts from the same initial values (drawn once on one device, then placed on each
layout's shardings).

    tokens/s      steps timed after one warm-up step. data parallel, fsdp x tensor: weak scaling,
                  one device runs b rows of T tokens (b = --batch-per-device), the layout N b rows.
                  context parallel: the same b x T batch as one device (splitting each sequence
                  is for sequences too long for one device, not for more rows)
    scaling       tokens/s(N) / (N * tokens/s(1)): 100% is ideal for every layout
    speed ratio   tokens/s(N) / tokens/s(1), shown for context parallel: how much faster N
                  devices run one device's batch (ideal N; below 1 the split costs more in ring
                  exchanges than it saves)
    loss agree    max over the first --loss-steps steps of |loss_N - loss_1| on the same global
                  batches (N b rows, every layout); "ok" when below --loss-tol
    restore on 1  a checkpoint of the N-device state after those steps is saved, restored onto
                  one device, and both continue for 2 steps: max |loss difference| (--loss-tol)

Prints a table and writes DIR/multi_gpu-<config>-<N>dev.json (DIR default: runs/); a skipped
layout is listed under "skipped" with the config's reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import jax  # noqa: E402
import numpy as np  # noqa: E402

from train.checkpoint.manager import Checkpointer  # noqa: E402
from train.core.config import Config, ConfigError  # noqa: E402
from train.core.metrics import format_rate, format_table  # noqa: E402
from train.core.presets import load_config  # noqa: E402
from train.core.session import build_session, to_global  # noqa: E402
from train.core.sharding import make_mesh, mesh_context  # noqa: E402
from train.core.validation import validate, validate_for_devices  # noqa: E402
from train.data.tokenizer import load_tokenizer  # noqa: E402

CONTINUED_STEPS = 2
CONTEXT_LAYOUT = "context parallel"


class UsageError(ValueError):
    """A bad command-line value: printed as one `error:` line."""


def layouts(devices: int) -> dict[str, tuple[int, int, int]]:
    """The weak-scaling meshes (data, fsdp, tensor) compared against one device."""
    found = {"data parallel": (devices, 1, 1)}
    if devices >= 2 and devices % 2 == 0:
        found["fsdp x tensor"] = (1, devices // 2, 2)
    return found


def context_layout(config: Config, devices: int, context: int) -> tuple[Config, tuple[int, ...]]:
    """`config` on mesh data devices / context x fsdp 1 x tensor 1 x context, and those four
    sizes; ConfigError when the preset cannot split its sequences (a mixer without a
    context-parallel op, data.seq_len not divisible by `context`)."""
    mesh = dataclasses.replace(config.mesh, data=devices // context, fsdp=1, tensor=1,
                               context=context)
    config = dataclasses.replace(config, mesh=mesh)
    validate(config)
    return config, validate_for_devices(config, devices)


def random_batches(count: int, rows: int, seq_len: int, vocab: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        cut = rng.integers(1, seq_len, rows)
        batches.append({"tokens": rng.integers(0, vocab, (rows, seq_len + 1), dtype=np.int32),
                        "segment_ids": np.where(np.arange(seq_len + 1)[None] < cut[:, None],
                                                1, 2).astype(np.int32)})
    return batches


def run_steps(session, state, batches):
    losses = []
    with mesh_context(session.mesh):
        for batch in batches:
            state, metrics = session.train_step(state, to_global(session, batch))
            losses.append(float(metrics["loss"]))
    return state, losses


def tokens_per_second(session, initial, batch, steps: int) -> float:
    with mesh_context(session.mesh):
        state = jax.device_put(initial, session.state_shardings)
        batch = to_global(session, batch)
        state, metrics = session.train_step(state, batch)
        jax.block_until_ready((state, metrics))
        started = time.perf_counter()
        for _ in range(steps):
            state, metrics = session.train_step(state, batch)
        jax.block_until_ready((state, metrics))
    rows, seq_len = batch["tokens"].shape[0], batch["tokens"].shape[1] - 1
    return rows * seq_len * steps / (time.perf_counter() - started)


def check_context_devices(context: int, devices: int, batch_per_device: int) -> None:
    """UsageError unless C >= 2 divides N and the data axis N / C divides the b timed rows."""
    if context < 2 or devices % context or batch_per_device % (devices // context):
        raise UsageError(f"--context-devices {context}: expected a divisor >= 2 of the {devices} "
                         f"devices whose quotient (the data axis) divides --batch-per-device "
                         f"{batch_per_device}")


def measure(config, *, devices: int, batch_per_device: int, steps: int, loss_steps: int,
            loss_tol: float, context_devices: int = 0, seed: int = 0) -> dict:
    """The table's numbers (module docstring); context_devices 0 means all `devices`."""
    if not 1 <= devices <= jax.local_device_count():
        raise UsageError(f"--devices {devices}: expected 1..{jax.local_device_count()} (the "
                         f"local devices)")
    if loss_steps < 1 or steps < 1 or batch_per_device < 1:
        raise UsageError(f"--steps, --loss-steps and --batch-per-device must be >= 1, got "
                         f"{steps}, {loss_steps}, {batch_per_device}")
    context = context_devices or devices
    if devices >= 2 or context_devices:
        check_context_devices(context, devices, batch_per_device)
    vocab = config.model.vocab_size or load_tokenizer(config.data.tokenizer).vocab_size
    seq_len = config.data.seq_len
    local = jax.local_devices()
    one = build_session(config, vocab, make_mesh((1, 1, 1), local[:1]))
    with mesh_context(one.mesh):
        initial = jax.device_get(one.init_state())
    global_rows = devices * batch_per_device
    batches = random_batches(loss_steps + CONTINUED_STEPS, global_rows, seq_len, vocab, seed)
    _, reference = run_steps(one, jax.device_put(initial, one.state_shardings),
                             batches[:loss_steps])
    small = random_batches(1, batch_per_device, seq_len, vocab, seed + 1)[0]
    single_rate = tokens_per_second(one, initial, small, steps)
    result = {"config": config.name, "platform": local[0].platform,
              "device": local[0].device_kind, "devices": devices, "seq_len": seq_len,
              "batch_per_device": batch_per_device, "steps": steps, "loss_steps": loss_steps,
              "loss_tol": loss_tol, "one_device": {"tokens_per_second": single_rate,
                                                   "losses": reference},
              "layouts": {}, "skipped": {}}
    big = random_batches(1, global_rows, seq_len, vocab, seed + 2)[0]
    plans = [(name, config, sizes, big) for name, sizes in layouts(devices).items()]
    if devices >= 2:
        try:
            plans.append((CONTEXT_LAYOUT, *context_layout(config, devices, context), small))
        except ConfigError as error:
            result["skipped"][CONTEXT_LAYOUT] = str(error)
    for name, layout_config, sizes, timed in plans:
        session = build_session(layout_config, vocab, make_mesh(sizes, local[:devices]))
        state, losses = run_steps(session, jax.device_put(initial, session.state_shardings),
                                  batches[:loss_steps])
        with tempfile.TemporaryDirectory() as directory:
            with Checkpointer(directory, save_interval_steps=1, async_save=False) as checkpointer:
                checkpointer.save(loss_steps, state=state)
                restored = checkpointer.restore_latest(one.abstract_state)
        _, continued = run_steps(session, state, batches[loss_steps:])
        _, continued_on_one = run_steps(one, restored.state, batches[loss_steps:])
        rate = tokens_per_second(session, initial, timed, steps)
        loss_gap = float(np.max(np.abs(np.subtract(losses, reference))))
        restore_gap = float(np.max(np.abs(np.subtract(continued_on_one, continued))))
        result["layouts"][name] = {
            "mesh": {"data": sizes[0], "fsdp": sizes[1], "tensor": sizes[2],
                     "context": sizes[3] if len(sizes) > 3 else 1},
            "timed_rows": timed["tokens"].shape[0], "tokens_per_second": rate,
            "scaling": rate / (devices * single_rate), "speed_ratio": rate / single_rate,
            "losses": losses, "max_loss_difference": loss_gap,
            "losses_agree": loss_gap < loss_tol,
            "restored_step": restored.step, "continued_losses": continued,
            "continued_on_one_device": continued_on_one,
            "max_restore_difference": restore_gap, "restore_agrees": restore_gap < loss_tol,
        }
    return result


def table(result: dict) -> str:
    rows = [("config", result["config"]),
            ("devices", f"{result['devices']} x {result['device']} ({result['platform']})"),
            ("context x batch/device", f"{result['seq_len']} x {result['batch_per_device']}"),
            ("1 device", f"{format_rate(result['one_device']['tokens_per_second'])} tokens/s")]
    for name, layout in result["layouts"].items():
        mesh = layout["mesh"]
        if name == CONTEXT_LAYOUT:
            speed = (f"speed ratio {layout['speed_ratio']:.2f}x of 1 device on its "
                     f"{layout['timed_rows']} x {result['seq_len']} batch, ideal "
                     f"{result['devices']}x")
        else:
            speed = f"scaling {100 * layout['scaling']:.0f}% of {result['devices']} x 1"
        rows += [
            (name, f"data {mesh['data']} x fsdp {mesh['fsdp']} x tensor {mesh['tensor']} x "
                   f"context {mesh['context']}"),
            ("  tokens/s", f"{format_rate(layout['tokens_per_second'])} ({speed})"),
            ("  loss vs 1 device", f"max |diff| {layout['max_loss_difference']:.2e} over "
                                   f"{result['loss_steps']} steps "
                                   f"({'ok' if layout['losses_agree'] else 'DIFFERS'})"),
            ("  restored on 1", f"step {layout['restored_step']}: max |diff| "
                                f"{layout['max_restore_difference']:.2e} over "
                                f"{CONTINUED_STEPS} steps "
                                f"({'ok' if layout['restore_agrees'] else 'DIFFERS'})"),
        ]
    for name, reason in result["skipped"].items():
        rows.append((name, f"skipped for {result['config']}: {reason}"))
    return format_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--config", default="softmax_rope_125m")
    parser.add_argument("--devices", type=int, default=0, help="default: all local devices")
    parser.add_argument("--context", type=int, default=0, help="overrides data.seq_len")
    parser.add_argument("--batch-per-device", type=int, default=8)
    parser.add_argument("--context-devices", type=int, default=0,
                        help="context parallel layout: devices per sequence (default: all)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--loss-steps", type=int, default=4)
    parser.add_argument("--loss-tol", type=float, default=2e-2,
                        help="loss agreement tolerance (bf16 presets; use ~1e-4 in float32)")
    parser.add_argument("--out", default="runs", help="output directory")
    args = parser.parse_args(argv)
    devices = args.devices or jax.local_device_count()
    overrides = list(args.overrides) + [f"data.batch_size={devices * args.batch_per_device}"]
    if args.context:
        overrides.append(f"data.seq_len={args.context}")
    try:
        config = load_config(args.config, overrides)
        result = measure(config, devices=devices, batch_per_device=args.batch_per_device,
                         steps=args.steps, loss_steps=args.loss_steps, loss_tol=args.loss_tol,
                         context_devices=args.context_devices)
    except (ConfigError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) / f"multi_gpu-{config.name}-{devices}dev.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"written: {out}")
    agree = all(layout["losses_agree"] and layout["restore_agrees"]
                for layout in result["layouts"].values())
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
