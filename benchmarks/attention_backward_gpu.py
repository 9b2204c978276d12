"""GPU check of the Pallas attention backward: gradients vs the "xla" paths, and timings.

    python -m benchmarks.attention_backward_gpu [--small] [--quick] [--e2e]    (JSON to $OUT or /tmp)

For softmax, FoX and FPA at (B, T, H, D) = (4, 4096, 12, 64) bf16 (and T = 1000 with two
documents): relative L2 error of every gradient against the op's "xla" implementation on the
same bf16 inputs, for (a) "bwd": the kernel backward fed with the xla forward's out / lse,
(b) "e2e": the public op with implementation="pallas" (kernel forward + backward). FoX's
d log_forget is also compared with float32 from the same rounded inputs (the bar: <= 5e-3).
Timings (median ms): kernel backward alone, its XLA pre/post passes, the two kernels with P and
dS fed to wgmma from registers (default) and staged in shared memory, forward+backward of
"pallas", "xla" and (softmax) cuDNN. --small: tiny float32 shapes in the GPU interpreter.
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from mixer_kernels.mosaic_gpu.attention import backward as bwd
from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias


E2E_ONLY = "--e2e" in sys.argv  # skip the xla backward: e2e vs xla forward + kernel backward
QUICK = E2E_ONLY or "--quick" in sys.argv  # one shape, no xla FPA timing (73 ms on the H200, 2026-11-30)


def rel(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / (jnp.linalg.norm(b) + 1e-30))


def bench(fn, *args, reps=None):
    reps = reps or (5 if QUICK else 10)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return round(1e3 * float(np.median(times)), 3)


def make_inputs(shape, dtype, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    q, k, v, do = (jax.random.normal(ks[i], shape, jnp.float32).astype(dtype) for i in range(4))
    b, t, h, _ = shape
    extra = dict(
        log_forget=jax.nn.log_sigmoid(jax.random.normal(ks[4], (b, t, h)) + 3.0),
        phi=jnp.cumsum(0.3 * jax.random.normal(ks[5], (b, t, h)), axis=1),
        beta=0.5 + jax.random.uniform(ks[7], (h,)))
    extra["psi"] = extra["phi"] + jax.random.normal(ks[6], (b, t, h))
    return q, k, v, do, extra


def op_spec(name, extra, segment_ids, scale):
    """(public op(q, k, v, *bias_args, implementation), bias_args, names of bias grads,
    xla forward -> (out, lse [B, H, T]), bias description for the kernel backward)."""
    from fpa_jax import fox_attention, fpa_attention, softmax_attention
    from fpa_jax.baselines import flash_xla

    if name == "softmax":
        op = lambda q, k, v, implementation: softmax_attention(
            q, k, v, segment_ids=segment_ids, implementation=implementation)

        def forward(q, k, v):
            out, lse = flash_xla.flash_attention(q, k, v, scale=scale, segment_ids=segment_ids)
            return out, jnp.moveaxis(lse, 1, 2), NoBias()
        return op, (), (), forward
    if name == "fox":
        op = lambda q, k, v, lf, implementation: fox_attention(
            q, k, v, lf, segment_ids=segment_ids, implementation=implementation)

        def forward(q, k, v, lf):
            c = jnp.cumsum(lf.astype(jnp.float32), axis=1)
            out, lse = flash_xla.flash_attention(q, k, v, row_bias=c, col_bias=c, scale=scale,
                                                 segment_ids=segment_ids)
            return out, jnp.moveaxis(lse, 1, 2), SeparableBias(c, c)
        return op, (extra["log_forget"],), ("dlf",), forward
    op = lambda q, k, v, phi, psi, beta, implementation: fpa_attention(
        q, k, v, phi, psi, beta, segment_ids=segment_ids, implementation=implementation)

    def forward(q, k, v, phi, psi, beta):
        from fpa_jax.fpa import xla as fpa_xla
        from fpa_jax.fpa.tiles import BlockedConfig
        config = BlockedConfig(scale=scale, tau=1.0, block_size=64, query_level=False,
                               content=True)
        out, lse = fpa_xla._forward(q, k, v, phi, psi, beta, segment_ids, config)
        return out, lse[:, :, :q.shape[1]], FPABias(phi, psi, beta)
    return op, (extra["phi"], extra["psi"], extra["beta"]), ("dphi", "dpsi", "dbeta"), forward


def grads_fn(op, implementation, count):
    def loss(*a):
        *args, do = a
        out = op(*args, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=tuple(range(count))))


def kernel_bwd_fn(forward, segment_ids, scale, name):
    """Grads of (q, k, v, *bias args) from the kernel backward fed with the xla forward."""
    def run(*a):
        *args, do = a
        q, k, v = args[:3]
        out, lse, bias = forward(*args)
        dq, dk, dv, bias_grads = bwd.attention_backward(q, k, v, out, lse, do, bias, scale=scale,
                                                        segment_ids=segment_ids)
        if name == "fox":
            dc = bias_grads[0] + bias_grads[1]
            bias_grads = (jnp.flip(jnp.cumsum(jnp.flip(dc, 1), 1), 1),)
        return (dq, dk, dv) + tuple(bias_grads)
    return jax.jit(run)


def case(name, shape, dtype, segmented, timing):
    q, k, v, do, extra = make_inputs(shape, dtype)
    segment_ids = None
    if segmented:
        segment_ids = jnp.broadcast_to((jnp.arange(shape[1]) >= shape[1] // 3).astype(jnp.int32),
                                       shape[:2])
    scale = shape[-1] ** -0.5
    op, bias_args, bias_names, forward = op_spec(name, extra, segment_ids, scale)
    args = (q, k, v) + bias_args + (do,)
    names = ("dq", "dk", "dv") + bias_names
    count = 3 + len(bias_args)
    row = dict(op=name, shape=shape, segments=segmented)
    xla = grads_fn(op, "xla", count)
    got = kernel_bwd_fn(forward, segment_ids, scale, name)(*args)
    ref = got if E2E_ONLY else xla(*args)  # E2E_ONLY: e2e checked against the kernel backward
    row.update({f"bwd_{n}": rel(g, r) for n, g, r in zip(names, got, ref)})
    if name == "fox" and not E2E_ONLY:
        up = lambda x: x.astype(jnp.float32)
        f32 = xla(up(q), up(k), up(v), extra["log_forget"], up(do))
        row["bwd_dlf_vs_f32"] = rel(got[3], f32[3])
        row["xla_dlf_vs_f32"] = rel(ref[3], f32[3])
    try:
        pallas = grads_fn(op, "pallas", count)
        e2e = pallas(*args)
        row.update({f"e2e_{n}": rel(g, r) for n, g, r in zip(names, e2e, ref)})
        out_p = jax.jit(lambda *a: op(*a, implementation="pallas"))(*args[:-1])
        out_x = jax.jit(forward)(*args[:-1])[0]
        row["e2e_out"] = rel(out_p, out_x)
    except Exception as error:  # noqa: BLE001 - report and keep going
        pallas = None
        row["e2e_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    if not timing:
        return row
    row["ms_kernel_bwd_with_xla_fwd"] = bench(kernel_bwd_fn(forward, segment_ids, scale, name), *args)
    out, lse, bias = jax.jit(forward)(*args[:-1])
    cfg = bwd.kernel_config(bias, scale, segment_ids, shape[1])
    prep = jax.jit(lambda *a: bwd.prepare(cfg, *a, bias, segment_ids))
    kargs, phi = prep(q, k, v, out, lse, do)
    row["ms_bwd_prepare"] = bench(prep, q, k, v, out, lse, do)
    row["ms_bwd_kernels"] = bench(jax.jit(lambda *a: bwd.run_kernels(cfg, a)), *kargs)
    try:  # P and dS staged in shared memory (the interpreter's form) against the default
        staged = bwd.kernel_config(bias, scale, segment_ids, shape[1], lhs_in_registers=False)
        outs_staged = jax.jit(lambda *a: bwd.run_kernels(staged, a))(*kargs)
        outs_ref = jax.jit(lambda *a: bwd.run_kernels(cfg, a))(*kargs)
        row["staged_variant_max_rel"] = max(
            rel(a, b) for a, b in zip(jax.tree.leaves(outs_staged), jax.tree.leaves(outs_ref)))
        row["ms_bwd_kernels_staged"] = bench(jax.jit(lambda *a: bwd.run_kernels(staged, a)),
                                             *kargs)
    except Exception as error:  # noqa: BLE001 - report and keep going
        row["staged_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    outs = jax.jit(lambda *a: bwd.run_kernels(cfg, a))(*kargs)
    row["ms_bwd_finish"] = bench(jax.jit(lambda outs, p: bwd.finish(cfg, outs, p, shape[1])),
                                 outs, phi)
    if not (QUICK and name == "fpa") and not E2E_ONLY:
        row["ms_xla_fwd_bwd"] = bench(xla, *args, reps=5)
    if pallas is not None:
        row["ms_pallas_fwd_bwd"] = bench(pallas, *args)
        row["ms_pallas_fwd"] = bench(jax.jit(lambda *a: op(*a, implementation="pallas")), *args[:-1])
    if name == "softmax":
        def cudnn_loss(q, k, v, do):
            o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))
        try:
            row["ms_cudnn_fwd_bwd"] = bench(jax.jit(jax.grad(cudnn_loss, argnums=(0, 1, 2))), *args)
        except Exception as error:  # noqa: BLE001
            row["cudnn_error"] = str(error)[:200]
    return row


def main():
    small = "--small" in sys.argv
    dtype = jnp.float32 if small else jnp.bfloat16
    cases = [((1, 150, 2, 64), False, False)] if small else [
        ((4, 4096, 12, 64), False, True)] + ([] if QUICK else [((2, 1000, 4, 64), True, False)])
    results = []
    for shape, segmented, timing in cases:
        for name in ("fpa", "fox", "softmax"):
            start = time.perf_counter()
            try:
                row = case(name, shape, dtype, segmented, timing)
            except Exception as error:  # noqa: BLE001 - report every case
                row = dict(op=name, shape=shape, error=f"{type(error).__name__}: {str(error)[:400]}")
            row["wall_s"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)
            results.append(row)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "attention_backward_gpu.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\nop      shape             seg worst_bwd worst_e2e  bwd_ms (prep/kern/fin)  "
          "pallas_fb  xla_fb  cudnn_fb")
    for row in results:
        worst = lambda p: max([v for key, v in row.items()
                               if key.startswith(p) and isinstance(v, float)] or [float("nan")])
        print(f"{row['op']:7s} {str(tuple(row['shape'])):17s} {int(row.get('segments', 0))}   "
              f"{worst('bwd_d'):.1e}   {worst('e2e_'):.1e}   "
              f"{row.get('ms_kernel_bwd_with_xla_fwd', float('nan')):6.2f} "
              f"({row.get('ms_bwd_prepare', float('nan')):.2f}/{row.get('ms_bwd_kernels', float('nan')):.2f}/"
              f"{row.get('ms_bwd_finish', float('nan')):.2f})   "
              f"{row.get('ms_pallas_fwd_bwd', float('nan')):6.2f}  {row.get('ms_xla_fwd_bwd', float('nan')):6.2f}"
              f"  {row.get('ms_cudnn_fwd_bwd', float('nan')):6.2f} {row.get('error', row.get('e2e_error', ''))[:60]}")


if __name__ == "__main__":
    if "--small" in sys.argv:
        from mixer_core.interpret import gpu_interpret
        with gpu_interpret():
            main()
    else:
        main()
