"""Attention kernels against their anchors, JAX and PyTorch, in one command.

    python benchmarks/bench_attention.py --device gpu [--json out.json] [--no-xla]
        [--memory-lengths 16384,65536]

bf16 at the shapes of docs/benchmarks.md. JAX side: "fpa pallas", "fox pallas", "softmax
pallas" (the Mosaic GPU kernels), "cudnn sdpa" (jax.nn.dot_product_attention, causal), and the
"xla" paths "fpa xla", "fox xla", "softmax xla" (--no-xla leaves them out: they are slow).
PyTorch side (its own process, benchmarks/harness.py): "fla fox"
(fla.ops.forgetting_attn.parallel_forgetting_attn, the anchor) and "torch sdpa". rel err:
fpa pallas vs fpa xla, fox pallas vs fla fox, softmax pallas and cudnn sdpa vs torch sdpa.

Then a third process (JAX, GPU) adds, per shape, the fraction of off-diagonal tiles the
forward kernel prunes on these inputs (FPA and FoX), and the compiled peak memory and time of
"fpa pallas" forward+backward at B=1, H=12, D=64 and each of --memory-lengths (O(T): no T x T
buffer). Its table follows the main one; its rows go to <json stem>_extras.json.
Inputs as benchmarks/bench_fpa.py (drifting walk for phi, psi; forget gates near 0.98). FPA
also runs in two more field regimes: "fpa pallas fox fields" (phi = psi = cumsum log forget,
beta = 1: FoX's bias, so its rel err is against "fox pallas") and "fpa pallas flat"
(phi = psi = 0: zero bias, nothing pruned; rel err against "softmax pallas").
"""

import functools
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import bench_fpa, harness, timing  # noqa: E402

FPA_ARGS, FOX_ARGS, SDPA_ARGS = bench_fpa.FPA_ARGS, bench_fpa.FOX_ARGS, bench_fpa.SDPA_ARGS
FPA_FOX_FIELDS_ARGS = ("q", "k", "v", "fox_fields", "fox_fields", "beta")
FPA_FLAT_ARGS = ("q", "k", "v", "flat_fields", "flat_fields", "beta")


def make_inputs(shape, seed):
    """bench_fpa's inputs plus FPA's FoX-field and flat regimes."""
    import numpy as np
    x = bench_fpa.make_inputs(shape, seed)
    x["fox_fields"] = np.cumsum(x["log_forget"], axis=1)
    x["flat_fields"] = np.zeros_like(x["phi"])
    return x


def add_arguments(parser):
    parser.add_argument("--shapes", nargs="+", default=None, help="B,T,H,D shapes")
    parser.add_argument("--no-xla", dest="xla", action="store_false",
                        help="leave out the (slow) xla paths")
    parser.add_argument("--memory-lengths", default="16384,65536",
                        help="T of the fpa pallas peak-memory rows (B=1, H=12, D=64); '' for none")


def shapes(args):
    if args.shapes:
        return [tuple(int(n) for n in shape.split(",")) for shape in args.shapes]
    if args.device == "gpu":
        return bench_fpa.GPU_SHAPES
    return [(1, 256, 2, 64)]  # CPU: the kernels do not run there; rows show why


def jax_entries(args):
    import jax
    from fpa_jax import fox_attention, fpa_attention, softmax_attention

    pallas = dict(implementation="pallas")
    cudnn = functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation="cudnn")
    xla = [
        ("fpa xla", functools.partial(fpa_attention, implementation="xla"), FPA_ARGS),
        ("fox xla", functools.partial(fox_attention, implementation="xla"), FOX_ARGS),
        ("softmax xla", functools.partial(softmax_attention, implementation="xla"), SDPA_ARGS),
    ] if args.xla else []  # first: a reference must be an earlier entry
    entries = xla + [
        ("fpa pallas", functools.partial(fpa_attention, **pallas), FPA_ARGS,
         "fpa xla" if args.xla else None),
        ("fox pallas", functools.partial(fox_attention, **pallas), FOX_ARGS, "fla fox"),
        ("softmax pallas", functools.partial(softmax_attention, **pallas), SDPA_ARGS,
         "torch sdpa"),
        ("fpa pallas fox fields", functools.partial(fpa_attention, **pallas),
         FPA_FOX_FIELDS_ARGS, "fox pallas"),
        ("fpa pallas flat", functools.partial(fpa_attention, **pallas), FPA_FLAT_ARGS,
         "softmax pallas"),
        ("cudnn sdpa", cudnn, SDPA_ARGS, "torch sdpa"),
    ]
    return [entry if entry[-1] is not None else entry[:3] for entry in entries]


BENCHMARK = harness.Benchmark(
    name="attention", title="Attention kernels", script=__file__, shapes=shapes,
    make_inputs=make_inputs, jax_entries=jax_entries,
    torch_entries=bench_fpa.torch_entries, flops=bench_fpa.flops,
    anchor=lambda args: "fla fox" if args.device == "gpu" else "softmax xla",
    description=__doc__, add_arguments=add_arguments,
    keep_float32=("phi", "psi", "beta", "log_forget", "fox_fields", "flat_fields"),
    shape_header="shape (B,T,H,D)",
    flops_note="TFLOP/s: causal attention's 2 B H T^2 D forward flops (x3.5 with backward)")


# ----------------------------------------------------------------------------- extras


def run_extras(args):
    """Pruned-tile fractions per shape, and fpa pallas fwd+bwd peak memory over T."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fpa_jax import fpa_attention
    from mixer_kernels.mosaic_gpu.attention.bias import FPABias, SeparableBias
    from mixer_kernels.mosaic_gpu.attention.forward import attention_forward

    rows = []
    for seed, shape in enumerate(shapes(args)):
        x = {name: jnp.asarray(a, jnp.float32 if name in BENCHMARK.keep_float32 else jnp.bfloat16)
             for name, a in bench_fpa.make_inputs(shape, seed).items()}
        c = jnp.cumsum(x["log_forget"], axis=1)
        for name, bias in (("fpa", FPABias(x["phi"], x["psi"], x["beta"])),
                           ("fox", SeparableBias(c, c))):
            row = dict(kind="pruning", op=name, shape=list(shape))
            try:
                _, _, stats = jax.jit(lambda q, k, v, bias=bias: attention_forward(
                    q, k, v, bias, scale=shape[-1] ** -0.5, return_stats=True))(
                        x["q"], x["k"], x["v"])
                row["pruned_frac"] = float(stats["pruned_tiles"]) / max(float(stats["tiles"]), 1)
            except Exception as error:  # noqa: BLE001 - report and keep going
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            rows.append(row)
            print(row, flush=True)
    for length in (int(t) for t in args.memory_lengths.split(",") if t):
        shape = (1, length, 12, 64)
        row = dict(kind="memory", op="fpa pallas fwd+bwd", shape=list(shape))
        try:
            x = bench_fpa.make_inputs(shape, 0)
            arrays = [jnp.asarray(x[n], jnp.float32 if n in BENCHMARK.keep_float32
                                  else jnp.bfloat16) for n in FPA_ARGS]
            dout = jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.bfloat16)

            def train(*a):
                out, pullback = jax.vjp(functools.partial(fpa_attention, implementation="pallas"),
                                        *a[:-1])
                return out, pullback(a[-1])

            compiled = jax.jit(train).lower(*arrays, dout).compile()
            memory = timing.compiled_memory(compiled) or {}
            row.update(peak_mib=(memory.get("peak") or 0) / 2 ** 20,
                       temp_mib=(memory.get("temp") or 0) / 2 ** 20,
                       inputs_mib=sum(a.nbytes for a in arrays) / 2 ** 20,
                       fwdbwd_ms=timing.jax_median_ms(compiled, *arrays, dout, repeats=3))
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        rows.append(row)
        print(row, flush=True)
    return rows


def format_extras(rows):
    lines = ["", "pruned off-diagonal tiles (forward kernel, these inputs):"]
    for r in (r for r in rows if r["kind"] == "pruning"):
        lines.append(f"  {r['op']:4s} {str(tuple(r['shape'])):20s} "
                     f"{r.get('pruned_frac', float('nan')):.3f} {r.get('error', '')}")
    lines.append("fpa pallas forward+backward, B=1 H=12 D=64 (compiled peak = arguments + "
                 "outputs + scratch):")
    for r in (r for r in rows if r["kind"] == "memory"):
        get = lambda key: r.get(key, float("nan"))
        lines.append(f"  T={r['shape'][1]:6d} peak {get('peak_mib'):8.1f} MiB (scratch "
                     f"{get('temp_mib'):7.1f}, inputs {get('inputs_mib'):6.1f}) "
                     f"{get('fwdbwd_ms'):8.2f} ms {r.get('error', '')}")
    return "\n".join(lines)


def main():
    argv = sys.argv[1:]
    if "--extras" in argv:
        argv.remove("--extras")
        args = harness.parse_args(BENCHMARK, argv)
        rows = run_extras(args)
        print(format_extras(rows), flush=True)
        if args.json is not None:
            path = args.json.with_name(args.json.stem + "_extras.json")
            path.write_text(json.dumps(rows, indent=1))
            print(f"wrote {path}")
        return 0
    code = harness.run(BENCHMARK)
    args = harness.parse_args(BENCHMARK, argv)
    if args.side is None and args.device == "gpu":  # the driver: extras in their own process
        extras = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--extras"])
        code = code or extras.returncode
    return code


if __name__ == "__main__":
    sys.exit(main())
