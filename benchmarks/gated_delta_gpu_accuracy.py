"""The bf16 accuracy bar on the GPU: the "pallas" op's bf16 output and gradients, and fla's
`chunk_gated_delta_rule` on the same bf16 inputs, each against a float32 recurrence ("xla"
chunked form at HIGHEST matmul precision on the upcast inputs).

    python -m benchmarks.gated_delta_gpu_accuracy jax OUT.npz [B,T,H,D]   # ours + the reference
    python -m benchmarks.gated_delta_gpu_accuracy torch OUT.npz   # fla against the same
"""

import sys

import numpy as np

NAMES = ("q", "k", "v", "g", "beta")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_jax(path, shape=(2, 4096, 16, 128)):
    import jax
    import jax.numpy as jnp
    from benchmarks import gated_delta_gpu_check as gpu_check
    from mixer_kernels.mosaic_gpu.gated_delta.vjp import chunked_forward_pallas
    from gdn_jax.ops.chunk import chunked_forward
    x = gpu_check.make_inputs(*shape, seed=7)
    args = [x[n] for n in NAMES]
    scale = shape[-1] ** -0.5

    def loss_grads(fn, cast):       # inputs as arguments, never closed-over constants
        def run(d_out, *xs):
            def forward(*ys):
                return fn(*ys, scale=scale, initial_state=None, segment_ids=None)[0]
            out, pull = jax.vjp(forward, *[cast(a) for a in xs])
            return out, pull(d_out.astype(out.dtype))
        return jax.jit(run)(x["d_out"], *args)

    ours = loss_grads(chunked_forward_pallas, lambda a: a)
    with jax.default_matmul_precision("highest"):
        ref = loss_grads(lambda *a, **k: chunked_forward(*a, chunk_size=64, **k),
                         lambda a: a.astype(jnp.float32))
    errors = {"out": rel(ours[0], ref[0]),
              **{f"d{n}": rel(a, b) for n, a, b in zip(NAMES, ours[1], ref[1])}}
    print("pallas bf16 vs f32 recurrence", {k: f"{v:.2e}" for k, v in errors.items()}, flush=True)
    np.savez(path, **{n: np.asarray(x[n].astype(jnp.float32)) for n in (*NAMES, "d_out")},
             ref_out=np.asarray(ref[0]), **{f"ref_d{n}": np.asarray(a) for n, a in zip(NAMES, ref[1])},
             our_out=np.asarray(ours[0].astype(jnp.float32)))


def run_torch(path):
    import torch
    import fla.ops.common.chunk_o as chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    if hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        chunk_o.TRITON_ABOVE_3_7_1 = True
    data = np.load(path)
    xs = [torch.tensor(data[n], device="cuda",
                       dtype=torch.float32 if n == "g" else torch.bfloat16).requires_grad_()
          for n in NAMES]
    out, _ = chunk_gated_delta_rule(*xs, scale=xs[0].shape[-1] ** -0.5, output_final_state=False)
    out.backward(torch.tensor(data["d_out"], device="cuda", dtype=out.dtype))
    errors = {"out": rel(out.float().detach().cpu(), data["ref_out"]),
              **{f"d{n}": rel(x.grad.float().cpu(), data[f"ref_d{n}"]) for n, x in zip(NAMES, xs)},
              "pallas_vs_fla_out": rel(data["our_out"], out.float().detach().cpu())}
    print("fla bf16 vs f32 recurrence", {k: f"{v:.2e}" for k, v in errors.items()}, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "jax" and len(sys.argv) > 3:
        run_jax(sys.argv[2], tuple(int(n) for n in sys.argv[3].split(",")))
    else:
        {"jax": run_jax, "torch": run_torch}[sys.argv[1]](sys.argv[2])
