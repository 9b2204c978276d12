"""The operands of the "pallas" gated delta rule's XLA matrix products (`vjp.XLA_OPERANDS`):
the 16-bit product's hand-written backward against autodiff of the float32 product, and the
op with "16-bit" operands against the float32 oracle at the bf16 bar."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax.ops import api
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.gated_delta import vjp
from tests.mixer_kernels.mosaic_gpu.gated_delta.op_cases import op_arguments
from tests.seeds import case_seed

SPECS = {   # the op's products: spec, shapes of a and b
    "outputs_from_states": ("bnchk,nbhgkv->nbhgcv", (2, 3, 8, 1, 16), (3, 2, 1, 2, 16, 8)),
    "state_weights": ("nbhck,nbhkv->nbhcv", (3, 2, 2, 8, 16), (3, 2, 2, 16, 8)),
    "state_gradient": ("nbhcv,nbhkv->nbhck", (3, 2, 2, 8, 8), (3, 2, 2, 16, 8)),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_16_bit_product_and_its_backward_are_the_float32_ones_on_16_bit_values(name):
    """On values that bf16 represents exactly, rounding changes nothing: the product and both
    cotangents equal float32 autodiff up to summation order (a wrong transposed spec fails)."""
    spec, a_shape, b_shape = SPECS[name]
    rng = np.random.default_rng(case_seed(390 + list(SPECS).index(name)))
    # bf16 values kept in float32, drawn with NumPy (jax.random would compile per shape)
    bf16_values = lambda shape: jnp.asarray(
        rng.standard_normal(shape, np.float32).astype(jnp.bfloat16).astype(np.float32))
    a, b = bf16_values(a_shape), bf16_values(b_shape)
    out_shape = jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), a, b).shape
    cotangent = bf16_values(out_shape)
    got, pull = jax.vjp(lambda a, b: vjp._product(spec, a, b, jnp.bfloat16), a, b)
    want, pull_want = jax.vjp(
        lambda a, b: jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST), a, b)
    assert got.dtype == jnp.float32
    for g, w in zip((got, *pull(cotangent)), (want, *pull_want(cotangent))):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setattr(vjp, "XLA_OPERANDS", "bf16")
    with pytest.raises(ValueError, match="XLA_OPERANDS"):
        vjp._xla_operands(jnp.bfloat16, jnp.float32)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.slow
def test_16_bit_operands_stay_at_the_bf16_bar(monkeypatch):
    """bf16 inputs, ragged T over 3 chunks, a reset, HV = 2H: output and gradients within 1e-2
    of the float32 oracle on the same rounded inputs, and within 2x the float32-operand error
    (or 3e-3)."""
    args, segment_ids, d_out = op_arguments(case_seed(395), 150, dtype=jnp.bfloat16,
                                            boundary=70)

    def run(implementation, arrays, operands="float32"):
        monkeypatch.setattr(vjp, "XLA_OPERANDS", operands)

        def loss(*xs):
            out, _ = api.gated_delta_rule(*xs, segment_ids=segment_ids,
                                          implementation=implementation)
            return jnp.sum(d_out * out.astype(jnp.float32)), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))(
            *arrays)
        return (out, *grads)

    with interpret.gpu_interpret():
        sixteen = run("pallas", args, "16-bit")
        thirty_two = run("pallas", args)
    oracle = run("reference", [x.astype(jnp.float32) for x in args])
    for name, a, b, c in zip(("out", "dq", "dk", "dv", "dg", "dbeta"), sixteen, thirty_two,
                             oracle):
        assert _rel(a, c) < 1e-2, (name, _rel(a, c))
        assert _rel(a, c) < max(2 * _rel(b, c), 3e-3), (name, _rel(a, c), _rel(b, c))
