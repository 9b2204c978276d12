"""Dip-sum FPA (fpa_jax/baselines/dipsum.py): the bias equals the dips summed by loops, and
attention with it equals a hand-computed case."""

import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines import dipsum_attention
from fpa_jax.baselines.dipsum import dip_sum_bias
from tests.fpa_jax.baselines.attention_cases import _close, _normal, _uniform_content


def test_dipsum_bias_equals_loops_and_hand_case():
    batch, length, heads = 2, 6, 3
    phi = 2 * _normal(22, (batch, length, heads))
    psi = 2 * _normal(23, (batch, length, heads))
    beta = jnp.array([0.5, 1.0, 2.0])
    bias = np.asarray(dip_sum_bias(phi, psi, beta))
    p, s_, b = np.asarray(phi), np.asarray(psi), np.asarray(beta)
    for i in range(batch):
        for h in range(heads):
            for t in range(length):
                for s in range(t + 1):
                    dips = sum(min(0.0, p[i, u, h] - s_[i, s, h]) for u in range(s + 1, t + 1))
                    assert bias[i, h, t, s] == pytest.approx(b[h] * dips, rel=1e-5, abs=1e-5)
    # Hand case: field 0, -1, -1 after a key of level 0 -> b_20 = beta * (-1 - 1).
    q, k, v = _uniform_content(3)
    field = jnp.array([0.0, -1.0, -1.0]).reshape(1, 3, 1)
    out = np.asarray(dipsum_attention(q, k, v, field, jnp.zeros((1, 3, 1)), jnp.array([1.5])))
    # b_10 = 1.5 * -1, b_20 = 1.5 * -2, b_21 = 1.5 * min(0, -1 - 0) = -1.5
    expected = np.array([[1, 0, 0], [np.exp(-1.5), 1, 0], [np.exp(-3.0), np.exp(-1.5), 1]])
    expected /= expected.sum(-1, keepdims=True)
    _close(out[0, :, 0], expected, 1e-6)
