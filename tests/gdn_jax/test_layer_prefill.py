"""GatedDeltaNet.prefill: the parallel forward's output and a cache from which `step` goes on
as the parallel forward over the longer sequence would."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import GatedDeltaNet
from tests.seeds import case_seed

MODULE = GatedDeltaNet(num_heads=2, head_dim=4, num_v_heads=4, v_head_dim=3, conv_size=4,
                       chunk_size=8, implementation="reference")


@pytest.mark.slow
def test_prefill_then_steps_reproduce_the_parallel_forward():
    seed = case_seed(1)
    x = jnp.asarray(np.random.default_rng(seed).standard_normal((2, 11, 10), np.float32))
    variables = jax.jit(MODULE.init)(jax.random.PRNGKey(seed + 1), x)
    full = jax.jit(MODULE.apply)(variables, x)
    # jitted: one compiled step serves every position (op by op, each step re-ran every op)
    prefill = jax.jit(lambda variables, x: MODULE.apply(variables, x, method="prefill"))
    step = jax.jit(lambda variables, x, cache: MODULE.apply(variables, x, cache, method="step"))
    # the inputs sliced on the host (op by op, each slice of x compiled a program of its own)
    x_host = np.asarray(x)
    for prefix in (2, 7):       # shorter and longer than the conv history (conv_size - 1 = 3)
        y, cache = prefill(variables, x_host[:, :prefix])
        assert jax.tree.map(jnp.shape, cache) == jax.tree.map(jnp.shape, MODULE.init_cache(2))
        stepped = [y]
        for t in range(prefix, x.shape[1]):
            y_t, cache = step(variables, x_host[:, t], cache)
            stepped.append(np.asarray(y_t)[:, None])
        np.testing.assert_allclose(np.concatenate(stepped, axis=1), full, atol=1e-5, rtol=1e-5,
                                   err_msg=f"prefix {prefix}, seed {seed}")
