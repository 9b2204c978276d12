"""GatedDeltaNet keeps q, k, v for its backward pass only where the op needs more than its
inputs: with the "pallas" op (interpreted here; its backward reruns the forward from q, k, v)
they are recomputed from the projections the convolutions keep, with the same gradients; with
"xla" (which keeps its chunk states) they are kept."""

import collections
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import GatedDeltaNet
from gdn_jax.ops import api, short_conv
from mixer_core import interpret
from tests.seeds import case_seed

BATCH, LENGTH, WIDTH, HEADS, DIM = 1, 33, 32, 1, 64


def _module(implementation):
    return GatedDeltaNet(num_heads=HEADS, head_dim=DIM, num_v_heads=2 * HEADS,
                         implementation=implementation)


def _variable_shapes(module, x):
    return nn.meta.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(0), x))


def _setup(seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((BATCH, LENGTH, WIDTH)), jnp.float32)
    variables = jax.tree_util.tree_map(
        lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype),
        _variable_shapes(_module("xla"), x))
    return x, variables


def _pullback(module, x):
    return lambda variables: jax.vjp(lambda v: module.apply(v, x), variables)[1]


def _kept(module, variables, x):
    """How many arrays the backward keeps that have the shape of the op's q or k."""
    pullback = jax.eval_shape(_pullback(module, x), variables)
    return sum(leaf.shape == (BATCH, LENGTH, HEADS, DIM)
               for leaf in jax.tree_util.tree_leaves(pullback))


def _kept_and_grads(module, variables, x, cotangent):
    """(`_kept`, the parameters' gradients)."""
    grads = jax.jit(lambda v: _pullback(module, x)(v)(cotangent)[0])(variables)
    return _kept(module, variables, x), grads


@pytest.mark.slow
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
    assert _kept(_module("xla"), variables, x) >= 2


def test_the_recompute_adds_only_the_convolutions_forward(monkeypatch):
    """Lowered for Hopper (bf16), the layer's value and gradient run the convolutions' forward
    kernel six times (three in the forward pass, three recomputed), the op's WY and state
    kernels twice (the forward pass and the op's own rerun) and its output kernel once: the
    recompute's rerun of the op, whose output nothing reads, is dropped."""
    hopper = lambda: {"platform": "gpu", "compute_capability": "9.0"}    # noqa: E731
    monkeypatch.setattr(api, "platform_facts", hopper)
    monkeypatch.setattr(short_conv, "platform_facts", hopper)
    module = GatedDeltaNet(num_heads=2, head_dim=64, dtype=jnp.bfloat16)
    x = jnp.zeros((1, 128, 128), jnp.bfloat16)
    variables = _variable_shapes(module, x)     # traced and lowered only

    def loss(variables, x):
        return jnp.sum(module.apply(variables, x).astype(jnp.float32))

    text = jax.jit(jax.value_and_grad(loss)).trace(variables, x).lower(
        lowering_platforms=("cuda",)).as_text()
    calls = collections.Counter(re.findall(r'call @"?([\w<>.-]+)', text))
    runs = collections.Counter()
    for function in re.split(r"\n\s*func\.func ", text)[1:]:
        name = re.match(r'(?:public |private )?@"?([\w<>.-]+)', function)
        kernel = re.search(r"((?:delta_rule|short_conv)_[a-z_]+?)_mosaic_gpu", function)
        if name and kernel:
            runs[kernel.group(1)] += calls[name.group(1)]
    assert runs["short_conv_forward"] == 6 and runs["short_conv_backward"] == 3
    assert runs["delta_rule_wy_prepare"] == runs["delta_rule_forward_states"] == 2
    assert runs["delta_rule_chunk_outputs"] == 1
