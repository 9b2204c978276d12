"""GPU check of the gated delta rule kernels (on a Hopper GPU).

    python -m benchmarks.gated_delta_gpu_check [--json OUT.json] [--parts kernels,xla,op]

kernels: compile the two state kernels, relative error against a float32 einsum recurrence,
         median time. xla: time the "xla" chunked path's parts (intra-chunk preparation, state
         scan) and the whole op, forward and forward+backward. op: the "pallas" op against "xla"
         (output, final state, six gradients) and timings. Prints a table last.
"""

import argparse
import json
import statistics
import sys
import time
import traceback

import numpy as np
import jax
import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.gated_delta import state_kernels as sk

SHAPES = ((4, 4096, 16, 128), (1, 16384, 16, 128))
ROWS = []


def bench(fn, *args, repeats=20):
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def row(name, **values):
    ROWS.append(dict(name=name, **values))
    print(name, values, flush=True)


def reference_forward(kw, w, u, rho, s0):
    hi = jax.lax.Precision.HIGHEST

    def step(s, xs):
        kw_c, w_c, u_c, rho_c = xs
        vnew = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, s, precision=hi)
        return rho_c[..., None, None] * s + jnp.einsum("bhck,bhcv->bhkv", kw_c, vnew,
                                                      precision=hi), s

    rho_t = jnp.moveaxis(rho[..., :kw.shape[0]], -1, 0)
    final, states = jax.lax.scan(step, s0, (kw.astype(jnp.float32), w.astype(jnp.float32), u,
                                            rho_t))
    return states, final


def check_kernels(batch, seq_len, heads, dim):
    chunk = 64
    n = seq_len // chunk
    rng = np.random.default_rng(0)
    k = rng.standard_normal((n, batch, heads, chunk, dim)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    kw = jnp.asarray(k * 0.9, jnp.bfloat16)
    w = jnp.asarray(k * 0.5, jnp.bfloat16)
    u = jnp.asarray(rng.standard_normal((n, batch, heads, chunk, dim)) * 0.5, jnp.float32)
    rho = jnp.asarray(rng.uniform(0.3, 0.99, (batch, heads, sk.padded_chunks(n))), jnp.float32)
    s0 = jnp.asarray(rng.standard_normal((batch, heads, dim, dim)), jnp.float32)
    tiling = sk.choose_tiling(n, chunk, dim, dim, jnp.bfloat16)
    fwd = jax.jit(lambda *a: sk.forward_states(*a, tiling=tiling))
    states, final = fwd(kw, w, u, rho, s0)
    ref_states, ref_final = jax.jit(reference_forward)(kw, w, u, rho, s0)
    name = f"B{batch}_T{seq_len}_H{heads}_D{dim}"
    row(f"fwd_states {name} Vt={tiling.value_tile}", ms=bench(fwd, kw, w, u, rho, s0),
        err_states=rel(states, ref_states), err_final=rel(final, ref_final),
        xla_scan_ms=bench(jax.jit(reference_forward), kw, w, u, rho, s0))
    for tile in (64, 32, 16):
        other = sk.Tiling(chunk, dim, dim, tile)
        row(f"tile {name} Vt={tile}",
            fwd_ms=bench(jax.jit(lambda *a: sk.forward_states(*a, tiling=other)), kw, w, u, rho, s0),
            bwd_ms=bench(jax.jit(lambda *a: sk.backward_states(*a, tiling=other)), kw, w,
                         states, rho, final))
    g = jnp.asarray(rng.standard_normal(states.shape) * 0.1, jnp.float32)
    dfinal = jnp.asarray(rng.standard_normal(final.shape), jnp.float32)
    bwd = jax.jit(lambda *a: sk.backward_states(*a, tiling=tiling))
    lams, du, ds0 = bwd(kw, w, g, rho, dfinal)
    _, pull = jax.vjp(lambda s0_, u_: reference_forward(kw, w, u_, rho, s0_), s0, u)
    ref_ds0, ref_du = pull((g, dfinal))
    row(f"bwd_states {name}", ms=bench(bwd, kw, w, g, rho, dfinal),
        err_ds0=rel(ds0, ref_ds0), err_du=rel(du, ref_du),
        finite=bool(np.isfinite(np.asarray(lams)).all()))


def make_inputs(batch, seq_len, heads, dim, seed=0):
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    shape = (batch, seq_len, heads, dim)
    gate = rng.normal(3.0, 1.0, (batch, seq_len, heads))
    return dict(q=jnp.asarray(unit(shape), jnp.bfloat16), k=jnp.asarray(unit(shape), jnp.bfloat16),
                v=jnp.asarray(rng.standard_normal(shape), jnp.bfloat16),
                g=jnp.asarray(-np.logaddexp(0.0, -gate), jnp.float32),
                beta=jnp.asarray(1 / (1 + np.exp(-rng.standard_normal(shape[:3]))), jnp.bfloat16),
                d_out=jnp.asarray(rng.standard_normal(shape), jnp.bfloat16))


def programs(implementation, value_tile=None):
    """Jitted forward and forward+backward of the chunked path (module functions, so that a
    half-edited op registry cannot break the check)."""
    if implementation == "pallas":
        from mixer_kernels.mosaic_gpu.gated_delta.vjp import chunked_forward_pallas

        def chunked(*a, **kw):
            return chunked_forward_pallas(*a, value_tile=value_tile, **kw)
    else:
        from gdn_jax.ops.chunk import chunked_forward

        def chunked(*a, **kw):
            return chunked_forward(*a, chunk_size=64, **kw)

    def forward(q, k, v, g, beta):
        out, final = chunked(q, k, v, g, beta, scale=q.shape[-1] ** -0.5, initial_state=None,
                             segment_ids=None)
        return out.astype(v.dtype), final

    def train(q, k, v, g, beta, d_out):
        (out, final), pull = jax.vjp(forward, q, k, v, g, beta)
        return out, final, pull((d_out, jnp.zeros_like(final)))

    return jax.jit(forward), jax.jit(train)


def check_xla_parts(batch, seq_len, heads, dim):
    from gdn_jax.ops import chunk as xla_chunk
    x = make_inputs(batch, seq_len, heads, dim)
    name = f"B{batch}_T{seq_len}_H{heads}_D{dim}"
    fwd, train = programs("xla")
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    row(f"xla {name}", fwd_ms=bench(fwd, *args), train_ms=bench(train, *args, x["d_out"]))
    n = seq_len // 64

    def chunked(a):
        return a.astype(jnp.float32).reshape(batch, n, 64, heads, 1, -1).transpose(1, 0, 3, 4, 2, 5)

    q, k, v = (chunked(x[m]) for m in ("q", "k", "v"))
    q, k = q[:, :, :, 0], k[:, :, :, 0]
    g = x["g"].reshape(batch, n, 64, heads, 1).transpose(1, 0, 3, 4, 2)
    beta = x["beta"].astype(jnp.float32).reshape(batch, n, 64, heads, 1).transpose(1, 0, 3, 4, 2)
    intra = jax.jit(lambda *a: xla_chunk._intra_chunk(*a, None, None))
    row(f"xla_intra {name}", ms=bench(intra, q, k, v, g, beta))
    parts = intra(q, k, v, g, beta)
    from mixer_kernels.mosaic_gpu.gated_delta import wy, wy_kernel
    rows, _ = wy.chunk_rows(x["g"], x["beta"], None, n, 64)
    raw = [x[m] for m in ("q", "k", "v")]
    kernel = jax.jit(lambda *a: wy_kernel.prepare(*a, scale=dim ** -0.5))
    kernel_t = jax.jit(lambda *a: wy_kernel.prepare(*a, scale=dim ** -0.5, with_inverse=True))
    got = kernel_t(*raw, rows)
    want = jax.jit(lambda *a: wy.prepare_reference(*a, scale=dim ** -0.5))(*raw, rows)
    row(f"wy_kernel {name}", ms=bench(kernel, *raw, rows), with_inverse_ms=bench(kernel_t, *raw, rows),
        xla_reference_ms=bench(jax.jit(lambda *a: wy.prepare_reference(*a, scale=dim ** -0.5)),
                               *raw, rows),
        **{f"err_{m}": rel(a, b) for m, a, b in zip(("W", "U", "Kw", "P", "T"), got, want)})
    state = jnp.zeros((batch, heads, 1, dim, dim), jnp.float32)
    scan = jax.jit(lambda s, *a: xla_chunk._state_scan(s, *a))
    row(f"xla_scan {name}", ms=bench(scan, state, k, parts[1], parts[2], parts[4], parts[5]))


def check_op(batch, seq_len, heads, dim):
    x = make_inputs(batch, seq_len, heads, dim, seed=1)
    name = f"B{batch}_T{seq_len}_H{heads}_D{dim}"
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    results = {}
    for impl in ("xla", "pallas"):
        fwd, train = programs(impl)
        out, final, grads = train(*args, x["d_out"])
        results[impl] = (out, final, grads)
        row(f"{impl} {name}", fwd_ms=bench(fwd, *args), train_ms=bench(train, *args, x["d_out"]))
    if batch == 1:
        for tile in (16, 32):
            fwd, train = programs("pallas", tile)
            row(f"pallas Vt={tile} {name}", fwd_ms=bench(fwd, *args),
                train_ms=bench(train, *args, x["d_out"]))
    (o1, f1, g1), (o2, f2, g2) = results["xla"], results["pallas"]
    row(f"pallas_vs_xla {name}", out=rel(o2, o1), final=rel(f2, f1),
        **{f"d{n}": rel(a, b) for n, a, b in zip("qkvgb", g2, g1)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--parts", default="kernels,xla,op")
    parser.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES))
    args = parser.parse_args()
    print(jax.devices()[0].device_kind, flush=True)
    parts = args.parts.split(",")
    for shape in [tuple(map(int, s.split(","))) for s in args.shapes.split(";")]:
        for part, fn in (("kernels", check_kernels), ("xla", check_xla_parts), ("op", check_op)):
            if part in parts:
                try:
                    fn(*shape)
                except Exception:  # report and go on with the other parts
                    traceback.print_exc(limit=4)
                    row(f"{part} {shape} FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ROWS, f, indent=1)
    print("\n==== summary")
    for r in ROWS:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    sys.exit(main())
