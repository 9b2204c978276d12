"""Host enqueue time, wall time and device span of the gated delta rule's programs (GPU).

    python benchmarks/gdn_dispatch_check.py 8,2048,12,64 4,4096,16,128

For each B,T,H,D shape (K = V = D, bench_gdn.py's inputs in bf16, g in float32) three programs:
the forward; "grads only", the gradients of a vjp whose output is dropped (what op_trace.py
times); "out+grads", the output and the gradients (what bench_gdn.py and a train step need).
Each is called once per sample and 10 times back to back: host enqueue and wall ms per call.
Then, for "grads only" and "out+grads", a profiler trace of 5 calls, synchronised one by one
and back to back: per device stream the event count, the summed event time and the span from
the first start to the last end.
Where the span of back-to-back calls equals the event sum, the device never waits on the
host; where "out+grads" has more events than "grads only", XLA dropped the primal forward of
the latter (the op's backward recomputes what it needs from the inputs).
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.bench_gdn import GDN_ARGS, make_inputs  # noqa: E402
from gdn_jax import gated_delta_rule  # noqa: E402
from train.tools.profile_trace import device_streams  # noqa: E402

IMPLEMENTATION = os.environ.get("GDN_IMPLEMENTATION", "pallas")


def per_call_ms(fn, args, calls, samples=10):
    """(enqueue, wall) median ms per call over `samples` samples of `calls` calls."""
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    enqueue, wall = [], []
    for _ in range(samples):
        start = time.perf_counter()
        results = [fn(*args) for _ in range(calls)]
        queued = time.perf_counter()
        jax.block_until_ready(results)
        enqueue.append((queued - start) * 1e3 / calls)
        wall.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(enqueue), statistics.median(wall)


def check(shape):
    raw = make_inputs(shape, 0)
    inputs = [jnp.asarray(raw[n], jnp.float32 if n == "g" else jnp.bfloat16) for n in GDN_ARGS]
    output = lambda *a: gated_delta_rule(*a, implementation=IMPLEMENTATION)[0]
    cotangent = jax.random.normal(jax.random.PRNGKey(7), jax.eval_shape(output, *inputs).shape,
                                  jnp.bfloat16)

    def out_and_grads(*a):
        out, pullback = jax.vjp(output, *a)
        return out, pullback(cotangent)

    programs = {"forward": output,
                "grads only": lambda *a: jax.vjp(output, *a)[1](cotangent),
                "out+grads": out_and_grads}
    programs = {name: jax.jit(fn).lower(*inputs).compile() for name, fn in programs.items()}
    print(f"== shape {shape}", flush=True)
    for name, fn in programs.items():
        for calls in (1, 10):
            enqueue, wall = per_call_ms(fn, inputs, calls)
            print(f"{name:10s} calls={calls:2d}: enqueue {enqueue:.3f} ms/call, "
                  f"wall {wall:.3f} ms/call", flush=True)
    for name in ("grads only", "out+grads"):
        for mode in ("one by one", "back to back"):
            with tempfile.TemporaryDirectory() as scratch:
                with jax.profiler.trace(scratch):
                    if mode == "one by one":
                        for _ in range(5):
                            jax.block_until_ready(programs[name](*inputs))
                    else:
                        jax.block_until_ready([programs[name](*inputs) for _ in range(5)])
                streams = device_streams(scratch)
            for stream, (count, summed, span) in streams.items():
                print(f"  trace {name}, 5 calls {mode}: {stream}: {count} events, sum "
                      f"{summed / 1e3:.3f} ms, span {span / 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["8,2048,12,64"]:
        check(tuple(int(n) for n in arg.split(",")))
