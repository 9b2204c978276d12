"""Seconds to lower each attention kernel for a Hopper GPU, and Mosaic's layout-inference share.

    python benchmarks/kernel_lowering_time.py [--shape 2,512,2,64] [--lowering lane|warpgroup]

Lowers one jitted FPA forward+backward (`fpa_pallas`, bf16) with
`lower(lowering_platforms=("cuda",))`, so it runs on a machine without a GPU: the Pallas ->
Mosaic GPU lowering in Python, including the register-layout inference that the "warpgroup"
lowering semantics (jax's default) runs and "lane" (the kernels' choice,
mixer_kernels/mosaic_gpu/attention/common.py) skips. Prints, per kernel, the lowering seconds and
the part spent in layout inference. The LLVM / ptxas stage runs only on the GPU.
`--lowering warpgroup` switches this process's attention kernels only.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.experimental.mosaic.gpu.layout_inference as layout_inference  # noqa: E402
from jax._src.pallas.mosaic_gpu import lowering  # noqa: E402
from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: E402


def instrument():
    """Record (seconds, layout-inference seconds) of every Mosaic GPU kernel lowered."""
    records, inference = [], [0.0]
    infer, lower = layout_inference.infer_layout, lowering.lower_jaxpr_to_module

    def timed_infer(module, **kwargs):
        started = time.perf_counter()
        result = infer(module, **kwargs)
        inference[0] += time.perf_counter() - started
        return result

    def timed_lower(*args, **kwargs):
        inference[0] = 0.0
        started = time.perf_counter()
        result = lower(*args, **kwargs)
        records.append((time.perf_counter() - started, inference[0]))
        return result

    layout_inference.infer_layout = timed_infer
    lowering.lower_jaxpr_to_module = timed_lower
    return records


def use_lowering(semantics):
    from mixer_kernels.mosaic_gpu.attention import backward_diagonal_kernel, backward_kernels, forward_kernel
    params = plgpu.CompilerParams(approx_math=True,
                                  lowering_semantics=getattr(plgpu.LoweringSemantics,
                                                             semantics.capitalize()))
    for module in (backward_diagonal_kernel, backward_kernels, forward_kernel):
        module.COMPILER_PARAMS = params


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2,512,2,64", help="B,T,H,D")
    parser.add_argument("--lowering", choices=("lane", "warpgroup"), default="lane")
    args = parser.parse_args()
    records = instrument()
    use_lowering(args.lowering)
    from mixer_kernels.mosaic_gpu.attention.vjp import fpa_pallas

    batch, length, heads, dim = (int(n) for n in args.shape.split(","))
    x = jnp.zeros((batch, length, heads, dim), jnp.bfloat16)

    phi = jnp.zeros(x.shape[:3], jnp.float32)

    def loss(x, phi, psi):   # every input differentiated: no kernel is dead code
        out = fpa_pallas(x, x, x, phi, psi, jnp.ones(x.shape[2:3], jnp.float32), None,
                         scale=dim ** -0.5)
        return jnp.sum(out.astype(jnp.float32))

    started = time.perf_counter()
    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(x, phi, phi).lower(
        lowering_platforms=("cuda",))
    total = time.perf_counter() - started
    print(f"fpa forward+backward {args.shape}, lowering {args.lowering}: {total:.2f} s")
    for seconds, inference in records:
        print(f"  kernel {seconds:6.2f} s   layout inference {inference:6.2f} s")
    print(f"  kernels {sum(s for s, _ in records):.2f} s, layout inference "
          f"{sum(i for _, i in records):.2f} s")


if __name__ == "__main__":
    main()
