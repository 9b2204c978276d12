"""DCP attention (fpa_jax/baselines/dcp.py) on a hand-computed case: a key's weight is the
product of the sigmoids of the mask logits of the tokens after it, up to the query."""

import jax.numpy as jnp
import numpy as np

from fpa_jax.baselines import dcp_attention
from tests.fpa_jax.baselines.attention_cases import _close, _normal, _uniform_content


def test_dcp_hand_computed_case():
    q, k, v = _uniform_content(3)
    mask_logits = jnp.asarray(_normal(21, (1, 3, 3)))
    m = np.asarray(mask_logits[0], np.float64)
    sig = 1 / (1 + np.exp(-m))
    expected = np.array([[1, 0, 0],
                         [sig[1, 0], 1, 0],
                         [sig[1, 0] * sig[2, 0], sig[2, 1], 1]])
    expected /= expected.sum(-1, keepdims=True)
    _close(np.asarray(dcp_attention(q, k, v, mask_logits))[0, :, 0], expected, 1e-6)
