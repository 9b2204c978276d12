"""How long a preset's parameter initialisation takes to compile, under XLA option sets.

    python benchmarks/init_compile_time.py fpa_125m [softmax_rope_125m ...]
        [--variants default,fast_backend,cpu]

The train state's init (parameters drawn by every initializer, optimizer state) is one jitted
program of tens of thousands of elementwise instructions (threefry and the normal samplers of
each parameter), which XLA's GPU compiler fuses and compiles like any program. Variants:
    default       as jitted
    fast_backend  compiler_options: ptxas and LLVM without their expensive optimisations
    cpu           compiled and run on the host's CPU, then put on the state's shardings
Prints, per variant, the compile and run seconds and the largest difference of any parameter
from the default's (0 where the variants draw the same numbers).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from train.core.presets import load_config  # noqa: E402
from train.core.session import build_session, host_init  # noqa: E402

FAST_BACKEND_OPTIONS = {"xla_gpu_disable_gpuasm_optimizations": True,
                        "xla_llvm_disable_expensive_passes": True}


def timed_init(session, variant):
    """(compile s, run s, state) of the session's init under one variant."""
    seed = session.config.train.seed
    started = time.perf_counter()
    if variant == "cpu":   # train.init_on=host: compiled here, run and placed by host_init
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            compiled = jax.jit(session.init_fn, static_argnums=0).lower(seed).compile()
        compiled_at = time.perf_counter()
        state = host_init(lambda _: compiled(), seed, session.state_shardings)
    else:
        options = {} if variant == "default" else dict(FAST_BACKEND_OPTIONS)
        compiled = session.init_jit.lower(seed).compile(compiler_options=options)
        compiled_at = time.perf_counter()
        state = compiled()
    jax.block_until_ready(state)
    return compiled_at - started, time.perf_counter() - compiled_at, state


def largest_difference(a, b):
    leaves = zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"]))
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in leaves)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--variants", default="default,fast_backend,cpu")
    args = parser.parse_args(argv)
    print(f"{'preset':20s} {'variant':13s} {'compile s':>9s} {'run s':>7s} {'max |diff|':>10s}")
    for name in args.presets:
        config = load_config(name)
        session = build_session(config, config.model.vocab_size or 256)
        reference = None
        for variant in args.variants.split(","):
            compile_s, run_s, state = timed_init(session, variant)
            if reference is None:
                reference = state
            diff = largest_difference(reference, state)
            print(f"{name:20s} {variant:13s} {compile_s:9.1f} {run_s:7.2f} {diff:10.3g}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
