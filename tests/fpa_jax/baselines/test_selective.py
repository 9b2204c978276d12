"""Selective Attention (fpa_jax/baselines/selective.py) on a hand-computed case: a token's
selection hides a key from the later queries only, the document start is never selected, and
selections of later keys or by the last token change nothing."""

import jax.numpy as jnp
import numpy as np

from fpa_jax.baselines import selective_attention
from tests.fpa_jax.baselines.attention_cases import _close, _uniform_content


def test_selective_hand_computed_case():
    q, k, v = _uniform_content(4)
    selection = np.full((1, 4, 4), -1.0, np.float32)  # negative: relu gives 0
    selection[0, 2, 1] = 2.0   # token 2 selects token 1: hidden from query 3 on (not from 2)
    selection[0, 1, 0] = 9.0   # token 0 is the document start: never selected
    selection[0, 3, 2] = 5.0   # acts only on queries after 3: none
    selection[0, 1, 2] = 7.0   # s > u: ignored
    out = np.asarray(selective_attention(q, k, v, jnp.asarray(selection)))[0, :, 0]
    expected = np.tril(np.ones((4, 4)))
    expected[3, 1] = np.exp(-2.0)
    expected /= expected.sum(-1, keepdims=True)
    _close(out, expected, 1e-6)
