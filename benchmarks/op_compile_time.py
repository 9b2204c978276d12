"""How long one attention op's forward+backward takes to trace, lower and compile, and how much
of FPA's compile is its XLA field passes alone.

    python benchmarks/op_compile_time.py [--shape 8,2048,12,64] [--ops fpa,fox,softmax,fields]

For each op ("pallas" kernels, bf16, one jitted vjp with a random cotangent for every
differentiable input, as benchmarks/op_trace.py): seconds to trace, lower (the kernels' MLIR
is built here, in Python) and compile (XLA's passes, the Mosaic GPU kernels' own compile and
ptxas). `fields` is FPA's field statistics and the field-gradient spreads alone
(mixer_kernels/mosaic_gpu/attention/fields.py: statistics and field_gradient, formed by
FIELD_PASSES; no attention kernel), so fpa - fox - fields is roughly what FPA's
attention kernels add over FoX's. Every op is compiled in a fresh
process, so no kernel compiled for one op is reused by the next. Prints a table.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fields_inputs(shape, rng):
    """phi [B, H, T] and the kernels' shares: per block [B, H, nb, 2 Lv, n], gap totals
    [B, H, nb, nb]."""
    import jax.numpy as jnp

    from mixer_kernels.mosaic_gpu.attention import fields
    from mixer_kernels.mosaic_gpu.attention.backward import BLOCK

    batch, length, heads, _ = shape
    levels = fields.num_levels(BLOCK)
    draw = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    nb = length // BLOCK
    return (draw(batch, heads, length), draw(batch, heads, nb, 2 * levels, BLOCK),
            draw(batch, heads, nb, nb))


def fields_function(phi, shares, gap_total):
    """The field statistics and the field gradient alone (no attention kernel; by
    FIELD_PASSES: the field kernels or FPA's XLA passes)."""
    from mixer_kernels.mosaic_gpu.attention import fields
    from mixer_kernels.mosaic_gpu.attention.backward import BLOCK

    stats = fields.statistics(phi, BLOCK, 1.0)
    return fields.field_gradient(shares, gap_total, phi, BLOCK, 1.0, stats)


def time_one(op, shape):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.op_trace import attention_inputs, op_function

    rng = np.random.default_rng(0)
    if op == "fields":
        jitted, inputs = jax.jit(fields_function), fields_inputs(shape, rng)
    else:
        inputs, _ = attention_inputs(op, shape, "walk", rng)
        fn = op_function(op)
        out_shape = jax.eval_shape(fn, *inputs)
        cotangent = jnp.asarray(rng.standard_normal(out_shape.shape), out_shape.dtype)
        jitted = jax.jit(lambda cotangent, *a: jax.vjp(fn, *a)[1](cotangent))
        inputs = (cotangent, *inputs)
    started = time.perf_counter()
    traced = jitted.trace(*inputs)
    traced_at = time.perf_counter()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    jax.block_until_ready(compiled(*inputs))
    return {"op": op, "trace_s": traced_at - started, "lower_s": lowered_at - traced_at,
            "compile_s": compiled_at - lowered_at, "hlo_chars": len(lowered.as_text())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="8,2048,12,64", help="B,T,H,D")
    parser.add_argument("--ops", default="softmax,fox,fpa,fields")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    if args.one:
        print(json.dumps(time_one(args.one, shape)))
        return
    rows = []
    for op in args.ops.split(","):
        done = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--one", op],
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"forward+backward compile at {args.shape} (seconds)")
    print("| op | trace | lower | compile | HLO chars |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['trace_s']:.2f} | {r['lower_s']:.2f} | {r['compile_s']:.2f} "
              f"| {r['hlo_chars']} |")


if __name__ == "__main__":
    main()
