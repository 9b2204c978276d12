"""The gated delta layer's short convolution on the GPU: "pallas" against "xla".

Forward+backward time, output and gradient error of "pallas" (forward kernel; backward kernel,
XLA forms dx from its d total) against "xla".

    python benchmarks/short_conv_gpu.py [--shape 8,2048,768] [--heads 12] [--repeats 20] [--trace]

At (B, T, C) with documents of about 500 tokens, bf16 x and float32 taps (the gdn_125m
shape), with L2-normalised heads (q and k) and without (v): the median ms of a jitted
forward+backward of "xla" and of "pallas", and the relative L2 error of y, dx and d taps
against float32 ("xla" on the same rounded x). Exits 1 when "pallas" is more than 1.5x as far
from float32 as "xla" (plus 1e-3); for y the floor of "xla"'s error is float32 y rounded to
x's dtype, since neither can be closer than that. `--trace`: then each one's forward+backward
under jax.profiler, device ms per kernel (the kernel and every XLA fusion around it),
costliest first.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from gdn_jax.ops.short_conv import short_conv  # noqa: E402
from benchmarks.op_trace import device_ms_per_call  # noqa: E402


def output_fn(implementation, segment_ids, heads, x, kernel):
    """The compiled forward y in x's dtype. The cast to float32 happens outside the program:
    inside it, XLA may drop a float32 -> bf16 -> float32 round trip (excess precision) and
    report the unrounded y, which is not what the op returns."""
    def run(x, kernel):
        return short_conv(x, kernel, segment_ids, dtype=x.dtype, normalize_heads=heads,
                          implementation=implementation)
    return jax.jit(run).lower(x, kernel).compile()


def gradient_fn(implementation, segment_ids, heads, args):
    """The compiled gradients (of x and the taps) of a loss on the output."""
    def loss(x, kernel, cotangent):
        y = short_conv(x, kernel, segment_ids, dtype=x.dtype, normalize_heads=heads,
                       implementation=implementation)
        return jnp.sum(y.astype(jnp.float32).reshape(cotangent.shape) * cotangent)
    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()


def median_ms(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(1e3 * (time.perf_counter() - start))
    return float(np.median(times))


def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8,2048,768")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--trace", action="store_true", help="device ms per kernel as well")
    args = parser.parse_args()
    batch, length, channels = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, length, channels)), jnp.bfloat16)
    kernel = jnp.asarray(rng.uniform(-0.5, 0.5, (4, channels)), jnp.float32)
    cotangent = jnp.asarray(rng.standard_normal((batch, length, channels)), jnp.float32)
    segment_ids = jnp.asarray(np.cumsum(rng.random((batch, length)) < 1 / 500, axis=1),
                              jnp.int32)
    inputs = (x, kernel, cotangent)
    worst = 0.0
    functions = {}    # (heads, implementation): compiled gradients
    print("| heads | xla ms | pallas ms | ratio | y err xla / pallas | dx err xla / pallas "
          "| dk err xla / pallas |")
    print("|---|---|---|---|---|---|---|")
    for heads in (args.heads, None):
        inputs32 = (x.astype(jnp.float32), kernel, cotangent)
        exact = (output_fn("xla", segment_ids, heads, *inputs32[:2])(*inputs32[:2]),
                 *gradient_fn("xla", segment_ids, heads, inputs32)(*inputs32))
        for implementation in ("xla", "pallas"):
            functions[heads, implementation] = gradient_fn(implementation, segment_ids, heads,
                                                           inputs)
        row = {label: (median_ms(fn, inputs, args.repeats),
                       [relative(g, e) for g, e in zip(
                           (output_fn(label, segment_ids, heads, x, kernel)(x, kernel),
                            *fn(*inputs)), exact)])
               for (h, label), fn in functions.items() if h == heads}
        (t_xla, e_xla), (t_pallas, e_pallas) = row["xla"], row["pallas"]
        floors = (relative(exact[0].astype(x.dtype), exact[0]), 0.0, 0.0)
        for ours, theirs in zip(e_pallas, map(max, e_xla, floors)):
            worst = max(worst, ours - (1.5 * theirs + 1e-3))
        print(f"| {heads or '-'} | {t_xla:.3f} | {t_pallas:.3f} | {t_pallas / t_xla:.2f} | "
              + " | ".join(f"{a:.1e} / {b:.1e}" for a, b in zip(e_xla, e_pallas)) + " |")
    if args.trace:
        for (heads, label), fn in functions.items():
            events = list(device_ms_per_call(fn, inputs, args.repeats).items())[:8]
            print(f"{label}, heads {heads or '-'}: device "
                  f"{sum(ms for _, ms in events):.3f} ms (top {len(events)})")
            for kernel_name, ms in events:
                print(f"  {ms:8.3f} ms  {kernel_name[:90]}")
    return 1 if worst > 0 else 0


if __name__ == "__main__":
    sys.exit(main())
