"""How many StableHLO ops the attention ops' XLA glue adds, by source line (no GPU needed).

    python benchmarks/hlo_op_count.py [--op fpa|fox|softmax] [--shape 8,2048,12,64] [--top 25]
        [--field-passes kernels|by_level|all_levels]

Lowers the op's forward and backward programs (mixer_kernels/mosaic_gpu/attention/vjp.py, the ones a
model's layers share) for CUDA on this machine, and counts the StableHLO ops of each by the
innermost line of this repository that made them; the Mosaic GPU kernels are one custom call
each. A model's train step calls these programs once per layer, and XLA inlines every call
before compiling, so its compile grows with (ops here) x (layers).
"""

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import fpa_backward_options  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from mixer_core.padding import padded_length  # noqa: E402
from mixer_kernels.mosaic_gpu.attention import vjp  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.common import BLOCK  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"


def programs(op, shape, segments=True):
    """{name: (fn, abstract args)} of the op's forward and backward programs (with document
    ids unless segments is False)."""
    batch, length, heads, dim = shape
    half = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
    single = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    qkv = (half(*shape),) * 3
    segments = jax.ShapeDtypeStruct((batch, length), jnp.int32) if segments else None
    out_lse = (single(*shape), single(batch, heads, length))
    norms = (single(batch, heads, padded_length(length, BLOCK) // BLOCK, 3),)  # pruning norms
    dout = (half(*shape),)
    scale = dim ** -0.5
    if op == "fpa":
        static = (scale, 1.0, False, True, True)
        fields = (single(batch, length, heads),) * 2 + (single(heads),)
        return {"forward": (lambda *a: vjp._fpa_forward(*a, static), qkv + fields + (segments,)),
                "backward": (lambda *a: vjp._fpa_backward(*a, static),
                             qkv + fields + (segments,) + out_lse + norms + dout)}
    if op == "fox":
        static = (scale, True)
        gates = (single(batch, length, heads),) * 2
        return {"forward": (lambda *a: vjp._separable_forward(*a, static),
                            qkv + gates + (segments,)),
                "backward": (lambda *a: vjp._separable_backward(*a, static),
                             qkv + gates + (segments,) + out_lse + norms + dout)}
    static = (scale, True)
    return {"forward": (lambda *a: vjp._plain_forward(*a, static), qkv + (segments,)),
            "backward": (lambda *a: vjp._plain_backward(*a, static),
                         qkv + (segments,) + out_lse + dout)}


def ops_by_line(fn, args):
    """Counter {"file:line": ops} of the lowered program, and the total."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text(
        debug_info=True)
    aliases = dict(re.findall(r"^(#loc\d+) = loc\((.*)\)$", text, re.M))

    def origin(tag, depth=0):
        location = aliases.get(tag, tag)
        found = re.search(r'"' + re.escape(REPO) + r'([^"]+)":(\d+)', location)
        if found:
            return f"{found.group(1)}:{found.group(2)}"
        for inner in re.findall(r"#loc\d+", location)[:4] if depth < 30 else []:
            line = origin(inner, depth + 1)
            if ":" in line and not line.startswith("("):
                return line
        return "(no line of this repository)"

    counts = collections.Counter(
        origin(tag) for tag in re.findall(r'= "?stablehlo\.[a-z_]+.* loc\((#loc\d+)\)', text))
    return counts, sum(counts.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="fpa", choices=("fpa", "fox", "softmax"))
    parser.add_argument("--shape", default="8,2048,12,64", help="B,T,H,D")
    parser.add_argument("--top", type=int, default=25)
    fpa_backward_options.add(parser)
    args = parser.parse_args()
    fpa_backward_options.apply(args)
    shape = tuple(int(n) for n in args.shape.split(","))
    for name, (fn, abstract) in programs(args.op, shape).items():
        counts, total = ops_by_line(fn, abstract)
        print(f"{args.op} {name}: {total} StableHLO ops")
        for line, count in counts.most_common(args.top):
            print(f"  {count:5d}  {line}")


if __name__ == "__main__":
    main()
