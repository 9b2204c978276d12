"""bf16 gradient precision of the attention ops against float32 from the same rounded inputs.

    python -m benchmarks.bf16_gradients [--shapes 2x1000x4x64,2x600x2x64] [--seeds 3]
                                        [--implementations xla,pallas] [--no-fla] [--json F]

    rel(x) = ||x_bf16 - x_f32|| / ||x_f32||        (whole array, float64 norms)

q, k, v and the output cotangent are drawn in float32 and rounded to bf16 once. Each
implementation runs on the bf16 values; the oracle is the op's dense "reference" path on the
same values in float32 (matmuls at "highest" precision), so rel measures only the rounding
inside the implementation. Ops: FoX (forget gates sigmoid(3 + N(0, 1)), log_forget float32),
ALiBi-free causal softmax, FPA (walk step and offsets of random scale, beta in [0.2, 2]); with
PyTorch, CUDA and flash-linear-attention importable, also fla's Triton FoX kernel
(`parallel_forgetting_attn`) on the same rounded numbers as the anchor. The table gives, per
op, implementation and shape, the largest rel over the seeds for the output and each gradient,
and whether all stay within BOUND = 5e-3 (the project's bar; bf16 carries 8 mantissa bits).
"""

import argparse
import functools
import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave room for PyTorch

import jax
import jax.numpy as jnp
import numpy as np

BOUND = 5e-3
OPS = {"fox": ("out", "dq", "dk", "dv", "dlog_forget"),
       "softmax": ("out", "dq", "dk", "dv"),
       "fpa": ("out", "dq", "dk", "dv", "dphi", "dpsi", "dbeta")}


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def make_inputs(op, shape, seed):
    """(bf16 q, k, v, float32 weight holding bf16 values, float32 extra arguments of the op)."""
    batch, length, heads, _ = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 9)
    q, k, v = (jax.random.normal(key, shape).astype(jnp.bfloat16) for key in keys[:3])
    weight = jax.random.normal(keys[3], shape).astype(jnp.bfloat16).astype(jnp.float32)
    if op == "fox":
        return q, k, v, weight, (jax.nn.log_sigmoid(3.0 + jax.random.normal(keys[4], shape[:3])),)
    if op == "softmax":
        return q, k, v, weight, ()
    from fpa_jax import fields
    step, offset = jnp.exp(jax.random.uniform(keys[5], (2,), minval=-3, maxval=0.5))
    phi, psi = fields(step * jax.random.normal(keys[6], shape[:3]),
                      offset * jax.random.normal(keys[7], shape[:3]),
                      offset * jax.random.normal(keys[8], shape[:3]))
    beta = jax.random.uniform(keys[4], (heads,), minval=0.2, maxval=2.0)
    return q, k, v, weight, (phi, psi, beta)


def jax_op(op):
    from fpa_jax import fox_attention, fpa_attention, softmax_attention
    return {"fox": fox_attention, "softmax": softmax_attention, "fpa": fpa_attention}[op]


@functools.lru_cache(maxsize=None)
def grad_function(op, implementation, count):
    """jit of (q, k, v, weight, *extras) -> (out, gradients of sum(out * weight) w.r.t. q, k,
    v and the `count` extras); one compile per op, implementation and shape."""
    attend = jax_op(op)

    def loss(weight, *args):
        out = attend(*args, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * weight), out

    grad = jax.grad(loss, argnums=tuple(range(1, 4 + count)), has_aux=True)
    return jax.jit(lambda q, k, v, weight, *extras: grad(weight, q, k, v, *extras))


def jax_out_and_grads(op, implementation, q, k, v, weight, extras):
    grads, out = grad_function(op, implementation, len(extras))(q, k, v, weight, *extras)
    return [out, *grads]


def fla_fox_out_and_grads(q, k, v, weight, log_forget):
    """fla's Triton FoX kernel on the same bf16 numbers (None if it cannot run here)."""
    try:
        import torch
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    to_torch = lambda x, dtype: torch.tensor(np.asarray(x, np.float32), device="cuda",
                                             dtype=dtype).requires_grad_(True)
    tq, tk, tv = (to_torch(x, torch.bfloat16) for x in (q, k, v))
    tg = to_torch(log_forget, torch.float32)
    out = parallel_forgetting_attn(tq, tk, tv, tg)
    out.float().mul(torch.tensor(np.asarray(weight), device="cuda")).sum().backward()
    return [x.detach().float().cpu().numpy() for x in (out, tq.grad, tk.grad, tv.grad, tg.grad)]


def measure(op, implementation, shape, seeds):
    """Largest rel over the seeds for the output and each gradient; None if it cannot run."""
    worst = [0.0] * len(OPS[op])
    for seed in seeds:
        q, k, v, weight, extras = make_inputs(op, shape, seed)
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        with jax.default_matmul_precision("highest"):
            want = jax_out_and_grads(op, "reference", *f32, weight, extras)
        if implementation == "fla":
            got = fla_fox_out_and_grads(q, k, v, weight, *extras)
            if got is None:
                return None
        else:
            got = jax_out_and_grads(op, implementation, q, k, v, weight, extras)
        worst = [max(w, rel(g, o)) for w, g, o in zip(worst, got, want)]
    return worst


def parse_shape(text):
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise SystemExit(f"error: --shapes: expected BxTxHxD with positive integers, got {text!r}")
    return shape


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="2x1000x4x64,2x600x2x64")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--implementations", default="xla,pallas")
    parser.add_argument("--no-fla", action="store_true", help="skip fla's Triton FoX kernel")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        raise SystemExit(f"error: --seeds: expected a positive integer, got {args.seeds}")
    shapes = [parse_shape(text) for text in args.shapes.split(",")]
    implementations = [x for x in args.implementations.split(",") if x]
    print(f"bf16 vs float32 from the same rounded inputs, max rel over {args.seeds} seeds; "
          f"devices {jax.devices()}")
    rows, failed = [], False
    header = f"{'op':8} {'implementation':14} {'shape':16} {'worst':>8}  ok   per output"
    print(header)
    print("-" * len(header))
    for shape in shapes:
        for op in OPS:
            entries = implementations + (["fla"] if op == "fox" and not args.no_fla else [])
            for implementation in entries:
                try:
                    worst = measure(op, implementation, shape, range(args.seeds))
                except Exception as exc:  # one failing entry must not hide the others
                    print(f"{op:8} {implementation:14} {'x'.join(map(str, shape)):16} "
                          f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    failed = True
                    continue
                if worst is None:
                    print(f"{op:8} {implementation:14} skipped (PyTorch/CUDA/fla missing)")
                    continue
                per = dict(zip(OPS[op], worst))
                ok = max(worst) <= BOUND
                rows.append(dict(op=op, implementation=implementation, shape=shape,
                                 rel=per, ok=ok))
                detail = " ".join(f"{name} {value:.1e}" for name, value in per.items())
                print(f"{op:8} {implementation:14} {'x'.join(map(str, shape)):16} "
                      f"{max(worst):8.1e}  {'yes' if ok else 'NO '}  {detail}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(bound=BOUND, seeds=args.seeds, rows=rows), f, indent=1)
    return 0 if rows and not failed and all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
