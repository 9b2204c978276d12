"""Where the FPA backward's time goes on the GPU: its parts timed alone, and a profiler trace.

    python benchmarks/attention_fpa_profile.py [--shape 4,4096,12,64] [--trace] [--out DIR]

Parts of `attention_backward` (mixer_kernels/mosaic_gpu/attention/backward.py), each jitted and timed
alone (median of 20, ms) on bf16 random inputs, FPA and, for scale, FoX at the same shape:
    forward      the forward kernel (float32 out residual included for FPA)
    prepare      XLA pre-pass: padding, delta, field statistics per level, packed vectors
    dkv          the dk / dv / column-sum kernel
    dq           the dq / row-sum kernel
    diagonal     FPA: the diagonal tiles' per-level soft-min shares kernel
    finish       XLA post-pass: FPA's soft-min shares spread over positions (dphi), dbeta
    fwd+bwd      the public op, implementation="pallas"
with prune on (the default) and off for the kernels. --trace also writes a jax.profiler trace
of three FPA forward+backward calls under DIR/trace (open with TensorBoard / Perfetto).
Writes DIR/attention_fpa_profile.json; prints a table last. A few tens of seconds on an H200.
"""

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.bench_fpa import make_inputs  # noqa: E402
from benchmarks.timing import jax_median_ms  # noqa: E402
from mixer_kernels.mosaic_gpu.attention import backward as bwd  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.bias import FPABias, SeparableBias  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.backward_diagonal_kernel import diagonal_shares_kernel  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.backward_kernels import dkv_kernel, dq_kernel  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.forward import attention_forward  # noqa: E402


def parts(name, x, shape, prune):
    """{part: ms} for one op."""
    scale = shape[-1] ** -0.5
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    if name == "fpa":
        bias = FPABias(x["phi"], x["psi"], x["beta"])
    else:
        c = jnp.cumsum(x["log_forget"], axis=1)
        bias = SeparableBias(c, c)
    fpa = name == "fpa"
    forward = jax.jit(functools.partial(attention_forward, bias=bias, scale=scale, prune=prune,
                                        float32_out=fpa))
    outs = forward(q, k, v)
    out, lse = outs[2] if fpa else outs[0], outs[1]
    cfg = bwd.kernel_config(bias, scale, None, shape[1], prune=prune)
    prepare = jax.jit(lambda *a: bwd.prepare(cfg, *a, bias, None))
    kargs, phi = prepare(q, k, v, out, lse, dout)
    dkv = jax.jit(lambda *a: dkv_kernel(cfg, *a))
    dq = jax.jit(lambda *a: dq_kernel(cfg, *a))
    diagonal = jax.jit(lambda *a: diagonal_shares_kernel(cfg, *a)) if fpa else None
    outs = (dkv(*kargs), dq(*kargs), diagonal(*kargs) if fpa else None)
    finish = jax.jit(lambda outs, p: bwd.finish(cfg, outs, p, shape[1]))
    times = {"forward": jax_median_ms(forward, q, k, v, repeats=20),
             "prepare": jax_median_ms(prepare, q, k, v, out, lse, dout, repeats=20),
             "dkv": jax_median_ms(dkv, *kargs, repeats=20),
             "dq": jax_median_ms(dq, *kargs, repeats=20),
             "finish": jax_median_ms(finish, outs, phi, repeats=20)}
    if fpa:
        times["diagonal"] = jax_median_ms(diagonal, *kargs, repeats=20)
    return times


def op_fwd_bwd(name, x):
    import fpa_jax
    args = ((x["q"], x["k"], x["v"], x["phi"], x["psi"], x["beta"]) if name == "fpa"
            else (x["q"], x["k"], x["v"], x["log_forget"]))
    op = fpa_jax.fpa_attention if name == "fpa" else fpa_jax.fox_attention

    def loss(*a):
        return jnp.sum(op(*a, implementation="pallas").astype(jnp.float32) * x["dout"])
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), args


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="4,4096,12,64")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    keep = ("phi", "psi", "beta", "log_forget")
    x = {n: jnp.asarray(a, jnp.float32 if n in keep else jnp.bfloat16)
         for n, a in make_inputs(shape, 0).items()}
    x["dout"] = jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.bfloat16)
    rows = []
    for name in ("fpa", "fox"):
        for prune in (True, False):
            row = dict(op=name, prune=prune, shape=shape)
            try:
                row.update(parts(name, x, shape, prune))
            except Exception as error:  # noqa: BLE001 - report and keep going
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            rows.append(row)
            print(row, flush=True)
        try:
            fn, fargs = op_fwd_bwd(name, x)
            rows[-2]["fwd+bwd"] = jax_median_ms(fn, *fargs, repeats=20)
            if args.trace and name == "fpa":
                jax.block_until_ready(fn(*fargs))
                with jax.profiler.trace(os.path.join(args.out, "trace")):
                    for _ in range(3):
                        jax.block_until_ready(fn(*fargs))
        except Exception as error:  # noqa: BLE001
            rows[-2]["op_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    with open(os.path.join(args.out, "attention_fpa_profile.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    keys = ("forward", "prepare", "dkv", "dq", "finish", "fwd+bwd")
    print("\nop   prune  " + "  ".join(f"{k:>8s}" for k in keys) + "   (ms)")
    for r in rows:
        print(f"{r['op']:4s} {str(r['prune']):5s}  "
              + "  ".join(f"{r.get(k, float('nan')):8.3f}" for k in keys)
              + f"  {r.get('error', '')}{r.get('op_error', '')}")


if __name__ == "__main__":
    main()
