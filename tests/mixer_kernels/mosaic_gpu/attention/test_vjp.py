"""implementation="pallas" of fpa_attention, fox_attention and softmax_attention (kernel forward
and backward tied by custom_vjp) vs the dense "reference" in the GPU interpreter: the output and
every gradient, under jit and grad; dispatch errors outside the interpreter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax import fox_attention, fpa_attention, softmax_attention
from mixer_core import interpret
from mixer_core.registry import UnsupportedImplementationError
from tests.seeds import case_seed


def _inputs(seed, batch, length, heads, dim=64):
    """Drawn and formed with NumPy (jax.random and op-by-op jnp compile programs per shape)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape, np.float32)
    q, k, v, dout = (normal(batch, length, heads, dim) for _ in range(4))
    phi = np.cumsum(normal(batch, length, heads), axis=1)
    psi = phi + normal(batch, length, heads)
    beta = np.float32(0.3) + rng.uniform(size=heads).astype(np.float32)
    log_forget = -np.logaddexp(np.float32(0), -(normal(batch, length, heads) + np.float32(2)))
    return tuple(map(jnp.asarray, (q, k, v, dout, phi, psi, beta, log_forget)))


def _value_and_grads(op, args, dout, implementation):
    def loss(*a):
        return jnp.sum(op(*a, implementation=implementation) * dout)

    @jax.jit
    def run(*a):
        out = op(*a, implementation=implementation)
        return (out,) + jax.grad(loss, argnums=tuple(range(len(a))))(*a)

    return run(*args)


def _compare(op, args, dout, rtol=1e-4):
    interpret.reset()
    with interpret.gpu_interpret():
        got = _value_and_grads(op, args, dout, "pallas")
    assert not interpret.races_found()
    want = _value_and_grads(op, args, dout, "reference")
    for index, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-2 * np.sqrt(w.size))
        assert err <= rtol, f"output/grad {index}: relative error {err:.2e}"


@pytest.mark.slow
def test_fpa_pallas_matches_reference():
    seed = case_seed(600)
    q, k, v, dout, phi, psi, beta, _ = _inputs(seed, 1, 100, 1)
    segment_ids = jnp.asarray((np.arange(100) >= 1 + seed % 90)[None, :].astype(np.int32))
    op = lambda q, k, v, phi, psi, beta, implementation: fpa_attention(
        q, k, v, phi, psi, beta, segment_ids=segment_ids, implementation=implementation)
    _compare(op, (q, k, v, phi, psi, beta), dout)


def test_fox_pallas_matches_reference():
    seed = case_seed(601)
    q, k, v, dout, *_, log_forget = _inputs(seed, 1, 100, 2)
    _compare(fox_attention, (q, k, v, log_forget), dout)


@pytest.mark.parametrize("alibi", [False, True])
def test_softmax_pallas_matches_reference(alibi):
    seed = case_seed(602 + alibi)
    q, k, v, dout, *_ = _inputs(seed, 1, 70, 2)
    if alibi:
        op = lambda q, k, v, slopes, implementation: softmax_attention(
            q, k, v, alibi_slopes=slopes, implementation=implementation)
        _compare(op, (q, k, v, jnp.array([0.25, 0.0625])), dout)
    else:
        _compare(softmax_attention, (q, k, v), dout)


def test_explicit_pallas_outside_interpreter_says_why():
    q = jnp.zeros((1, 8, 1, 64))
    if jax.default_backend() == "gpu":
        pytest.skip("runs the kernel on a GPU")
    with pytest.raises(UnsupportedImplementationError, match="Hopper"):
        softmax_attention(q, q, q, implementation="pallas")
    head_dim_32 = jnp.zeros((1, 8, 1, 32))
    with interpret.gpu_interpret():
        with pytest.raises(UnsupportedImplementationError, match="head_dim"):
            softmax_attention(head_dim_32, head_dim_32, head_dim_32, implementation="pallas")


@pytest.mark.slow
def test_vmap_of_grad_matches_reference():
    """vmap over an extra leading axis of grad through the kernels' custom VJP."""
    seed = case_seed(604)
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 1, 40, 1, 64), np.float32)) for _ in range(3))
    log_forget = jnp.asarray(-np.logaddexp(np.float32(0), rng.standard_normal((2, 1, 40, 1),
                                                                              np.float32)))

    def grads(implementation):
        loss = lambda *a: jnp.sum(fox_attention(*a, implementation=implementation) ** 2)
        return jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)))

    interpret.reset()
    with interpret.gpu_interpret():
        got = jax.jit(grads("pallas"))(q, k, v, log_forget)
    want = grads("reference")(q, k, v, log_forget)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


HOPPER = dict(platform="gpu", compute_capability="9.0", dtype=jnp.dtype(jnp.bfloat16),
              head_dim=64, value_head_dim=64)


@pytest.mark.parametrize("op", ["fpa", "fox", "softmax"])
def test_default_picks_the_kernel_on_hopper_and_xla_elsewhere(op):
    """None: "pallas" first for FPA / FoX on Hopper; softmax keeps cuDNN first and takes the
    kernel only where cuDNN cannot run (ALiBi, segment_ids); CPU and other dims fall to "xla"."""
    from fpa_jax.baselines import fox, softmax
    from fpa_jax.fpa import api
    registry = {"fpa": api.REGISTRY, "fox": fox.REGISTRY, "softmax": softmax.REGISTRY}[op]
    extra = dict(has_segment_ids=False, has_alibi=False) if op == "softmax" else {}
    pick = lambda **changes: registry.select(None, **{**HOPPER, **extra, **changes})[0]
    assert pick() == ("cudnn" if op == "softmax" else "pallas")
    if op == "softmax":
        assert pick(has_segment_ids=True) == "pallas"
        assert pick(has_alibi=True) == "pallas"
    assert pick(head_dim=96, value_head_dim=96) == ("cudnn" if op == "softmax" else "xla")
    assert pick(dtype=jnp.dtype(jnp.float32)) == "xla"
    assert pick(platform="cpu", compute_capability=None) == "xla"
    assert pick(compute_capability="8.0") in ("cudnn", "xla")


@pytest.mark.parametrize("op", ["fpa", "fox"])
def test_backward_takes_the_forward_pruning_norms(op):
    """The biased ops keep the forward's per-block norms of the pruning test for the backward:
    the traced gradient reduces q and k over D once (two square roots: |q|, |k|), not again in
    the backward program (four)."""
    from mixer_kernels.mosaic_gpu.attention import vjp
    q, k, v, dout, phi, psi, beta, log_forget = _inputs(0, 1, 72, 2)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    if op == "fpa":
        fn = lambda q, k, v: vjp.fpa_pallas(q, k, v, phi, psi, beta, None, scale=0.125)
    else:
        fn = lambda q, k, v: vjp.fox_pallas(q, k, v, log_forget, None, scale=0.125)
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * dout)
    text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert text.count("sqrt") == 2, text.count("sqrt")
