"""Benchmark of the gated delta rule ops (`gdn_jax.ops.gated_delta_rule`).

CPU mode (default): token-by-token oracle ("reference") vs chunked WY form ("xla"), float32,
B=1, H=4, K=V=64, T in 1024..16384: forward and forward+backward wall time (median of
`--repeats` runs after warm-up, `block_until_ready`) and XLA's compiled memory analysis
(scratch bytes of the compiled program, i.e. the peak of intermediates and residuals).

    python benchmarks/bench_gdn.py --json out/gdn_cpu.json

GPU mode (`--gpu`): the chunked XLA path in bf16 (g float32) at the shapes of
BENCHMARKS.md, forward and forward+backward, against flash-linear-attention's Triton kernel
`fla.ops.gated_delta_rule.chunk_gated_delta_rule` on the same inputs. Inputs are drawn with
NumPy (fixed seed) and saved as .npy; the PyTorch part runs first, in its own process
(`--torch`, started by this script) so the two frameworks never share the GPU. It times with
CUDA events and saves fla's forward output, from which the JAX part reports the relative
error of its own forward. fla's backward refuses to run on Hopper with Triton < 3.7.1; for
timing only, the torch part sets `fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True` and says so.
A bf16 8192^3 matmul measured in the same run gives the ceiling for the achieved TFLOP/s.

    python benchmarks/bench_gdn.py --gpu --json out/gdn_gpu.json [--no-torch]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))   # run as a script from anywhere: find gdn_jax
CPU_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
GPU_SHAPES = ("4,4096,16,128", "8,2048,12,64", "1,16384,16,128")  # B, T, H, K = V
INPUT_NAMES = ("q", "k", "v", "g", "beta", "d_out")


# ----------------------------------------------------------------------------- inputs

def make_inputs(batch, seq_len, heads, dim, seed):
    """float32 NumPy inputs like the layer's: L2-normalised q, k; g < 0; beta in (0, 1)."""
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    shape = (batch, seq_len, heads, dim)
    gate_logits = rng.normal(3.0, 1.0, (batch, seq_len, heads)).astype(np.float32)
    return dict(
        q=unit(shape), k=unit(shape),
        v=rng.standard_normal(shape, dtype=np.float32),
        g=-np.logaddexp(0.0, -gate_logits).astype(np.float32),          # log sigmoid, ~ -0.05
        beta=(1.0 / (1.0 + np.exp(-rng.standard_normal((batch, seq_len, heads)))))
        .astype(np.float32),
        d_out=rng.standard_normal(shape, dtype=np.float32),
    )


def shape_name(shape):
    batch, seq_len, heads, dim = shape
    return f"B{batch}_T{seq_len}_H{heads}_D{dim}"


def chunk_flops(batch, seq_len, heads, key_dim, value_dim, chunk=64):
    """Matmul FLOPs of one chunked forward: K K^T, Q K^T, (I + A)^{-1}, W and U, W S,
    K^T V_new, Q S, P V_new."""
    per_chunk = (4 * chunk * chunk * key_dim + 2 * chunk ** 3 // 3
                 + 2 * chunk * chunk * (key_dim + value_dim)
                 + 6 * chunk * key_dim * value_dim + 2 * chunk * chunk * value_dim)
    return per_chunk * -(-seq_len // chunk) * batch * heads


# ----------------------------------------------------------------------------- JAX side

def _jax_modules():
    """JAX is imported only in the JAX process, never in the PyTorch one."""
    import jax
    import jax.numpy as jnp
    from gdn_jax.ops import gated_delta_rule
    return jax, jnp, gated_delta_rule


def _jax_programs(implementation, chunk_size):
    """Jitted forward and forward+backward (vjp with a given output cotangent)."""
    jax, _, gated_delta_rule = _jax_modules()

    def forward(q, k, v, g, beta):
        return gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size,
                                implementation=implementation)[0]

    def forward_backward(q, k, v, g, beta, d_out):
        out, pullback = jax.vjp(forward, q, k, v, g, beta)
        return out, pullback(d_out)

    return jax.jit(forward), jax.jit(forward_backward)


def _time_jax(function, args, repeats, warmup):
    jax, _, _ = _jax_modules()
    for _ in range(warmup):
        jax.block_until_ready(function(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(function(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _memory(function, args):
    """Compiled memory analysis in bytes (None where the backend gives none)."""
    stats = function.lower(*args).compile().memory_analysis()
    if stats is None:
        return None
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "alias_size_in_bytes", "generated_code_size_in_bytes")
    return {field: int(getattr(stats, field)) for field in fields if hasattr(stats, field)}


def _jax_arrays(inputs, low_precision):
    """Device arrays: q, k, v, beta, d_out in bf16 (GPU) or float32; g always float32."""
    _, jnp, _ = _jax_modules()
    dtype = jnp.bfloat16 if low_precision else jnp.float32
    return {name: jnp.asarray(x, jnp.float32 if name == "g" else dtype)
            for name, x in inputs.items()}


def run_cpu(args):
    jax, _, _ = _jax_modules()
    results = []
    print(f"device: {jax.devices()[0].device_kind}; B={args.batch} H={args.heads} "
          f"K=V={args.dim} chunk={args.chunk_size}; median of {args.repeats} runs")
    for seq_len in args.seq_lens:
        inputs = _jax_arrays(make_inputs(args.batch, seq_len, args.heads, args.dim, seed=seq_len),
                             low_precision=False)
        forward_args = [inputs[name] for name in INPUT_NAMES[:5]]
        train_args = forward_args + [inputs["d_out"]]
        for implementation in ("reference", "xla"):
            forward, forward_backward = _jax_programs(implementation, args.chunk_size)
            row = dict(seq_len=seq_len, implementation=implementation,
                       forward_memory=_memory(forward, forward_args),
                       train_memory=_memory(forward_backward, train_args),
                       forward_ms=_time_jax(forward, forward_args, args.repeats, args.warmup),
                       train_ms=_time_jax(forward_backward, train_args, args.repeats, args.warmup))
            results.append(row)
            print(f"  T={seq_len:6d} {implementation:9s} fwd {row['forward_ms']:9.2f} ms   "
                  f"fwd+bwd {row['train_ms']:9.2f} ms", flush=True)

    def mib(memory):
        return f"{memory['temp_size_in_bytes'] / 2**20:10.1f}" if memory else f"{'n/a':>10s}"

    print("\n      T  implementation   fwd ms   fwd+bwd ms   fwd temp MiB   fwd+bwd temp MiB")
    print("(ms: median wall time; temp: XLA scratch of the compiled program, i.e. its peak of "
          "intermediates and autodiff residuals beyond inputs and outputs)")
    for row in results:
        print(f"{row['seq_len']:7d}  {row['implementation']:14s} {row['forward_ms']:8.2f} "
              f"{row['train_ms']:12.2f}   {mib(row['forward_memory'])}   "
              f"{mib(row['train_memory'])}")
    return dict(mode="cpu", device=jax.devices()[0].device_kind, batch=args.batch,
                heads=args.heads, dim=args.dim, chunk_size=args.chunk_size,
                repeats=args.repeats, results=results)


def _matmul_ceiling_tflops(repeats, warmup):
    jax, jnp, _ = _jax_modules()
    size = 8192
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.bfloat16)
    matmul = jax.jit(lambda x, y: x @ y)
    milliseconds = _time_jax(matmul, (a, a), repeats, warmup)
    return 2 * size ** 3 / (milliseconds * 1e-3) / 1e12


def run_gpu(args, work_dir, torch_results):
    jax, _, _ = _jax_modules()
    ceiling = _matmul_ceiling_tflops(args.repeats, args.warmup)
    print(f"device: {jax.devices()[0].device_kind}; bf16 8192^3 matmul: {ceiling:.0f} TFLOP/s")
    forward, forward_backward = _jax_programs("xla", args.chunk_size)
    results = []
    for shape in args.shapes:
        name = shape_name(shape)
        inputs = _jax_arrays({n: np.load(work_dir / f"{name}_{n}.npy") for n in INPUT_NAMES},
                             low_precision=True)
        forward_args = [inputs[n] for n in INPUT_NAMES[:5]]
        train_args = forward_args + [inputs["d_out"]]
        row = dict(shape=shape, name=name,
                   forward_ms=_time_jax(forward, forward_args, args.repeats, args.warmup),
                   train_ms=_time_jax(forward_backward, train_args, args.repeats, args.warmup),
                   forward_memory=_memory(forward, forward_args),
                   train_memory=_memory(forward_backward, train_args))
        reference_path = work_dir / f"{name}_fla_out.npy"
        if reference_path.exists():
            ours = np.asarray(forward(*forward_args), np.float32)
            theirs = np.load(reference_path)
            row["relative_error_vs_fla"] = float(np.linalg.norm(ours - theirs)
                                                 / np.linalg.norm(theirs))
        row["fla"] = torch_results.get(name, {})
        flops = chunk_flops(*shape, shape[3], chunk=args.chunk_size)
        row["forward_tflops"] = flops / (row["forward_ms"] * 1e-3) / 1e12
        row["train_tflops"] = 3 * flops / (row["train_ms"] * 1e-3) / 1e12   # backward ~ 2x fwd
        results.append(row)
        print(f"  {name}: fwd {row['forward_ms']:.3f} ms, fwd+bwd {row['train_ms']:.3f} ms",
              flush=True)

    def ratio(ours, theirs):
        return f"{ours / theirs:7.2f}" if theirs else f"{'n/a':>7s}"

    def number(value, spec, width):
        return format(value, spec) if value is not None else "n/a".rjust(width)

    print("\nGDN chunk, bf16, ours = gdn_jax xla path, fla = chunk_gated_delta_rule (Triton)")
    print(f"{'shape (B,T,H,K=V)':22s} {'ours fwd':>8s} {'fla fwd':>8s} {'ratio':>7s} "
          f"{'ours f+b':>8s} {'fla f+b':>8s} {'ratio':>7s} {'rel err':>9s} "
          f"{'TFLOP/s':>8s} {'% ceil':>6s}")
    for row in results:
        fla = row["fla"]
        print(f"{str(tuple(row['shape'])):22s} {row['forward_ms']:8.3f} "
              f"{number(fla.get('forward_ms'), '8.3f', 8)} "
              f"{ratio(row['forward_ms'], fla.get('forward_ms'))} "
              f"{row['train_ms']:8.3f} {number(fla.get('train_ms'), '8.3f', 8)} "
              f"{ratio(row['train_ms'], fla.get('train_ms'))} "
              f"{number(row.get('relative_error_vs_fla'), '9.2e', 9)} "
              f"{row['forward_tflops']:8.1f} {100 * row['forward_tflops'] / ceiling:6.1f}")
    print("ms = median wall time; ratio = ours / fla; TFLOP/s = our forward's matmul FLOPs per "
          "second; % ceil = that over the bf16 matmul rate")
    if any(row["fla"].get("train_error") for row in results):
        print("fla backward failed for some shapes; see 'train_error' in the JSON")
    return dict(mode="gpu", device=jax.devices()[0].device_kind, chunk_size=args.chunk_size,
                repeats=args.repeats, matmul_ceiling_tflops=ceiling, results=results,
                fla_notes=torch_results.get("_notes", []))


# ----------------------------------------------------------------------------- PyTorch side

def run_torch(args, work_dir):
    """Time fla's chunk_gated_delta_rule on the saved inputs; save its forward outputs."""
    import fla
    import fla.ops.common.chunk_o as chunk_o
    import torch
    import triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    notes = [f"torch {torch.__version__}, triton {triton.__version__}, fla {fla.__version__}, "
             f"{torch.cuda.get_device_name()}"]
    if hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        notes.append("set fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True before the backward "
                     "(bypasses fla's Hopper/Triton<3.7.1 guard; for timing only)")
    else:
        notes.append("fla.ops.common.chunk_o has no TRITON_ABOVE_3_7_1: backward run as shipped")
    for note in notes:
        print(f"[torch] {note}", flush=True)

    def cuda_time(function):
        for _ in range(args.warmup):
            function()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    results = {"_notes": notes}
    for shape in args.shapes:
        name = shape_name(shape)
        loaded = {n: torch.from_numpy(np.load(work_dir / f"{name}_{n}.npy")).cuda()
                  for n in INPUT_NAMES}
        q, k, v, beta, d_out = (loaded[n].to(torch.bfloat16)
                                for n in ("q", "k", "v", "beta", "d_out"))
        g = loaded["g"]                                                   # float32 gate
        scale = shape[3] ** -0.5
        row = {}
        with torch.no_grad():
            def forward():
                return chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, scale=scale,
                                              output_final_state=False)[0]
            np.save(work_dir / f"{name}_fla_out.npy", forward().float().cpu().numpy())
            row["forward_ms"] = cuda_time(forward)
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]

        def forward_backward():
            for leaf in leaves:
                leaf.grad = None
            out = chunk_gated_delta_rule(*leaves, scale=scale, output_final_state=False)[0]
            out.backward(d_out)

        try:
            row["train_ms"] = cuda_time(forward_backward)
        except Exception as error:  # report the forward even if fla's backward refuses
            row["train_ms"], row["train_error"] = None, f"{type(error).__name__}: {error}"
        results[name] = row
        print(f"[torch] {name}: fwd {row['forward_ms']:.3f} ms, fwd+bwd {row['train_ms']}",
              flush=True)
    return results


# ----------------------------------------------------------------------------- driver

def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write all numbers here")
    parser.add_argument("--gpu", action="store_true", help="GPU mode (bf16, BENCHMARKS.md shapes)")
    parser.add_argument("--torch", action="store_true",
                        help="internal: the PyTorch/fla part, run in a separate process")
    parser.add_argument("--no-torch", action="store_true", help="GPU mode without the fla part")
    parser.add_argument("--work-dir", type=Path, help="where inputs and fla outputs go (.npy)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(CPU_SEQ_LENS),
                        help="CPU mode: sequence lengths")
    parser.add_argument("--shapes", nargs="+", default=list(GPU_SHAPES),
                        help="GPU mode: B,T,H,D shapes (K = V = D)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64, help="K = V")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (CPU), 30 (GPU)")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 30 if (args.gpu or args.torch) else 5
    args.shapes = [tuple(int(x) for x in shape.split(",")) for shape in args.shapes]
    return args


def write_json(path, payload):
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}")


def main():
    args = parse_args()
    if args.torch:
        write_json(args.json, run_torch(args, args.work_dir))
        return
    if not args.gpu:
        write_json(args.json, run_cpu(args))
        return

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_gdn_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    for seed, shape in enumerate(args.shapes):
        for name, array in make_inputs(*shape, seed=seed).items():
            np.save(work_dir / f"{shape_name(shape)}_{name}.npy", array)
    torch_results = {}
    if not args.no_torch:
        # Before JAX touches the GPU: the two frameworks run one after the other.
        torch_json = work_dir / "fla.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--torch",
                   "--work-dir", str(work_dir), "--json", str(torch_json),
                   "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                   "--shapes", *[",".join(map(str, shape)) for shape in args.shapes]]
        completed = subprocess.run(command, env=dict(os.environ))
        if completed.returncode == 0 and torch_json.exists():
            torch_results = json.loads(torch_json.read_text())
        else:
            print(f"fla part failed (exit {completed.returncode}); reporting ours only")
    write_json(args.json, run_gpu(args, work_dir, torch_results))


if __name__ == "__main__":
    main()
