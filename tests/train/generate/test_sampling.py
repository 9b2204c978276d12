"""Next-token sampling (train/generate/sampling.py): top-k of 1, a tiny top-p and temperature 0
all give the argmax, draws with top-k stay among the k largest logits, and SamplingConfig
refuses a negative temperature or top_k and a top_p of 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from train.generate.sampling import SamplingConfig, sample
from tests.seeds import case_seed


def test_sampling_cuts():
    seed = case_seed(32)
    key = jax.random.PRNGKey(seed)
    logits = jnp.asarray(3 * np.random.default_rng(seed).standard_normal((3, 50), np.float32))
    greedy = np.asarray(jnp.argmax(logits, -1))
    for config in (SamplingConfig(1.0, top_k=1), SamplingConfig(1.0, top_p=1e-6),
                   SamplingConfig(0.0)):
        np.testing.assert_array_equal(sample(logits, key, config, 50), greedy)
    top3 = np.argsort(-np.asarray(logits), -1)[:, :3]
    draws = jax.vmap(lambda k: sample(logits, k, SamplingConfig(2.0, top_k=3), 50))(
        jax.random.split(key, 64))
    assert all(set(np.asarray(draws[:, row])) <= set(top3[row]) for row in range(3))
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)
