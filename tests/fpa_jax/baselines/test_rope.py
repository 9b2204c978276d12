"""RoPE and the ALiBi slopes (fpa_jax/baselines/rope.py): the slopes for a power of two and
for other head counts, RoPE scores that depend only on the relative position, and the rotation
of the half pairs by position times frequency (the identity at position 0)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines import alibi_slopes, apply_rope
from tests.fpa_jax.baselines.attention_cases import _close, _normal


def test_alibi_slopes_values():
    _close(alibi_slopes(8), [2.0 ** -i for i in range(1, 9)], 0)
    _close(alibi_slopes(1), [2.0 ** -8], 0)
    twelve = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i - 0.5) for i in range(1, 5)]
    _close(alibi_slopes(12), twelve, 1e-7)
    assert alibi_slopes(12).dtype == jnp.float32


def test_rope_scores_depend_only_on_relative_position():
    dim = 16
    q_vec, k_vec = _normal(18, (dim,)), _normal(19, (dim,))

    def score(t, s):
        q = apply_rope(q_vec.reshape(1, 1, 1, dim), jnp.array([[t]]))
        k = apply_rope(k_vec.reshape(1, 1, 1, dim), jnp.array([[s]]))
        return float(jnp.sum(q * k))

    for t, s, shift in [(5, 2, 11), (40, 3, 900), (7, 7, 123)]:
        assert score(t, s) == pytest.approx(score(t + shift, s + shift), rel=1e-4, abs=1e-4)
    by_distance = [score(9, 9 - d) for d in range(8)]
    assert max(by_distance) - min(by_distance) > 1e-3  # it does depend on t - s


def test_rope_rotates_half_pairs_by_position_times_frequency():
    x = _normal(20, (2, 5, 3, 8), jnp.bfloat16)
    positions = jnp.array([[0, 1, 2, 3, 4], [10, 20, 30, 40, 50]])
    rope = jax.jit(apply_rope, static_argnames="base")
    out = rope(x, positions, base=100.0)
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape
    xf = np.asarray(x, np.float64)
    angle = np.asarray(positions, np.float64)[:, :, None, None] * 100.0 ** (-np.arange(4) / 4)
    x1, x2 = xf[..., :4], xf[..., 4:]
    expected = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                               x2 * np.cos(angle) + x1 * np.sin(angle)], axis=-1)
    _close(out, expected, 2e-2)
    _close(rope(x, jnp.zeros((2, 5), jnp.int32)), x, 0)  # position 0: identity
