"""Recomputing a function in the backward pass from its inputs alone
(mixer_core/recompute.py): keeping_inputs_only(body) computes what body computes, with the
gradients of jax's own differentiation of body, while its backward pass keeps nothing but the
inputs (the aux last argument included) and reruns body on them behind an
optimization_barrier."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Var

from mixer_core.recompute import keeping_inputs_only
from tests.seeds import case_seed

B, T, D, E = 2, 5, 3, 4


def body(x, w, gate, segment_ids):
    """Two outputs with intermediates worth keeping (the matmul, the tanh, the mask); masked
    by segment_ids when given (aux: None or integers)."""
    h = jnp.tanh(x @ w) * jax.nn.sigmoid(gate)[..., None]
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        h = jnp.einsum("bts,bse->bte", jnp.tril(same).astype(h.dtype), h)
    return h * jnp.sin(h), jnp.sum(jnp.exp(-h * h), axis=-1)


def inputs(seed, length=T):
    rng = np.random.default_rng(case_seed(seed))
    x = jnp.asarray(rng.standard_normal((B, length, D)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((D, E)), jnp.float32)
    gate = jnp.asarray(rng.standard_normal((B, length)), jnp.float32)
    segment_ids = jnp.asarray(np.sort(rng.integers(0, 3, (B, length)), axis=1), jnp.int32)
    cotangents = (jnp.asarray(rng.standard_normal((B, length, E)), jnp.float32),
                  jnp.asarray(rng.standard_normal((B, length)), jnp.float32))
    return (x, w, gate), segment_ids, cotangents


def assert_trees_close(a, b, **tolerance):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for leaf_a, leaf_b in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(leaf_a, leaf_b, **tolerance)


@pytest.mark.parametrize("length", [T, 1])
@pytest.mark.parametrize("with_segments", [True, False])
def test_values_and_gradients_equal_those_of_body(length, with_segments):
    differentiable, segment_ids, cotangents = inputs(5500 + length, length)
    recomputing = keeping_inputs_only(body)

    @jax.jit      # one compilation each, not op by op
    def value_and_pullback(differentiable, segment_ids, cotangents):
        aux = segment_ids if with_segments else None
        out, pull = jax.vjp(lambda *xs: recomputing(*xs, aux), *differentiable)
        expected_out, expected_pull = jax.vjp(lambda *xs: body(*xs, aux), *differentiable)
        return (out, pull(cotangents)), (expected_out, expected_pull(cotangents))

    (out, grads), (expected_out, expected_grads) = value_and_pullback(
        differentiable, segment_ids, cotangents)
    assert_trees_close(out, expected_out, rtol=1e-6, atol=1e-6)
    assert_trees_close(grads, expected_grads, rtol=1e-5, atol=1e-6)
    # a scalar loss, by jax.grad
    aux = segment_ids if with_segments else None
    loss = lambda xs: sum(jnp.vdot(c, o) for c, o in zip(cotangents,     # noqa: E731
                                                          recomputing(*xs, aux)))
    assert_trees_close(jax.jit(jax.grad(loss))(differentiable), tuple(expected_grads),
                       rtol=1e-5, atol=1e-6)


def test_gradients_under_vmap_equal_those_of_body():
    (x, w, gate), segment_ids, (cotangent, _) = inputs(5502)
    recomputing = keeping_inputs_only(body)

    def per_row(f):
        return lambda x, gate, ids: jnp.vdot(cotangent[0],
                                             f(x[None], w, gate[None], ids[None])[0])

    got = jax.jit(jax.vmap(jax.grad(per_row(recomputing), argnums=(0, 1))))(x, gate,
                                                                          segment_ids)
    expected = jax.jit(jax.vmap(jax.grad(per_row(body), argnums=(0, 1))))(x, gate, segment_ids)
    assert_trees_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_segments", [True, False])
def test_the_backward_pass_keeps_only_the_inputs(with_segments):
    """The residuals of jax.vjp (the leaves of its pullback) are the inputs themselves, aux
    included; body differentiated by jax keeps its intermediates beside them."""
    differentiable, segment_ids, _ = inputs(5503)
    aux = segment_ids if with_segments else None
    _, pull = jax.vjp(lambda *xs: keeping_inputs_only(jax.jit(body))(*xs, aux), *differentiable)
    kept = jax.tree_util.tree_leaves(pull)
    assert all(isinstance(leaf, jax.Array) for leaf in kept)
    wanted = list(differentiable) + ([segment_ids] if with_segments else [])
    assert len(kept) == len(wanted)
    for array in wanted:                 # each input once, by value, whatever the order
        assert sum(a.shape == array.shape and a.dtype == array.dtype
                   and bool(jnp.all(a == array)) for a in kept) == 1, array.shape
    plain_pull = jax.eval_shape(lambda *xs: jax.vjp(lambda *ys: body(*ys, aux), *xs)[1],
                                *differentiable)
    assert any(leaf.shape == (B, T, E) for leaf in jax.tree_util.tree_leaves(plain_pull))


def test_the_backward_pass_reruns_body_behind_an_optimization_barrier():
    differentiable, segment_ids, _ = inputs(5504)
    traced = []

    def counting_body(*args):
        traced.append(len(args))
        return body(*args)

    recomputing = keeping_inputs_only(counting_body)
    loss = lambda *xs: jnp.sum(recomputing(*xs, segment_ids)[0])      # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*differentiable)
    assert traced == [4, 4]              # the forward pass, then the rerun, each with aux
    equations = jaxpr.jaxpr.eqns
    barriers = [i for i, equation in enumerate(equations)
                if equation.primitive.name == "optimization_barrier"]
    assert len(barriers) == 1
    barrier = equations[barriers[0]]
    # the barrier takes the inputs (the three arrays and aux) and nothing else, and the rerun
    # reads them from it, never the arrays the forward pass read
    assert sorted(tuple(v.aval.shape) for v in barrier.invars) == sorted(
        [(B, T, D), (D, E), (B, T), (B, T)])
    arguments = set(jaxpr.jaxpr.invars)
    assert arguments <= set(barrier.invars)
    assert not any(arguments & {v for v in equation.invars if isinstance(v, Var)}
                   for equation in equations[barriers[0] + 1:])
    traced.clear()
    jax.jit(lambda *xs: keeping_inputs_only(counting_body)(*xs, segment_ids))(*differentiable)
    assert traced == [4]                 # no backward pass, no rerun


def test_aux_takes_no_cotangent():
    """aux is undifferentiated: a float aux gets a zero gradient, not body's."""
    (x, _, _), _, _ = inputs(5505)

    def scaled(x, scale):
        return jnp.sum(jnp.sin(x) * scale)

    scale = jnp.float32(3.0)
    grad_x, grad_scale = jax.grad(keeping_inputs_only(scaled), argnums=(0, 1))(x, scale)
    np.testing.assert_allclose(grad_x, 3.0 * np.cos(np.asarray(x)), rtol=1e-6)
    assert float(grad_scale) == 0.0
