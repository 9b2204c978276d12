"""One command, two processes: a benchmark's JAX side and PyTorch side, joined in one table.

    python benchmarks/bench_<op>.py [--device cpu|gpu] [--torch | --no-torch] [--json out.json]

The command is a driver that never touches a GPU. It writes the inputs of every shape once, as
float32 .npy files, into a work directory, then runs the same script again once per side,
`--side torch` first and `--side jax` second, each in a fresh process. A side casts the inputs
to the benchmark's dtype, times each of its entries forward and forward+backward, and writes
its rows as JSON; the torch side also saves its forward outputs, so that the JAX side can
report its relative error against them. The driver joins the rows, adds the ratio to the
anchor entry of the same shape and the achieved TFLOP/s, prints one table and writes
everything as JSON (`--json`): benchmarks/report.py. Measuring is benchmarks/timing.py.

    entry  (name, fn, argument names) or (name, fn, argument names, reference entry name):
           fn(*arrays) -> one output array. A benchmark's list of entries is the one place
           where an implementation is added.
    row    {side, name, shape, fwd_ms, fwdbwd_ms, fwd_bytes, fwdbwd_bytes, rel_err, error}

Forward+backward is one vjp with a random output cotangent with respect to every argument
of the entry. A side that cannot run at all (PyTorch missing, no CUDA device) is skipped with
a one-line note; an entry that fails is reported in its row and the rest still run.
"""

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks import report, timing
from benchmarks.report import shape_tag

SIDES = ("torch", "jax")   # the order the driver runs them in


class SideSkipped(Exception):
    """A side that cannot run here (framework or device missing); the message says why."""


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """What a benchmark script declares; `run(benchmark)` does the rest."""

    name: str                       # "fpa": file names and the JSON's "benchmark"
    title: str                      # first line of the table
    script: str                     # the script's __file__, re-run once per side
    shapes: Callable                # args -> list of shape tuples
    make_inputs: Callable           # (shape, seed) -> {input name: float32 np.ndarray}
    jax_entries: Callable           # args -> list of entries (JAX functions)
    torch_entries: Callable         # (args, device) -> (entries, notes)
    flops: Callable                 # shape -> (forward flops, forward+backward flops)
    anchor: Callable                # args -> name of the entry ratios are taken against
    description: str = ""           # --help text (the script's docstring)
    add_arguments: Callable = lambda parser: None
    keep_float32: tuple = ()        # inputs never cast to the low-precision dtype
    shape_header: str = "shape"
    flops_note: str = ""


# ----------------------------------------------------------------------------- command line

def parse_args(benchmark: Benchmark, argv=None):
    parser = argparse.ArgumentParser(description=benchmark.description or benchmark.title,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: float32, small shapes; gpu: bf16, the shapes of docs/benchmarks.md")
    parser.add_argument("--gpu", dest="device", action="store_const", const="gpu",
                        help="same as --device gpu")
    parser.add_argument("--torch", dest="torch", action="store_true", default=None,
                        help="also run the PyTorch side (default on the GPU)")
    parser.add_argument("--no-torch", dest="torch", action="store_false",
                        help="JAX side only")
    parser.add_argument("--json", type=Path, default=None, help="write all numbers here")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="inputs and outputs exchanged by the sides (default: a temporary "
                             "directory, removed at the end)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per measurement (default 5 on CPU, 30 on GPU)")
    parser.add_argument("--calls-per-sample", type=int, default=1,
                        help="back-to-back calls per timed sample, one synchronisation at its "
                             "end (both sides; 1: every call synchronised alone)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed calls first (default 1 on CPU, 3 on GPU)")
    parser.add_argument("--anchor", default=None, help="entry that ratios are taken against")
    parser.add_argument("--memory-limit-gib", "--dense-limit-gib", dest="memory_limit_gib",
                        type=float, default=12.0,
                        help="JAX side: skip timing a program whose compiled peak exceeds this")
    parser.add_argument("--side", choices=SIDES, default=None, help=argparse.SUPPRESS)
    benchmark.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.torch is None:
        args.torch = args.device == "gpu"
    if args.repeats is None:
        args.repeats = 30 if args.device == "gpu" else 5
    if args.warmup is None:
        args.warmup = 3 if args.device == "gpu" else 1
    if args.anchor is None:
        args.anchor = benchmark.anchor(args)
    return args


# ----------------------------------------------------------------------------- JAX side

def _cotangent(jax, fn, call_args):
    shape = jax.eval_shape(fn, *call_args)
    return jax.random.normal(jax.random.PRNGKey(7), shape.shape, shape.dtype)


def _jax_row(entry, inputs, args, outputs, references, work_dir, tag):
    import jax

    name, fn, arg_names = entry[:3]
    reference = entry[3] if len(entry) > 3 else None
    call_args = [inputs[n] for n in arg_names]
    limit = args.memory_limit_gib * 2 ** 30
    forward = jax.jit(fn).lower(*call_args).compile()         # compiled once, timed as is
    row = dict(fwd_memory=timing.compiled_memory(forward))
    row["fwd_bytes"] = (row["fwd_memory"] or {}).get("peak")
    if (row["fwd_bytes"] or 0) > limit:
        row["error"] = f"not timed: compiled peak above --memory-limit-gib {args.memory_limit_gib}"
        return row
    row["fwd_ms"] = timing.jax_median_ms(forward, *call_args, warmup=args.warmup,
                                         repeats=args.repeats, calls=args.calls_per_sample)
    if name in references or reference is not None:
        out = np.asarray(forward(*call_args), np.float32)
        if name in references:
            outputs[name] = out
        row["rel_err"] = _relative_error(out, reference, outputs, work_dir, tag)
    try:  # keep the forward when only the backward cannot run (e.g. a forward-only kernel)
        row.update(_jax_backward(fn, call_args, args, limit))
    except Exception as error:
        row["error"] = f"backward: {type(error).__name__}: {error}".splitlines()[0][:300]
    return row


def _jax_backward(fn, call_args, args, limit):
    """Memory and time of forward+backward: one vjp with a random output cotangent."""
    import jax

    def forward_backward(*call_args_and_cotangent):
        *primals, cotangent = call_args_and_cotangent
        out, pullback = jax.vjp(fn, *primals)
        return out, pullback(cotangent)

    train_args = [*call_args, _cotangent(jax, fn, call_args)]
    train = jax.jit(forward_backward).lower(*train_args).compile()
    row = dict(fwdbwd_memory=timing.compiled_memory(train))
    row["fwdbwd_bytes"] = (row["fwdbwd_memory"] or {}).get("peak")
    if (row["fwdbwd_bytes"] or 0) > limit:
        row["error"] = (f"backward not timed: compiled peak above --memory-limit-gib "
                        f"{args.memory_limit_gib}")
        return row
    row["fwdbwd_ms"] = timing.jax_median_ms(train, *train_args, warmup=args.warmup,
                                            repeats=args.repeats, calls=args.calls_per_sample)
    return row


def _relative_error(out, reference, outputs, work_dir, tag):
    """||out - ref|| / ||ref|| against an earlier entry of this side or a torch output."""
    if reference is None:
        return None
    expected = outputs.get(reference)
    saved = work_dir / f"{tag}_{reference}.out.npy"
    if expected is None and saved.exists():
        expected = np.load(saved)
    if expected is None or expected.shape != out.shape:
        return None
    return float(np.linalg.norm(out - expected) / max(np.linalg.norm(expected), 1e-30))


def run_jax_side(benchmark: Benchmark, args, work_dir: Path):
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    if args.device == "gpu" and device.platform != "gpu":
        raise SideSkipped(f"--device gpu, but JAX sees no GPU (its default device: {device})")
    info = dict(device=device.device_kind, platform=device.platform, jax=jax.__version__)
    if args.device == "gpu":
        # the ceiling `train bench` reads MFU against
        from train.tools.bench import matmul_ceiling_tflops

        info["matmul_tflops"] = matmul_ceiling_tflops(8192)
        print(f"[jax] bf16 8192^3 matmul: {info['matmul_tflops']:.0f} TFLOP/s", flush=True)
    low_precision = jnp.bfloat16 if args.device == "gpu" else jnp.float32
    entries = benchmark.jax_entries(args)
    references = {entry[3] for entry in entries if len(entry) > 3}
    rows = []
    for shape in benchmark.shapes(args):
        tag = shape_tag(shape)
        inputs = {name: jnp.asarray(np.load(path), jnp.float32 if name in benchmark.keep_float32
                                    else low_precision)
                  for name, path in _input_files(work_dir, tag).items()}
        outputs = {}
        for entry in entries:
            try:
                row = _jax_row(entry, inputs, args, outputs, references, work_dir, tag)
            except Exception as error:  # report it in the row; keep timing the others
                row = dict(error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
            rows.append(dict(side="jax", name=entry[0], shape=list(shape), **row))
            _print_progress("jax", rows[-1])
    return dict(info=info, rows=rows)


def _input_files(work_dir, tag):
    return {path.name[len(tag) + 1:-len(".in.npy")]: path
            for path in sorted(work_dir.glob(f"{tag}_*.in.npy"))}


# ----------------------------------------------------------------------------- PyTorch side

def run_torch_side(benchmark: Benchmark, args, work_dir: Path):
    try:
        import torch
    except ImportError as error:
        raise SideSkipped(f"PyTorch is not installed in this interpreter ({error})")
    device = "cuda" if args.device == "gpu" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SideSkipped("PyTorch sees no CUDA device")
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    info = dict(device=device_name, torch=torch.__version__)
    entries, notes = benchmark.torch_entries(args, device)
    for note in notes:
        print(f"[torch] {note}", flush=True)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for shape in benchmark.shapes(args):
        tag = shape_tag(shape)
        inputs = {key: torch.from_numpy(np.load(path)).to(
                      device, torch.float32 if key in benchmark.keep_float32 else dtype
                  ).requires_grad_(True) for key, path in _input_files(work_dir, tag).items()}
        for entry in entries:
            try:
                row = _torch_row(torch, entry, inputs, device, args, work_dir, tag)
            except Exception as error:  # report it in the row; keep timing the others
                row = dict(error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
            rows.append(dict(side="torch", name=entry[0], shape=list(shape), **row))
            _print_progress("torch", rows[-1])
    return dict(info=info, notes=notes, rows=rows)


def _torch_row(torch, entry, inputs, device, args, work_dir, tag):
    name, fn, arg_names = entry[:3]
    leaves = [inputs[n] for n in arg_names]

    def forward():
        with torch.no_grad():
            return fn(*leaves)

    out = forward()
    np.save(work_dir / f"{tag}_{name}.out.npy", out.float().cpu().numpy())
    cotangent = torch.randn_like(out)

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        fn(*leaves).backward(cotangent)

    row = dict(fwd_bytes=timing.torch_peak_bytes(forward, device))
    row["fwd_ms"] = timing.torch_median_ms(forward, device, args.warmup, args.repeats,
                                           args.calls_per_sample)
    try:
        row["fwdbwd_bytes"] = timing.torch_peak_bytes(forward_backward, device)
        row["fwdbwd_ms"] = timing.torch_median_ms(forward_backward, device, args.warmup,
                                                  args.repeats, args.calls_per_sample)
    except Exception as error:  # keep the forward when only the backward refuses
        row["error"] = f"backward: {type(error).__name__}: {error}".splitlines()[0][:300]
    finally:
        for leaf in leaves:
            leaf.grad = None
    return row


# ----------------------------------------------------------------------------- driver

def _print_progress(side, row):
    shape = tuple(row["shape"])
    if row.get("fwd_ms") is None:
        print(f"[{side}] {row['name']} {shape}: {row.get('error')}", flush=True)
        return
    fwdbwd = row.get("fwdbwd_ms")
    print(f"[{side}] {row['name']} {shape}: fwd {row['fwd_ms']:.3f} ms, fwd+bwd "
          f"{'n/a' if fwdbwd is None else f'{fwdbwd:.3f} ms'}", flush=True)


def _run_side(benchmark, args, work_dir):
    """In a side's process: run it and write <work_dir>/<side>.json."""
    runner = run_jax_side if args.side == "jax" else run_torch_side
    try:
        result = runner(benchmark, args, work_dir)
    except SideSkipped as reason:
        print(f"[{args.side}] skipped: {reason}", flush=True)
        result = dict(skipped=str(reason), rows=[])
    (work_dir / f"{args.side}.json").write_text(json.dumps(result, default=str))
    return 0


def _launch_side(benchmark, side, args, argv, work_dir):
    """Start one side in its own process; its result dict (or why it has none)."""
    env = dict(os.environ)
    if args.device == "cpu" and side == "jax":
        env["JAX_PLATFORMS"] = "cpu"
    command = [sys.executable, str(Path(benchmark.script).resolve()), *argv,
               "--side", side, "--work-dir", str(work_dir)]
    completed = subprocess.run(command, env=env)
    result_file = work_dir / f"{side}.json"
    if completed.returncode != 0 or not result_file.exists():
        return dict(failed=f"exited with status {completed.returncode} (its output is above)",
                    rows=[])
    return json.loads(result_file.read_text())


def run(benchmark: Benchmark, argv=None) -> int:
    """The script's main(): a side when --side is given, else the driver. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(benchmark, argv)
    if args.side is not None:
        return _run_side(benchmark, args, args.work_dir)

    own_work_dir = args.work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix=f"bench_{benchmark.name}_")) if own_work_dir \
        else args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        for seed, shape in enumerate(benchmark.shapes(args)):
            for name, array in benchmark.make_inputs(shape, seed).items():
                np.save(work_dir / f"{shape_tag(shape)}_{name}.in.npy",
                        np.asarray(array, np.float32))
        results = {side: _launch_side(benchmark, side, args, argv, work_dir)
                   for side in SIDES if side == "jax" or args.torch}
        rows = report.join_rows(benchmark, args, results)
        print(report.format_table(benchmark, args, results, rows), flush=True)
        report.write_json(args.json, dict(benchmark=benchmark.name, device=args.device,
                                   anchor=args.anchor, repeats=args.repeats,
                                   warmup=args.warmup, argv=argv,
                                   sides={side: {k: v for k, v in result.items() if k != "rows"}
                                          for side, result in results.items()},
                                   rows=rows))
    finally:
        if own_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    nothing_measured = not results.get("jax", {}).get("rows")
    return 1 if nothing_measured or any("failed" in r for r in results.values()) else 0
