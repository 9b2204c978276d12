"""Softmax attention (fpa_jax/baselines/softmax.py): with ALiBi slopes it equals the explicit
distance bias (output and gradients, "reference" and "xla"), and without a bias it is plain
causal softmax."""

import functools

import jax
import numpy as np
import pytest

from fpa_jax.baselines import alibi_slopes, dense_attention, softmax_attention
from tests.fpa_jax.baselines.attention_cases import _close, _normal, _out_and_grads, _qkv


@pytest.mark.parametrize("implementation", ["reference", "xla"])
def test_alibi_equals_explicit_distance_bias(implementation):
    batch, length, heads, dim = 2, 40, 3, 8
    q, k, v = _qkv(15, (batch, length, heads, dim))
    slopes = alibi_slopes(heads)
    positions = np.arange(length)
    bias = -np.asarray(slopes)[None, :, None, None] * (positions[:, None] - positions[None, :])
    weight = _normal(16, (batch, length, heads, dim))
    ours = lambda q, k, v: softmax_attention(q, k, v, alibi_slopes=slopes,
                                             implementation=implementation, block_size=16)
    explicit = lambda q, k, v: dense_attention(q, k, v, bias)[0]
    out, grads = _out_and_grads(ours, weight, q, k, v)
    out_ref, grads_ref = _out_and_grads(explicit, weight, q, k, v)
    _close(out, out_ref, 2e-5)
    for grad, grad_ref in zip(grads, grads_ref):
        _close(grad, grad_ref, 5e-5)


def test_softmax_without_bias_is_plain_causal_softmax():
    q, k, v = _qkv(17, (1, 6, 1, 4))
    logits = np.einsum("td,sd->ts", q[0, :, 0], k[0, :, 0]) / 2.0
    logits = np.where(np.tril(np.ones((6, 6), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ np.asarray(v[0, :, 0])
    for implementation in ("reference", "xla"):
        ours = jax.jit(functools.partial(softmax_attention, implementation=implementation))
        _close(ours(q, k, v)[0, :, 0], expected, 1e-5)
