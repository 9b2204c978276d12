"""FPA attention benchmark: the op's paths and their anchors, JAX and PyTorch, in one table.

    python benchmarks/bench_fpa.py [--lengths 512,1024] [--json out.json]
        CPU, float32, B=1 H=2 D=64, T = 512 ... 8192: "fpa reference" (dense T x T oracle,
        the anchor) against "fpa xla" (blocked, O(T * block) memory), forward and
        forward+backward time and compiled peak memory; rel err of xla against the oracle.
    python benchmarks/bench_fpa.py --device gpu [--no-torch] [--json out.json]
        bf16 at the shapes of docs/benchmarks.md: "fpa xla", "fox xla" and "cudnn sdpa"
        (jax.nn.dot_product_attention, causal: the anchor); the PyTorch side adds "torch sdpa"
        (F.scaled_dot_product_attention, causal) and "fla fox" (flash-linear-attention's FoX
        kernel) when importable. rel err compares fox xla with fla fox and cudnn with torch sdpa
        on the same inputs.

Every shape's inputs are drawn once (NumPy, fixed seed) and shared by both sides; see
benchmarks/harness.py for how the two processes run and what the table shows.
"""

import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import harness  # noqa: E402

GPU_SHAPES = [(4, 4096, 12, 64), (1, 16384, 12, 64), (8, 2048, 16, 128)]
FPA_ARGS = ("q", "k", "v", "phi", "psi", "beta")
FOX_ARGS = ("q", "k", "v", "log_forget")
SDPA_ARGS = ("q", "k", "v")


def add_arguments(parser):
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192",
                        help="CPU: sequence lengths T, comma-separated")
    parser.add_argument("--batch", type=int, default=1, help="CPU: B")
    parser.add_argument("--heads", type=int, default=2, help="CPU: H")
    parser.add_argument("--dim", type=int, default=64, help="CPU: head dim D")
    parser.add_argument("--shapes", nargs="+", default=None,
                        help="B,T,H,D shapes (override the device's defaults)")
    parser.add_argument("--block-size", type=int, default=64, help="block of the FPA xla path")


def shapes(args):
    if args.shapes:
        return [tuple(int(n) for n in shape.split(",")) for shape in args.shapes]
    if args.device == "gpu":
        return GPU_SHAPES
    return [(args.batch, int(length), args.heads, args.dim) for length in args.lengths.split(",")]


def make_inputs(shape, seed):
    """q, k, v [B, T, H, D]; phi, psi (a drifting walk plus offsets) and log_forget [B, T, H]."""
    batch, length, heads, _ = shape
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((3, *shape), dtype=np.float32)
    per_token = (batch, length, heads)
    walk = np.cumsum(0.3 * rng.standard_normal(per_token) - 0.05, axis=1)
    return dict(q=q, k=k, v=v,
                phi=walk + 0.5 * rng.standard_normal(per_token),
                psi=walk + 0.5 * rng.standard_normal(per_token),
                beta=np.ones((heads,), np.float32),
                log_forget=-np.logaddexp(0.0, -(rng.standard_normal(per_token) + 4.0)))


def jax_entries(args):
    """(name, fn, argument names[, reference]): add an implementation with one line here."""
    import jax
    from fpa_jax import fox_attention, fpa_attention

    if args.device == "cpu":
        return [
            ("fpa reference", functools.partial(fpa_attention, implementation="reference"),
             FPA_ARGS),
            ("fpa xla", functools.partial(fpa_attention, implementation="xla",
                                          block_size=args.block_size), FPA_ARGS, "fpa reference"),
        ]
    cudnn = functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation="cudnn")
    return [
        ("fpa xla", functools.partial(fpa_attention, implementation="xla",
                                      block_size=args.block_size), FPA_ARGS),
        ("fox xla", functools.partial(fox_attention, implementation="xla"), FOX_ARGS, "fla fox"),
        ("cudnn sdpa", cudnn, SDPA_ARGS, "torch sdpa"),
    ]


def torch_entries(args, device):
    """PyTorch anchors on the same [B, T, H, D] inputs; (entries, notes)."""
    import torch.nn.functional as F

    def sdpa(q, k, v):
        heads_first = [x.transpose(1, 2) for x in (q, k, v)]
        return F.scaled_dot_product_attention(*heads_first, is_causal=True).transpose(1, 2)

    entries, notes = [("torch sdpa", sdpa, SDPA_ARGS)], []
    if device != "cuda":
        notes.append("fla fox not run: it needs a CUDA device")
        return entries, notes
    try:
        import fla
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except Exception as error:  # an optional anchor: say why it is missing
        notes.append(f"fla fox not run: flash-linear-attention not importable ({error})")
        return entries, notes
    notes.append(f"fla {fla.__version__}")
    entries.append(("fla fox", parallel_forgetting_attn, FOX_ARGS))
    return entries, notes


def flops(shape):
    """Causal attention: 2 matmuls of 2 B H T^2 D / 2 flops forward; backward adds 2.5x."""
    batch, length, heads, dim = shape
    forward = 2 * 2 * batch * heads * length * length * dim / 2
    return forward, 3.5 * forward


BENCHMARK = harness.Benchmark(
    name="fpa", title="FPA attention", script=__file__, shapes=shapes, make_inputs=make_inputs,
    jax_entries=jax_entries, torch_entries=torch_entries, flops=flops,
    anchor=lambda args: "cudnn sdpa" if args.device == "gpu" else "fpa reference",
    description=__doc__, add_arguments=add_arguments, keep_float32=("phi", "psi", "beta", "log_forget"),
    shape_header="shape (B,T,H,D)",
    flops_note="TFLOP/s: causal attention's 2 B H T^2 D forward flops (x3.5 with backward)")

if __name__ == "__main__":
    sys.exit(harness.run(BENCHMARK))
