"""FPA attention benchmark: time and peak memory of the op's paths, with anchors in the same run.

    python benchmarks/bench_fpa.py --device cpu [--json out.json]
        reference (dense) vs xla (blocked) at T = 512 ... 8192: forward and forward+backward
        median time, and the compiled program's peak memory (arguments + outputs + temporaries).
    python benchmarks/bench_fpa.py --device gpu [--json out.json] [--torch]
        bf16 shapes of BENCHMARKS.md: FPA (xla), FoX (xla), jax.nn.dot_product_attention
        (cudnn, causal) as the anchor, ratios, TFLOP/s against a bf16 matmul measured in this run.
        --torch also runs PyTorch SDPA (and fla's FoX kernel when importable) in a subprocess.

Timing: warm-up, then the median of repeated calls with block_until_ready, fresh random inputs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fpa_jax import fields, fpa_attention
from fpa_jax.baselines import fox_attention

GPU_SHAPES = [(4, 4096, 12, 64), (1, 16384, 12, 64), (8, 2048, 16, 128)]


def median_ms(fn, *args, warmup=2, repeats=10):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def peak_bytes(jitted, *args):
    stats = jitted.lower(*args).compile().memory_analysis()
    return stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes


def make_inputs(shape, dtype, seed=0):
    batch, length, heads, dim = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)
    q, k, v = (jax.random.normal(keys[i], shape, dtype) for i in range(3))
    delta = 0.3 * jax.random.normal(keys[3], (batch, length, heads)) - 0.05
    phi, psi = fields(delta, 0.5 * jax.random.normal(keys[4], delta.shape), 0.5 * jax.random.normal(keys[5], delta.shape))
    return q, k, v, phi, psi, jnp.ones((heads,), jnp.float32)


def fpa_programs(implementation, **kw):
    forward = jax.jit(lambda *a: fpa_attention(*a, implementation=implementation, **kw))
    loss = lambda *a: fpa_attention(*a, implementation=implementation, **kw).astype(jnp.float32).sum()
    backward = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5)))
    return forward, backward


def bench_cpu(lengths, dense_limit_bytes):
    rows = []
    for length in lengths:
        args = make_inputs((1, length, 2, 64), jnp.float32)
        for implementation in ("reference", "xla"):
            forward, backward = fpa_programs(implementation)
            row = dict(impl=implementation, T=length)
            row["fwd_bytes"] = peak_bytes(forward, *args)
            row["fwdbwd_bytes"] = peak_bytes(backward, *args)
            if row["fwdbwd_bytes"] > dense_limit_bytes:
                row.update(fwd_ms=None, fwdbwd_ms=None)
            else:
                row["fwd_ms"] = median_ms(forward, *args, repeats=3)
                row["fwdbwd_ms"] = median_ms(backward, *args, repeats=3)
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    print(f"\nFPA on CPU, B=1 H=2 D=64 float32 ({jax.devices()[0].device_kind})")
    print(f"{'impl':<10}{'T':>7}{'fwd ms':>10}{'fwd+bwd ms':>12}{'fwd MiB':>10}{'fwd+bwd MiB':>13}")
    for r in rows:
        ms = lambda x: f"{x:10.1f}" if x is not None else f"{'skipped':>10}"
        print(f"{r['impl']:<10}{r['T']:>7}{ms(r['fwd_ms'])}{ms(r['fwdbwd_ms']):>12}"
              f"{r['fwd_bytes'] / 2**20:10.1f}{r['fwdbwd_bytes'] / 2**20:13.1f}")
    return rows


def matmul_tflops():
    size = 8192
    a = jax.random.normal(jax.random.PRNGKey(1), (size, size), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(2), (size, size), jnp.bfloat16)
    ms = median_ms(jax.jit(jnp.matmul), a, b, warmup=3, repeats=20)
    return 2 * size**3 / (ms * 1e-3) / 1e12


def attention_flops(shape, backward):
    batch, length, heads, dim = shape
    forward = 2 * 2 * batch * heads * length * length * dim / 2  # causal: half the tiles
    return forward * (3.5 if backward else 1.0)


def bench_gpu(block_size):
    ceiling = matmul_tflops()
    rows = []
    for shape in GPU_SHAPES:
        args = make_inputs(shape, jnp.bfloat16)
        q, k, v, phi, psi, beta = args
        log_forget = jnp.minimum(phi - phi, 0.0) - 0.02
        programs = {
            "fpa xla": (fpa_programs("xla", block_size=block_size), args),
            "fox xla": ((jax.jit(lambda q, k, v, f: fox_attention(q, k, v, f, implementation="xla")),
                         jax.jit(jax.grad(lambda q, k, v, f: fox_attention(q, k, v, f, implementation="xla").astype(jnp.float32).sum(), argnums=(0, 1, 2, 3)))),
                        (q, k, v, log_forget)),
            "cudnn sdpa": ((jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")),
                            jax.jit(jax.grad(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn").astype(jnp.float32).sum(), argnums=(0, 1, 2)))),
                           (q, k, v)),
        }
        timings = {}
        for name, ((forward, backward), inputs) in programs.items():
            try:
                timings[name] = (median_ms(forward, *inputs, warmup=3, repeats=30),
                                 median_ms(backward, *inputs, warmup=3, repeats=30))
            except Exception as error:  # report, keep benchmarking the rest
                print(f"{name} {shape}: failed: {type(error).__name__}: {error}"[:400], file=sys.stderr)
                timings[name] = (float("nan"), float("nan"))
        anchor = timings["cudnn sdpa"]
        for name, (fwd, fwdbwd) in timings.items():
            rows.append(dict(op=name, shape=shape, fwd_ms=fwd, fwdbwd_ms=fwdbwd,
                             fwd_ratio=fwd / anchor[0], fwdbwd_ratio=fwdbwd / anchor[1],
                             fwd_tflops=attention_flops(shape, False) / (fwd * 1e-3) / 1e12,
                             fwdbwd_tflops=attention_flops(shape, True) / (fwdbwd * 1e-3) / 1e12))
    print(f"\nGPU {jax.devices()[0].device_kind}; bf16 matmul ceiling {ceiling:.0f} TFLOP/s (this run)")
    print(f"{'op':<12}{'shape (B,T,H,D)':<22}{'fwd ms':>9}{'x cudnn':>9}{'fwd+bwd ms':>12}{'x cudnn':>9}{'TFLOP/s f/fb':>15}")
    for r in rows:
        print(f"{r['op']:<12}{str(r['shape']):<22}{r['fwd_ms']:9.2f}{r['fwd_ratio']:9.2f}"
              f"{r['fwdbwd_ms']:12.2f}{r['fwdbwd_ratio']:9.2f}{r['fwd_tflops']:8.0f}/{r['fwdbwd_tflops']:.0f}")
    return dict(matmul_tflops=ceiling, rows=rows)


TORCH_SCRIPT = r"""
import json, sys, torch
import torch.nn.functional as F
shapes = json.loads(sys.argv[1]); rows = []
def bench(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize(); times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); times.append(a.elapsed_time(b))
    times.sort(); return times[len(times) // 2]
try:
    from fla.ops.forgetting_attn import parallel_forgetting_attn
except Exception as e:
    parallel_forgetting_attn = None; print("fla FoX unavailable:", e, file=sys.stderr)
for B, T, H, D in shapes:
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    def fb():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()
    rows.append(dict(op="torch sdpa", shape=[B, T, H, D], fwd_ms=bench(fwd), fwdbwd_ms=bench(fb)))
    if parallel_forgetting_attn is not None:
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda") + 4).requires_grad_()
        fwd = lambda: parallel_forgetting_attn(qt, kt, vt, g)
        def fb():
            parallel_forgetting_attn(qt, kt, vt, g).float().sum().backward()
        rows.append(dict(op="fla fox", shape=[B, T, H, D], fwd_ms=bench(fwd), fwdbwd_ms=bench(fb)))
print(json.dumps(rows))
"""


def bench_torch():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    result = subprocess.run([sys.executable, "-c", TORCH_SCRIPT, json.dumps(GPU_SHAPES)],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print("torch anchors failed:\n" + result.stderr[-2000:], file=sys.stderr)
        return []
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"\nPyTorch anchors (separate process)")
    for r in rows:
        print(f"{r['op']:<12}{str(tuple(r['shape'])):<22}{r['fwd_ms']:9.2f}{r['fwdbwd_ms']:12.2f}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--dense-limit-gib", type=float, default=12.0,
                        help="skip timing a program whose compiled peak memory exceeds this")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--torch", action="store_true", help="also time PyTorch anchors (GPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.device == "cpu":
        lengths = [int(x) for x in args.lengths.split(",")]
        result = dict(cpu=bench_cpu(lengths, args.dense_limit_gib * 2**30))
    else:
        result = dict(gpu=bench_gpu(args.block_size))
        if args.torch:
            result["torch"] = bench_torch()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
