"""bf16 gradients of the blocked ("xla") paths against float32 from the same rounded inputs.

    rel(x) = ||x_bf16 - x_f32|| / ||x_f32||    (over the whole array, float64 norms)

q, k, v and the output cotangent are rounded to bf16 once; the bf16 run takes them as they are,
the float32 oracle (the dense "reference" path) takes the same values in float32, so rel
measures only the rounding inside the bf16 path. Every output and gradient must stay within
BOUND = 5e-3 (bf16 carries 8 mantissa bits: single roundings give about 2e-3).

Issue 16: FoX's d log_forget_u sums dS_ts over the pairs s < u <= t, a small difference of
row and column sums of dS. With d row_bias taken from the identity sum_s dS_ts = dlse_t and
d col_bias summed from a dS whose Delta came from the bf16-rounded output, the two no longer
cancelled: 7.6e-3 .. 2.4e-2 at SHAPE over 18 draws (2.2e-2 at T = 1000); now 1.1e-3 .. 1.8e-3.
FPA's dbeta has the same per-row Delta error (fpa/xla_vjp.py): see the pinned case below.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax import fields, fox_attention, fpa_attention, softmax_attention
from tests.seeds import case_seed

BOUND = 5e-3
SHAPE = (2, 330, 2, 32)  # (B, T, H, D): T not a multiple of the block, 11 key blocks
BLOCK = 32


def _rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _bf16_inputs(seed, shape):
    """q, k, v in bf16 and an output weight whose values are bf16 numbers (kept float32)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v = (jax.random.normal(key, shape).astype(jnp.bfloat16) for key in keys[:3])
    weight = jax.random.normal(keys[3], shape).astype(jnp.bfloat16).astype(jnp.float32)
    return q, k, v, weight


def _rel_errors(attend, weight, q, k, v, *extras):
    """rel of out and of every gradient: attend(impl, q, k, v, *extras) in bf16 vs f32 oracle."""
    def run(implementation, q, k, v):
        def loss(*args):
            out = attend(implementation, *args)
            return jnp.sum(out.astype(jnp.float32) * weight), out
        argnums = tuple(range(3 + len(extras)))
        grad_fn = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))
        grads, out = grad_fn(q, k, v, *extras)
        return out, grads

    out, grads = run("xla", q, k, v)
    out_ref, grads_ref = run("reference", *(x.astype(jnp.float32) for x in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    assert all(g.dtype == jnp.bfloat16 for g in grads[:3])
    return [_rel(out, out_ref)] + [_rel(g, g_ref) for g, g_ref in zip(grads, grads_ref)]


def _check(names, errors):
    report = ", ".join(f"{name} {error:.1e}" for name, error in zip(names, errors))
    assert max(errors) <= BOUND, f"relative errors above {BOUND}: {report}"


@pytest.mark.parametrize("case", [0, 1])
def test_fox_bf16_gradients_match_float32(case):
    seed = case_seed(1600 + case)
    q, k, v, weight = _bf16_inputs(seed, SHAPE)
    gate_logit = 3.0 + jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                                          SHAPE[:3])
    log_forget = jax.nn.log_sigmoid(gate_logit)  # forget gates around 0.95, float32

    def attend(implementation, q, k, v, log_forget):
        return fox_attention(q, k, v, log_forget, implementation=implementation,
                             block_size=BLOCK)

    errors = _rel_errors(attend, weight, q, k, v, log_forget)
    _check(["out", "dq", "dk", "dv", "dlog_forget"], errors)


def test_softmax_bf16_gradients_match_float32():
    q, k, v, weight = _bf16_inputs(case_seed(1610), SHAPE)

    def attend(implementation, q, k, v):
        return softmax_attention(q, k, v, implementation=implementation, block_size=BLOCK)

    errors = _rel_errors(attend, weight, q, k, v)
    _check(["out", "dq", "dk", "dv"], errors)


# ------------------------------------------------------------------------------------- FPA

FPA_SHAPE = (2, 200, 4, 32)
FPA_NAMES = ["out", "dq", "dk", "dv", "dphi", "dpsi", "dbeta"]
FPA_DBETA_BOUND = 2 * BOUND  # until the FPA backward's Delta is float32 (see the pinned case)


def _fpa_errors(seed):
    """rel of FPA's out and gradients; walk step and offsets of random scale, beta in [0.2, 2]."""
    batch, length, heads, _ = FPA_SHAPE
    keys = jax.random.split(jax.random.PRNGKey(seed), 9)
    q, k, v = (jax.random.normal(key, FPA_SHAPE).astype(jnp.bfloat16) for key in keys[:3])
    weight = jax.random.normal(keys[4], FPA_SHAPE).astype(jnp.bfloat16).astype(jnp.float32)
    step_scale, offset_scale = jnp.exp(jax.random.uniform(keys[5], (2,), minval=-3, maxval=0.5))
    phi, psi = fields(step_scale * jax.random.normal(keys[6], FPA_SHAPE[:3]),
                      offset_scale * jax.random.normal(keys[7], FPA_SHAPE[:3]),
                      offset_scale * jax.random.normal(keys[8], FPA_SHAPE[:3]))
    beta = jax.random.uniform(keys[3], (heads,), minval=0.2, maxval=2.0)

    def attend(implementation, q, k, v, phi, psi, beta):
        return fpa_attention(q, k, v, phi, psi, beta, implementation=implementation,
                             block_size=BLOCK)

    return _rel_errors(attend, weight, q, k, v, phi, psi, beta)


def test_fpa_bf16_gradients_match_float32():
    errors = _fpa_errors(case_seed(1620))
    _check(FPA_NAMES[:-1], errors[:-1])
    assert errors[-1] <= FPA_DBETA_BOUND, f"dbeta {errors[-1]:.1e}"


@pytest.mark.xfail(strict=True, reason=(
    "issue 16, FPA side: fpa/xla_vjp.py takes Delta_t = <dout_t, out_t> from the bf16-rounded "
    "out; dbeta = sum_ts min(0, R_ts - psi_s) dS_ts keeps that per-row error (7.0e-3 here, "
    "2.4e-3 with the float32 out as the residual, 4e-7 with dbeta centred per row). "
    "Once fixed: drop this mark and FPA_DBETA_BOUND."))
def test_fpa_bf16_dbeta_pinned_case():
    errors = _fpa_errors(0)  # a fixed case where the bf16-out Delta shows clearly
    _check(FPA_NAMES, errors)
