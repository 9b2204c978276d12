"""Mosaic GPU attention kernels on a Hopper GPU: compile + correctness checks, then
timings against cuDNN and the "xla" paths, with achieved TFLOP/s and pruned tiles.

    python benchmarks/bench_attention_kernels.py [--shape B,T,H,D ...] [--kernel-only] [--out DIR]

1. Small checks (T = 200, bf16, every bias mode, segments, head dims --small-dims) of the
   forward kernel's out and lse against a dense float32 oracle computed here.
2. Per shape (default: the docs/benchmarks.md shapes, bf16): the forward kernel alone with pruning
   on / off, the fraction of off-diagonal tiles it pruned, its relative L2 error against the
   ops' "xla" paths (and cuDNN for softmax).
3. Per shape, unless --kernel-only: forward and forward+backward of the public ops
   (softmax / fox / fpa with implementation "pallas", "xla", and "cudnn" for softmax).
Times: median of jitted calls (benchmarks/timing.py). TFLOP/s counts the causal half:
2 B H T^2 D flops forward (QK^T and PV), 3.5x that forward+backward.
Inputs: q, k, v ~ N(0, 1); phi, psi = walk + 0.5 N(0, 1), walk = cumsum(0.3 N(0, 1) - 0.05);
beta = 1; log_forget = -softplus(-(N(0, 1) + 4)) (as benchmarks/bench_fpa.py).
A table is printed last; everything goes to DIR/attention_kernels.json.
"""

import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fpa_jax  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias  # noqa: E402
from mixer_kernels.mosaic_gpu.attention.forward import attention_forward  # noqa: E402

from benchmarks.timing import jax_median_ms  # noqa: E402


DEFAULT_SHAPES = ["4,4096,12,64", "1,16384,12,64", "8,2048,16,128"]  # docs/benchmarks.md


def make_inputs(shape, seed, dtype=jnp.bfloat16):
    batch, length, heads, _ = shape
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(x, dtype) for x in rng.standard_normal((3, *shape), dtype=np.float32))
    per_token = (batch, length, heads)
    walk = np.cumsum(0.3 * rng.standard_normal(per_token) - 0.05, axis=1)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return dict(q=q, k=k, v=v, phi=f32(walk + 0.5 * rng.standard_normal(per_token)),
                psi=f32(walk + 0.5 * rng.standard_normal(per_token)),
                beta=jnp.ones((heads,), jnp.float32),
                log_forget=f32(-np.logaddexp(0.0, -(rng.standard_normal(per_token) + 4.0))))


def dense_oracle(q, k, v, bias, scale, segment_ids=None):
    """float32 dense (out [B, T, H, D], lse [B, H, T]) for the three bias kinds."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    length = q.shape[1]
    t = jnp.arange(length)
    logits = scale * jnp.einsum("bthd,bshd->bhts", q, k)
    if isinstance(bias, SeparableBias):
        logits += jnp.moveaxis(bias.row, 1, 2)[..., :, None] - jnp.moveaxis(bias.col, 1, 2)[..., None, :]
    elif isinstance(bias, FPABias):
        phi = jnp.moveaxis(bias.phi, 1, 2)  # [B, H, T]
        inside = (t[None, None, :] > t[None, :, None]) & (t[None, None, :] <= t[:, None, None])  # [t, s, u]
        rmin = jnp.where(inside, phi[..., None, None, :], jnp.inf).min(-1)  # [B, H, t, s]
        psi = jnp.moveaxis(bias.psi, 1, 2)
        level = psi[..., :, None] if bias.query_level else psi[..., None, :]
        b = bias.beta[None, :, None, None] * jnp.minimum(rmin - level, 0.0)
        b = jnp.where(t[:, None] > t[None, :], b, 0.0)
        logits = (logits if bias.content else 0.0 * logits) + b
    valid = t[:, None] >= t[None, :]
    if segment_ids is not None:
        valid = valid & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    logits = jnp.where(valid, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", jnp.exp(logits - lse[..., None]), v)
    return out, lse


def arrays_of(bias):
    """The array fields of a bias (traced by jit); the rest stays static."""
    return tuple(x for x in bias if isinstance(x, jax.Array))


def with_arrays(bias, arrays):
    fields = list(bias)
    slots = [i for i, x in enumerate(fields) if isinstance(x, jax.Array)]
    for i, x in zip(slots, arrays):
        fields[i] = x
    return type(bias)(*fields)


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def small_checks(dim):
    rows = []
    shape = (2, 200, 2, dim)
    x = make_inputs(shape, seed=1)
    c = jnp.cumsum(x["log_forget"], axis=1)
    seg = (jnp.arange(200)[None, :] >= jnp.array([[70], [150]])).astype(jnp.int32)
    cases = {
        "softmax": (NoBias(), None),
        "fox": (SeparableBias(c, c), None),
        "fpa": (FPABias(x["phi"], x["psi"], x["beta"]), None),
        "fpa_query_level": (FPABias(x["phi"], x["psi"], x["beta"], query_level=True), None),
        "fpa_no_content": (FPABias(x["phi"], x["psi"], x["beta"], content=False), None),
        "fpa_segments": (FPABias(x["phi"], x["psi"], x["beta"]), seg),
        "softmax_segments": (NoBias(), seg),
    }
    scale = dim ** -0.5
    for name, (bias, segment_ids) in cases.items():
        try:
            out, lse = jax.jit(lambda q, k, v, arrays, s, bias=bias: attention_forward(
                q, k, v, with_arrays(bias, arrays), scale=scale, segment_ids=s))(
                x["q"], x["k"], x["v"], arrays_of(bias), segment_ids)
            ro, rl = dense_oracle(x["q"], x["k"], x["v"], bias, scale, segment_ids)
            rows.append(dict(check=f"small {name} D={dim}", out_rel=rel(out, ro),
                             lse_maxabs=float(jnp.abs(lse - rl).max())))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rows.append(dict(check=f"small {name} D={dim}", error=str(e).splitlines()[0][:200]))
        print(rows[-1], flush=True)
    return rows


def _time(row, key, fn, args, flops, repeats):
    try:
        row[key] = jax_median_ms(fn, *args, repeats=repeats)
        row[key.replace("ms", "tflops")] = flops / row[key] / 1e9
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        row[key.replace("ms", "error")] = str(e).splitlines()[0][:200]


def _fwd_bwd(fn, num_float_args):
    """jit of (args, dout) -> grads of sum(fn(args) * dout) w.r.t. the first float args."""
    def loss(*args):
        *inputs, dout = args
        return jnp.sum(fn(*inputs).astype(jnp.float32) * dout)
    return jax.jit(jax.grad(loss, argnums=tuple(range(num_float_args))))


def op_rows(shape, x, flops):
    """Forward and forward+backward of the public ops: "pallas", "xla" (and cuDNN)."""
    scale = shape[-1] ** -0.5
    q, k, v = x["q"], x["k"], x["v"]
    dout = jnp.asarray(np.random.default_rng(3).standard_normal(shape), jnp.float32)
    ops = {
        "softmax": (lambda impl: lambda q, k, v: fpa_jax.softmax_attention(
            q, k, v, scale=scale, implementation=impl), (q, k, v)),
        "fox": (lambda impl: lambda q, k, v, lf: fpa_jax.fox_attention(
            q, k, v, lf, scale=scale, implementation=impl), (q, k, v, x["log_forget"])),
        "fpa": (lambda impl: lambda q, k, v, phi, psi, beta: fpa_jax.fpa_attention(
            q, k, v, phi, psi, beta, scale=scale, implementation=impl),
            (q, k, v, x["phi"], x["psi"], x["beta"])),
    }
    rows = []
    for name, (make, args) in ops.items():
        impls = ("pallas", "xla", "cudnn") if name == "softmax" else ("pallas", "xla")
        results = {}
        for impl in impls:
            row = dict(op=f"{impl} {name}", shape=shape)
            repeats = 5 if impl == "xla" else 20
            fn = make(impl)
            fwd, fwd_bwd = jax.jit(fn), _fwd_bwd(fn, len(args))
            try:  # outputs and every gradient, compared with "xla" below
                results[impl] = (fwd(*args), fwd_bwd(*args, dout))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                row["error"] = str(e).splitlines()[0][:200]
            _time(row, "fwd_ms", fwd, args, flops, repeats)
            _time(row, "fwdbwd_ms", fwd_bwd, (*args, dout), 3.5 * flops, repeats)
            rows.append(row)
        for row in rows[-len(impls):]:
            impl = row["op"].split()[0]
            if impl != "xla" and impl in results and "xla" in results:
                (out, grads), (ref_out, ref_grads) = results[impl], results["xla"]
                row["rel_vs_xla"] = rel(out, ref_out)
                row["grad_rel_vs_xla"] = {f"d{i}": rel(g, r) for i, (g, r) in
                                          enumerate(zip(grads, ref_grads))}
                row["worst_grad_rel"] = max(row["grad_rel_vs_xla"].values())
            print(row, flush=True)
    return rows


def kernel_rows(shape, x, flops):
    """The forward kernel alone: pruning on / off, pruned fraction, error vs the "xla" op."""
    scale = shape[-1] ** -0.5
    q, k, v = x["q"], x["k"], x["v"]
    c = jnp.cumsum(x["log_forget"], axis=1)
    biases = {"softmax": NoBias(), "fox": SeparableBias(c, c),
              "fpa": FPABias(x["phi"], x["psi"], x["beta"])}
    xla = {"softmax": (lambda q, k, v: fpa_jax.softmax_attention(
               q, k, v, scale=scale, implementation="xla"), (q, k, v)),
           "fox": (lambda q, k, v, lf: fpa_jax.fox_attention(
               q, k, v, lf, scale=scale, implementation="xla"), (q, k, v, x["log_forget"])),
           "fpa": (lambda q, k, v, phi, psi, beta: fpa_jax.fpa_attention(
               q, k, v, phi, psi, beta, scale=scale, implementation="xla"),
               (q, k, v, x["phi"], x["psi"], x["beta"]))}  # arguments, not constants
    variants = [(name, prune, True) for name in biases for prune in (True, False)
                if name != "softmax" or prune]
    variants += [("softmax", True, False), ("fpa", True, False)]  # P through shared memory
    rows, references = [], {}
    for name, prune, p_regs in variants:
        bias = biases[name]
        row = dict(op=f"kernel {name} prune={'on' if prune else 'off'}"
                      f"{'' if p_regs else ' P-smem'}", shape=shape)
        fn = jax.jit(lambda q, k, v, arrays, bias=bias, prune=prune, p_regs=p_regs:
                     attention_forward(q, k, v, with_arrays(bias, arrays), scale=scale,
                                       prune=prune, return_stats=True, p_in_registers=p_regs))
        args = (q, k, v, arrays_of(bias))
        try:
            out, lse, stats = fn(*args)
            row["pruned_frac"] = float(stats["pruned_tiles"]) / max(float(stats["tiles"]), 1.0)
            row["lse_finite"] = bool(jnp.isfinite(lse).all())
            if name not in references:
                references[name] = jax.jit(xla[name][0])(*xla[name][1])
            row["rel_vs_xla"] = rel(out, references[name])
            if name == "softmax":
                row["rel_vs_cudnn"] = rel(out, jax.nn.dot_product_attention(
                    q, k, v, scale=scale, is_causal=True, implementation="cudnn"))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row["error"] = str(e).splitlines()[0][:200]
        _time(row, "fwd_ms", fn, args, flops, 20)
        rows.append(row)
        print(row, flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", action="append", default=None)
    parser.add_argument("--small-dims", default="64,128")
    parser.add_argument("--kernel-only", action="store_true",
                        help="time the forward kernel alone, not the public ops")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    shapes = [tuple(int(s) for s in text.split(",")) for text in (args.shape or DEFAULT_SHAPES)]
    print("device:", jax.devices()[0].device_kind, flush=True)
    rows = []
    for dim in (int(d) for d in args.small_dims.split(",") if d):
        rows += small_checks(dim)
    timings = []
    for shape in shapes:
        x = make_inputs(shape, seed=2)
        flops = 2.0 * shape[0] * shape[2] * shape[1] ** 2 * shape[3]  # causal fwd: QK^T + PV
        timings += kernel_rows(shape, x, flops)
        if not args.kernel_only:
            timings += op_rows(shape, x, flops)
    with open(os.path.join(args.out, "attention_kernels.json"), "w") as f:
        json.dump({"device": jax.devices()[0].device_kind, "checks": rows, "timings": timings},
                  f, indent=1, default=str)
    nan = float("nan")
    print("\ncheck                          out_rel    lse_maxabs")
    for r in rows:
        print(f"{r['check']:30s} {r.get('out_rel', nan):9.2e} {r.get('lse_maxabs', nan):9.2e} "
              f"{r.get('error', '')}")
    print("\nop                     shape                 fwd ms TFLOP/s  f+b ms TFLOP/s pruned  rel_err grad_err")
    for r in timings:
        err = r.get("rel_vs_xla", r.get("rel_vs_cudnn", nan))
        print(f"{r['op']:22s} {str(r['shape']):20s} {r.get('fwd_ms', nan):7.3f} {r.get('fwd_tflops', nan):7.1f}"
              f" {r.get('fwdbwd_ms', nan):7.3f} {r.get('fwdbwd_tflops', nan):7.1f}"
              f" {r.get('pruned_frac', nan):6.3f} {err:8.1e} {r.get('worst_grad_rel', nan):8.1e}"
              f" {r.get('error', '')}{r.get('fwd_error', '')}"
              f"{r.get('fwdbwd_error', '')}")


if __name__ == "__main__":
    main()
