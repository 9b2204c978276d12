"""bf16 accuracy of the "pallas" gated delta rule with each `vjp.XLA_OPERANDS` setting.

    python benchmarks/gated_delta_operands_accuracy.py [--length 2048] [--dim 128]

bf16 q, k (unit rows), v, beta and float32 g in [-0.1, 0] for one key head and two value
heads; the op's output and the gradients of a random linear loss against the float32
token-by-token oracle on the same rounded inputs (relative L2). Runs the kernels in GPU
interpret mode on the CPU (no GPU needed; about a minute at the defaults).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from gdn_jax.ops import api  # noqa: E402
from mixer_core import interpret  # noqa: E402
from mixer_kernels.mosaic_gpu.gated_delta import vjp  # noqa: E402

NAMES = ("out", "dq", "dk", "dv", "dg", "dbeta")


def inputs(length, dim, seed=0):
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape)
        return jnp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True), jnp.bfloat16)

    args = (unit((1, length, 1, dim)), unit((1, length, 1, dim)),
            jnp.asarray(rng.standard_normal((1, length, 2, dim)), jnp.bfloat16),
            jnp.asarray(rng.uniform(-0.1, 0.0, (1, length, 2)), jnp.float32),
            jnp.asarray(rng.uniform(0.0, 1.0, (1, length, 2)), jnp.bfloat16))
    return args, jnp.asarray(rng.standard_normal((1, length, 2, dim)), jnp.float32)


def output_and_gradients(implementation, args, d_out):
    def loss(*xs):
        out, _ = api.gated_delta_rule(*xs, implementation=implementation)
        return jnp.sum(d_out * out.astype(jnp.float32)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))(*args)
    return (out, *grads)


def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    arrays, d_out = inputs(args.length, args.dim)
    oracle = output_and_gradients("reference", [x.astype(jnp.float32) for x in arrays], d_out)
    print(f"T = {args.length}, K = V = {args.dim}: relative L2 error against the float32 oracle")
    print(f"{'XLA_OPERANDS':14s}" + "".join(f"{name:>9s}" for name in NAMES))
    for setting in ("float32", "16-bit"):
        vjp.XLA_OPERANDS = setting
        with interpret.gpu_interpret():
            got = output_and_gradients("pallas", arrays, d_out)
        print(f"{setting:14s}" + "".join(f"{relative(a, b):9.2e}" for a, b in zip(got, oracle)))


if __name__ == "__main__":
    main()
