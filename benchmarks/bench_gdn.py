"""Gated delta rule benchmark (`gdn_jax.ops.gated_delta_rule`), JAX and PyTorch in one table.

    python benchmarks/bench_gdn.py [--seq-lens 1024 2048] [--json out.json]
        CPU, float32, B=1 H=4 K=V=64: "gdn reference" (token-by-token scan, the anchor)
        against "gdn xla" (chunked WY form), forward and forward+backward time and compiled
        peak memory; rel err of xla against the scan.
    python benchmarks/bench_gdn.py --gpu [--no-torch] [--implementations pallas] [--json out.json]
        bf16 (g float32) at the shapes of docs/benchmarks.md: "gdn xla" against "fla chunk",
        flash-linear-attention's Triton kernel `chunk_gated_delta_rule` (the anchor), on the
        same inputs; rel err compares our forward with fla's.

fla's backward refuses to run on Hopper with Triton < 3.7.1 (its own guard against a Triton
miscompile); for timing only, the PyTorch side sets
`fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True` and says so in the table's notes.
Inputs are drawn once (NumPy, fixed seed) like the layer's: L2-normalised q and k,
g = log sigmoid(~N(3, 1)) (about -0.05), beta in (0, 1). See benchmarks/harness.py for how
the two processes run and what the table shows.
"""

import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import harness  # noqa: E402

CPU_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
GPU_SHAPES = ("4,4096,16,128", "8,2048,12,64", "1,16384,16,128")  # B, T, H, K = V
GDN_ARGS = ("q", "k", "v", "g", "beta")


def add_arguments(parser):
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(CPU_SEQ_LENS),
                        help="CPU: sequence lengths")
    parser.add_argument("--shapes", nargs="+", default=None,
                        help=f"B,T,H,D shapes with K = V = D (GPU default: {' '.join(GPU_SHAPES)})")
    parser.add_argument("--batch", type=int, default=1, help="CPU: B")
    parser.add_argument("--heads", type=int, default=4, help="CPU: H")
    parser.add_argument("--dim", type=int, default=64, help="CPU: K = V")
    parser.add_argument("--chunk-size", type=int, default=64, help="chunk of the xla path")
    parser.add_argument("--implementations", nargs="+", choices=("xla", "pallas"),
                        default=["xla", "pallas"], help="GPU: our entries to time")


def shapes(args):
    if args.shapes or args.device == "gpu":
        return [tuple(int(n) for n in shape.split(",")) for shape in args.shapes or GPU_SHAPES]
    return [(args.batch, length, args.heads, args.dim) for length in args.seq_lens]


def make_inputs(shape, seed):
    """float32 inputs like the layer's: unit q, k [B, T, H, D]; g < 0 and beta in (0, 1)."""
    batch, length, heads, _ = shape
    rng = np.random.default_rng(seed)

    def unit(x):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    per_token = (batch, length, heads)
    return dict(q=unit(rng.standard_normal(shape)), k=unit(rng.standard_normal(shape)),
                v=rng.standard_normal(shape),
                g=-np.logaddexp(0.0, -rng.normal(3.0, 1.0, per_token)),
                beta=1.0 / (1.0 + np.exp(-rng.standard_normal(per_token))))


def jax_entries(args):
    """(name, fn, argument names[, reference]): add an implementation with one line here."""
    from gdn_jax.ops import gated_delta_rule

    def output_of(implementation):
        run = functools.partial(gated_delta_rule, chunk_size=args.chunk_size,
                                implementation=implementation)
        return lambda *arrays: run(*arrays)[0]

    if args.device == "cpu":
        return [("gdn reference", output_of("reference"), GDN_ARGS),
                ("gdn xla", output_of("xla"), GDN_ARGS, "gdn reference")]
    return [(f"gdn {name}", output_of(name), GDN_ARGS, "fla chunk")
            for name in args.implementations]


def torch_entries(args, device):
    """flash-linear-attention's chunk kernel on the same inputs; (entries, notes)."""
    if device != "cuda":
        return [], ["fla chunk not run: it needs a CUDA device"]
    try:
        import fla
        import fla.ops.common.chunk_o as chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as error:  # the anchor is optional: say why it is missing
        return [], [f"fla chunk not run: flash-linear-attention not importable ({error})"]
    notes = [f"fla {fla.__version__}"]
    if hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        notes.append("set fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True (bypasses fla's "
                     "Hopper/Triton<3.7.1 backward guard; for timing only)")

    def fla_chunk(q, k, v, g, beta):
        return chunk_gated_delta_rule(q, k, v, g, beta, scale=q.shape[-1] ** -0.5,
                                      output_final_state=False)[0]

    return [("fla chunk", fla_chunk, GDN_ARGS)], notes


def chunk_flops(batch, seq_len, heads, key_dim, value_dim, chunk=64):
    """Matmul flops of one chunked forward: K K^T, Q K^T, (I + A)^{-1}, W and U, W S,
    K^T V_new, Q S, P V_new."""
    per_chunk = (4 * chunk * chunk * key_dim + 2 * chunk ** 3 // 3
                 + 2 * chunk * chunk * (key_dim + value_dim)
                 + 6 * chunk * key_dim * value_dim + 2 * chunk * chunk * value_dim)
    return per_chunk * -(-seq_len // chunk) * batch * heads


def flops(shape):
    forward = chunk_flops(*shape, shape[3])
    return forward, 3 * forward


BENCHMARK = harness.Benchmark(
    name="gdn", title="Gated delta rule", script=__file__, shapes=shapes,
    make_inputs=make_inputs, jax_entries=jax_entries, torch_entries=torch_entries, flops=flops,
    anchor=lambda args: "fla chunk" if args.device == "gpu" else "gdn reference",
    description=__doc__, add_arguments=add_arguments, keep_float32=("g",), shape_header="shape (B,T,H,K=V)",
    flops_note="TFLOP/s: the chunked form's matmul flops at chunk 64 (x3 with backward)")

if __name__ == "__main__":
    sys.exit(harness.run(BENCHMARK))
