"""Relative errors of a bf16 attention path against float32 from the same rounded inputs: the
blocked ("xla") paths (`rel_errors`: tests/fpa_jax/fpa/test_xla_bf16_gradients.py,
tests/fpa_jax/baselines/test_flash_xla_bf16_gradients.py) and the kernels (`rel` and `check`:
tests/mixer_kernels/mosaic_gpu/attention/test_vjp_bf16_gradients.py).

    rel(x) = ||x_bf16 - x_f32|| / ||x_f32||    (over the whole array, float64 norms)

q, k, v and the output cotangent are rounded to bf16 once; the bf16 run takes them as they are,
the float32 oracle (the dense "reference" path) takes the same values in float32, so rel
measures only the rounding inside the bf16 path. Every output and gradient must stay within
BOUND = 5e-3 (bf16 carries 8 mantissa bits: single roundings give about 2e-3).
"""

import jax
import jax.numpy as jnp
import numpy as np

BOUND = 5e-3
BLOCK = 32


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def bf16_inputs(seed, shape):
    """q, k, v in bf16 and an output weight whose values are bf16 numbers (kept float32), drawn
    with NumPy (jax.random would compile a program per shape)."""
    rng = np.random.default_rng(seed)
    q, k, v, weight = (rng.standard_normal(shape, np.float32).astype(jnp.bfloat16)
                       for _ in range(4))
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(weight.astype(np.float32))


def rel_errors(attend, weight, q, k, v, *extras):
    """rel of out and of every gradient: attend(impl, q, k, v, *extras) in bf16 vs f32 oracle."""
    def run(implementation, q, k, v):
        # the weight an argument, not a constant of the program: the cases of one shape then
        # compile one program (the session's compilation cache serves the second)
        def loss(weight, *args):
            out = attend(implementation, *args)
            return jnp.sum(out.astype(jnp.float32) * weight), out
        argnums = tuple(range(1, 4 + len(extras)))
        grad_fn = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))
        grads, out = grad_fn(weight, q, k, v, *extras)
        return out, grads

    out, grads = run("xla", q, k, v)
    out_ref, grads_ref = run("reference", *(x.astype(jnp.float32) for x in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    assert all(g.dtype == jnp.bfloat16 for g in grads[:3])
    return [rel(out, out_ref)] + [rel(g, g_ref) for g, g_ref in zip(grads, grads_ref)]


def check(names, errors):
    report = ", ".join(f"{name} {error:.1e}" for name, error in zip(names, errors))
    assert max(errors) <= BOUND, f"relative errors above {BOUND}: {report}"
