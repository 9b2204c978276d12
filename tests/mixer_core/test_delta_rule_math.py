"""The delta rule's shared math (mixer_core/delta_rule_math.py): the pair decay matrix of a
chunk."""

import jax.numpy as jnp
import numpy as np

from mixer_core.delta_rule_math import pair_decay_matrix


def test_pair_decay_matrix_is_causal_and_stays_within_documents():
    gamma = jnp.asarray([-0.5, -1.0, -3.0, -3.5])
    expected = np.tril(np.exp(np.asarray(gamma)[:, None] - np.asarray(gamma)[None, :]))
    np.testing.assert_allclose(pair_decay_matrix(gamma, gamma), expected, rtol=1e-6)
    document = jnp.asarray([0, 0, 1, 1])
    same_document = document[:, None] == document[None, :]
    split = pair_decay_matrix(gamma, gamma, same_document)
    np.testing.assert_allclose(split, np.where(np.asarray(same_document), expected, 0.0),
                               rtol=1e-6)
    assert split[2, 1] == 0.0 and split[3, 2] > 0.0
