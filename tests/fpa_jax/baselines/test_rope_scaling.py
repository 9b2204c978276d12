"""RoPE scaling for a longer context (fpa_jax/baselines/rope_scaling.py): YaRN's frequencies,
its attention factor and ABF's base against hand-computed values; YaRN's rotation is RoPE's at
factor 1, keeps the scores a function of the relative position, and scales the norms by the
attention factor."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines.rope import apply_rope
from fpa_jax.baselines.rope_scaling import (YarnScaling, abf_base, rotate_yarn,
                                            yarn_attention_factor, yarn_frequencies)
from tests.seeds import case_seed


def test_yarn_frequencies_by_hand():
    # D = 8, base 1e4: omega = 1, 0.1, 0.01, 0.001; L0 = 64 -> turns = 64 omega / (2 pi)
    # = 10.186, 1.0186, 0.1019, 0.0102; ramp = (turns - 1) / 31 clipped = 0.29633, 0.00060, 0, 0
    got = np.asarray(yarn_frequencies(8, 1e4, YarnScaling(4.0, 64)))
    ramp0 = (64 / (2 * math.pi) - 1) / 31
    ramp1 = (6.4 / (2 * math.pi) - 1) / 31
    expected = [ramp0 + (1 - ramp0) / 4, 0.1 * (ramp1 + (1 - ramp1) / 4), 0.01 / 4, 0.001 / 4]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(expected[:2], [0.472245, 0.025045], rtol=1e-4)
    assert yarn_attention_factor(4.0) == pytest.approx(1.0 + 0.1 * math.log(4.0))
    assert abf_base(1e4, 4.0, 16) == pytest.approx(1e4 * 4.0 ** (16 / 14))


def test_yarn_rotation_is_rope_at_factor_one_and_keeps_relative_positions():
    rng = np.random.default_rng(case_seed(1402))
    q, k = (jnp.asarray(rng.normal(size=(2, 7, 3, 8)), jnp.float32) for _ in range(2))
    positions = jnp.asarray(rng.integers(0, 500, size=(2, 7)), jnp.int32)
    q1, k1 = rotate_yarn(q, k, positions, base=500.0, scaling=YarnScaling(1.0, 32))
    np.testing.assert_allclose(q1, apply_rope(q, positions, base=500.0), atol=1e-5)
    np.testing.assert_allclose(k1, apply_rope(k, positions, base=500.0), atol=1e-5)

    scaling = YarnScaling(float(rng.uniform(2, 16)), int(rng.integers(8, 128)))
    offset = int(rng.integers(1, 1000))
    scores = []
    for shift in (0, offset):
        qr, kr = rotate_yarn(q, k, positions + shift, base=500.0, scaling=scaling)
        scores.append(np.einsum("bthd,bshd->bhts", qr, kr))
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-3, atol=1e-3)
    qr, _ = rotate_yarn(q, k, positions, base=500.0, scaling=scaling)
    np.testing.assert_allclose(np.linalg.norm(qr, axis=-1),
                               yarn_attention_factor(scaling.factor) * np.linalg.norm(q, axis=-1),
                               rtol=1e-5)
    assert np.abs(np.asarray(qr) / yarn_attention_factor(scaling.factor) - q1).max() > 1e-2
