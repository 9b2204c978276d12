"""GatedDeltaNet keeps q, k, v for its backward pass only where the op needs more than its
inputs: with the "pallas" op (interpreted here; its backward reruns the forward from q, k, v)
they are recomputed from the projections the convolutions keep, with the same gradients; with
"xla" (which keeps its chunk states) they are kept."""

import jax
import jax.numpy as jnp
import numpy as np

from gdn_jax import GatedDeltaNet
from mixer_core import interpret
from tests.seeds import case_seed

BATCH, LENGTH, WIDTH, HEADS, DIM = 1, 70, 32, 1, 64


def _module(implementation):
    return GatedDeltaNet(num_heads=HEADS, head_dim=DIM, num_v_heads=2 * HEADS,
                         implementation=implementation)


def _setup(seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((BATCH, LENGTH, WIDTH)), jnp.float32)
    shapes = jax.eval_shape(_module("xla").init, jax.random.PRNGKey(0), x)
    variables = jax.tree_util.tree_map(
        lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype),
        jax.tree_util.tree_map(lambda a: a, shapes, is_leaf=lambda a: hasattr(a, "unbox")))
    return x, jax.tree_util.tree_map(lambda a: a.unbox() if hasattr(a, "unbox") else a,
                                     variables, is_leaf=lambda a: hasattr(a, "unbox"))


def _kept_and_grads(module, variables, x, cotangent):
    """(how many kept arrays have the shape of the op's q or k, the parameters' gradients)."""
    _, pull = jax.vjp(lambda v: module.apply(v, x), variables)
    kept = sum(leaf.shape == (BATCH, LENGTH, HEADS, DIM)
               for leaf in jax.tree_util.tree_leaves(pull))
    return kept, pull(cotangent)[0]


def test_pallas_recomputes_q_k_v_with_the_same_gradients(monkeypatch):
    x, variables = _setup(case_seed(570))
    cotangent = jnp.asarray(np.random.default_rng(case_seed(571)).standard_normal(
        (BATCH, LENGTH, WIDTH)), jnp.float32)
    module = _module("pallas")
    with interpret.gpu_interpret():
        kept, grads = _kept_and_grads(module, variables, x, cotangent)
        monkeypatch.setattr(GatedDeltaNet, "_recomputes_conv_outputs", lambda *_: False)
        kept_without, grads_without = _kept_and_grads(module, variables, x, cotangent)
    assert kept == 0 and kept_without >= 2
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_without)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_xla_keeps_q_k_v():
    x, variables = _setup(case_seed(572))
    kept, _ = _kept_and_grads(_module("xla"), variables, x, jnp.ones((BATCH, LENGTH, WIDTH)))
    assert kept >= 2
