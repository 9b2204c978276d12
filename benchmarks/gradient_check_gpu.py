"""Compiled Pallas attention gradients against the "xla" implementation, on the GPU.

    python benchmarks/gradient_check_gpu.py [--ops fpa,fox,softmax] [--dims 64,128] [--seed N]
        [--field-passes kernels|by_level|all_levels]
        (exits 1 when an error exceeds the bar)

FPA (the drifting walk of benchmarks/op_trace.py), FoX and softmax at (B, T, H) = (1, 1000, 2)
with D = 64 and 128, bf16 inputs drawn fresh each run (the seed is printed; --seed repeats one): the relative L2 error of every gradient of
implementation="pallas" against implementation="xla" on the same inputs and cotangent. Both
round to bf16, so the bar is 2e-2 (the kernels' own bf16 precision, 5e-3 against float32, is
tested in the GPU interpreter). Catches what the interpreter cannot see: the compiled-only
forms (wgmma operands from registers, approximate exp / rsqrt) and the lowering itself.
"""

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import fpa_backward_options  # noqa: E402
from benchmarks.op_trace import attention_inputs  # noqa: E402

BAR = 2e-2


def gradients(op, implementation, inputs, cotangent):
    from fpa_jax import fox_attention, fpa_attention, softmax_attention
    fn = functools.partial({"fpa": fpa_attention, "fox": fox_attention,
                            "softmax": softmax_attention}[op], implementation=implementation)
    return jax.jit(lambda *a: jax.vjp(fn, *a)[1](cotangent))(*inputs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="fpa,fox,softmax")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--seed", type=int, default=None)
    fpa_backward_options.add(parser)
    args = parser.parse_args()
    fpa_backward_options.apply(args)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}", flush=True)
    worst = 0.0
    for dim in (int(d) for d in args.dims.split(",")):
        for op in args.ops.split(","):
            shape = (1, 1000, 2, dim)
            rng = np.random.default_rng([seed, dim])
            inputs, _ = attention_inputs(op, shape, "walk", rng)
            cotangent = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
            got = gradients(op, "pallas", inputs, cotangent)
            want = gradients(op, "xla", inputs, cotangent)
            errors = []
            for g, w in zip(got, want):
                g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
                errors.append(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
            worst = max(worst, *errors)
            print(f"{op:8s} D={dim:3d}  relative error per input: "
                  + " ".join(f"{e:.1e}" for e in errors), flush=True)
    print(f"worst {worst:.1e} (bar {BAR:.0e})")
    sys.exit(0 if worst <= BAR else 1)


if __name__ == "__main__":
    main()
