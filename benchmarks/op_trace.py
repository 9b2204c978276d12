"""Per-kernel device time of one op's forward+backward, from a jax.profiler trace.

    python benchmarks/op_trace.py fpa --shape 4,4096,12,64 --fields walk [--out DIR]
    python benchmarks/op_trace.py gdn --shape 4,4096,16,128 [--intra-backward pallas]
        [--residuals internals|inputs] [--xla-operands float32|16-bit] [--outputs xla|pallas]
        [--state-gradients xla|pallas]
    python benchmarks/op_trace.py fpa|fox|softmax ... [--overlap none|dq|dkv|both]
    python benchmarks/op_trace.py fpa ... [--field-passes kernels|by_level|all_levels]
    python benchmarks/op_trace.py fpa --shape 4,4096,12,64 1,16384,12,64 --fields walk,flat,fox
    python benchmarks/op_trace.py gdn ... --keep-trace   # then benchmarks/fusion_sources.py
    python benchmarks/op_trace.py gdn ... --with-output  # the output too, as a train step

op: fpa | fox | softmax (the "pallas" kernels) or gdn (gated_delta_rule, "pallas"); bf16 inputs,
one jitted vjp with a random cotangent for every differentiable input; the program returns
the gradients only, so XLA drops whatever of the primal forward the backward does not keep
(for gdn, which keeps only its inputs, the whole forward: `--with-output` returns the output
too, the program a train step runs). FPA's fields:
    walk   the drifting walk of benchmarks/bench_fpa.py (phi, psi = walk + noise)
    fox    FoX's fields, phi = psi = cumsum(log forget) (nothing rises)
    flat   phi = psi = 0 (zero bias: no tile can be pruned)
The call runs `--repeats` times under the profiler; every device event is summed by name and
divided by the repeat count: ms per call, costliest first (Pallas kernels are named after their
body function, XLA fusions after the fusion). Prints the table and the wall median; writes
DIR/op_trace_<op>_<fields>_<shape>.json.
"""

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import fpa_backward_options  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from train.tools.profile_trace import event_totals  # noqa: E402


def attention_inputs(op, shape, fields, rng):
    batch, length, heads, _ = shape
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.bfloat16) for _ in range(3))
    per_token = (batch, length, heads)
    log_forget = -np.logaddexp(0.0, -(rng.standard_normal(per_token) + 4.0))
    if op == "softmax":
        return (q, k, v), {}
    if op == "fox":
        return (q, k, v, jnp.asarray(log_forget, jnp.float32)), {}
    if fields == "walk":
        walk = np.cumsum(0.3 * rng.standard_normal(per_token) - 0.05, axis=1)
        phi = walk + 0.5 * rng.standard_normal(per_token)
        psi = walk + 0.5 * rng.standard_normal(per_token)
    elif fields == "fox":
        phi = psi = np.cumsum(log_forget, axis=1)
    elif fields == "flat":
        phi = psi = np.zeros(per_token)
    else:
        raise SystemExit(f"error: --fields: expected walk, fox or flat, got {fields!r}")
    beta = np.ones((heads,))
    return tuple([q, k, v] + [jnp.asarray(a, jnp.float32) for a in (phi, psi, beta)]), {}


def op_function(op):
    from fpa_jax import fox_attention, fpa_attention, softmax_attention
    from gdn_jax import gated_delta_rule
    return {"fpa": functools.partial(fpa_attention, implementation="pallas"),
            "fox": functools.partial(fox_attention, implementation="pallas"),
            "softmax": functools.partial(softmax_attention, implementation="pallas"),
            "gdn": lambda *a: gated_delta_rule(*a, implementation="pallas")}[op]


def gdn_inputs(shape, rng):
    batch, length, heads, dim = shape
    q, k = (jax.nn.standardize(jnp.asarray(rng.standard_normal(shape), jnp.float32), axis=-1)
            / np.sqrt(dim) for _ in range(2))
    v = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    g = jnp.asarray(-np.logaddexp(0.0, -(rng.standard_normal(shape[:3]) + 3.0)), jnp.float32)
    beta = jnp.asarray(1.0 / (1.0 + np.exp(-rng.standard_normal(shape[:3]))), jnp.bfloat16)
    return (q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v, g, beta), {}


def device_ms_per_call(fn, args, repeats, keep_trace=None):
    """{device event name: ms per call of fn(*args)}, costliest first, from a jax.profiler
    trace of `repeats` calls (fn already compiled); keep_trace: a folder that keeps the trace
    (for benchmarks/fusion_sources.py), else a temporary one."""
    with tempfile.TemporaryDirectory() as scratch:
        trace_dir = keep_trace or scratch
        with jax.profiler.trace(trace_dir):
            for _ in range(repeats):
                jax.block_until_ready(fn(*args))
        totals = event_totals(trace_dir)
    return {name: us / repeats / 1e3 for name, us in totals.most_common()}


def trace_one(op, shape, fields, repeats, top, out_dir, keep_trace=False, with_output=False):
    """Time and trace one op at one shape (and FPA field regime); print and write its table
    (keep_trace: and keep the profiler trace in out_dir/trace_<label>; with_output: the
    program returns the op's output with the gradients)."""
    rng = np.random.default_rng(0)
    inputs, _ = gdn_inputs(shape, rng) if op == "gdn" else attention_inputs(op, shape, fields,
                                                                            rng)
    fn = op_function(op)
    first = lambda *a: fn(*a)[0] if op == "gdn" else fn(*a)
    out_shape = jax.eval_shape(first, *inputs)
    cotangent = jnp.asarray(rng.standard_normal(out_shape.shape), out_shape.dtype)

    def gradients(*arrays):
        out, pullback = jax.vjp(first, *arrays)
        return (out, pullback(cotangent)) if with_output else pullback(cotangent)

    grads = jax.jit(gradients)
    jax.block_until_ready(grads(*inputs))
    wall = []
    for _ in range(10):
        started = time.perf_counter()
        jax.block_until_ready(grads(*inputs))
        wall.append(1e3 * (time.perf_counter() - started))
    knobs = _knobs(op) | ({"with_output": True} if with_output else {})
    label = "_".join([op, fields if op == "fpa" else "", "x".join(map(str, shape)),
                      *(f"{key}-{value}" for key, value in knobs.items())])
    per_call = device_ms_per_call(grads, inputs, repeats,
                                  os.path.join(out_dir, f"trace_{label}") if keep_trace else None)
    result = {"op": op, "fields": fields, "shape": shape, "knobs": knobs,
              "fwd_bwd_wall_ms": statistics.median(wall), "device_ms": per_call}
    with open(os.path.join(out_dir, f"op_trace_{label}.json"), "w") as f:
        json.dump(result, f, indent=1)
    device_total = sum(per_call.values()) or float("nan")
    print(f"\n{label}: forward+backward wall median {statistics.median(wall):.3f} ms, device "
          f"events {device_total:.3f} ms per call", flush=True)
    for name, ms in list(per_call.items())[:top]:
        print(f"  {ms:8.3f} ms  {100 * ms / device_total:5.1f}%  {name[:100]}", flush=True)


def _knobs(op):
    """The module switches this run's kernels were traced with."""
    if op == "gdn":
        from mixer_kernels.mosaic_gpu.gated_delta import vjp
        return {"intra_backward": vjp.INTRA_BACKWARD, "residuals": vjp.RESIDUALS,
                "xla_operands": vjp.XLA_OPERANDS, "outputs": vjp.OUTPUTS,
                "state_gradients": vjp.STATE_GRADIENTS}
    from mixer_kernels.mosaic_gpu.attention import backward
    mode = {"fpa": "fpa", "fox": "separable", "softmax": "none"}[op]
    overlap_dq, overlap_dkv = backward.OVERLAP[mode]
    knobs = {"overlap_dq": overlap_dq, "overlap_dkv": overlap_dkv}
    if op == "fpa":
        from mixer_kernels.mosaic_gpu.attention import fields
        knobs["field_passes"] = fields.FIELD_PASSES
    return knobs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("op", choices=("fpa", "fox", "softmax", "gdn"))
    parser.add_argument("--shape", nargs="+", default=["4,4096,12,64"], help="B,T,H,D ...")
    parser.add_argument("--fields", default="walk", help="FPA: walk, flat, fox or a list")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--keep-trace", action="store_true",
                        help="keep each profiler trace in OUT/trace_<label>, for "
                             "benchmarks/fusion_sources.py (with an XLA_FLAGS HLO dump of the "
                             "same run it names each XLA fusion's source)")
    parser.add_argument("--with-output", action="store_true",
                        help="return the op's output with the gradients (what a train step "
                             "and bench_gdn.py run)")
    parser.add_argument("--intra-backward", choices=("xla", "pallas"), default=None,
                        help="gdn: the WY preparation's backward (mixer_kernels/mosaic_gpu/gated_delta/"
                             "vjp.py INTRA_BACKWARD)")
    parser.add_argument("--overlap", choices=("none", "dq", "dkv", "both"), default=None,
                        help="attention: the backward sweeps that issue the scores' and dP's "
                             "matmuls together, for every bias mode (unset: the library's "
                             "per-mode mixer_kernels/mosaic_gpu/attention/backward.py OVERLAP)")
    parser.add_argument("--residuals", choices=("internals", "inputs"), default=None,
                        help="gdn: what the op keeps for its backward (vjp.RESIDUALS)")
    parser.add_argument("--xla-operands", choices=("float32", "16-bit"), default=None,
                        help="gdn: the operands of the op's XLA matrix products "
                             "(vjp.XLA_OPERANDS)")
    parser.add_argument("--outputs", choices=("xla", "pallas"), default=None,
                        help="gdn: the chunk outputs and their backward (vjp.OUTPUTS)")
    parser.add_argument("--state-gradients", choices=("xla", "pallas"), default=None,
                        help="gdn: dW, dKw, drho of the state recurrence (vjp.STATE_GRADIENTS)")
    fpa_backward_options.add(parser)
    args = parser.parse_args()
    fpa_backward_options.apply(args)
    if args.overlap is not None:
        from mixer_kernels.mosaic_gpu.attention import backward
        schedule = (args.overlap in ("dq", "both"), args.overlap in ("dkv", "both"))
        backward.OVERLAP = {mode: schedule for mode in backward.OVERLAP}
    gdn_switches = {"INTRA_BACKWARD": args.intra_backward, "RESIDUALS": args.residuals,
                    "XLA_OPERANDS": args.xla_operands, "OUTPUTS": args.outputs,
                    "STATE_GRADIENTS": args.state_gradients}
    if any(value is not None for value in gdn_switches.values()):
        from mixer_kernels.mosaic_gpu.gated_delta import vjp
        for name, value in gdn_switches.items():
            if value is not None:
                setattr(vjp, name, value)
    regimes = args.fields.split(",") if args.op == "fpa" else [args.fields]
    for text in args.shape:
        shape = tuple(int(n) for n in text.split(","))
        for fields in regimes:
            trace_one(args.op, shape, fields, args.repeats, args.top, args.out,
                      args.keep_trace, args.with_output)


if __name__ == "__main__":
    main()
