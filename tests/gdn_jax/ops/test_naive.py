"""The token-by-token gated delta rule (gdn_jax/ops/naive.py), the oracle of the faster forms:
its gradient of every input, in float64 and across a document boundary, against central finite
differences.
"""

import jax
import jax.numpy as jnp
import numpy as np

from gdn_jax.ops import recurrent_gated_delta_rule
from tests.gdn_jax.ops.delta_rule_cases import FAST_COMPILE, make_inputs, packed_segment_ids


def test_recurrent_gradient_matches_float64_finite_differences():
    """Directional derivatives of the oracle (with a document boundary), central differences."""
    rng = np.random.default_rng(92)
    inputs = [np.asarray(x, np.float64) for x in make_inputs(91, 1, 7, 1, 2, 3, 2)]
    out_weights = rng.standard_normal((1, 7, 2, 2))
    segment_ids = packed_segment_ids([[4, 3]], [[0, 1]])

    def loss(*args):
        out, final = recurrent_gated_delta_rule(*args[:5], initial_state=args[5],
                                                output_final_state=True, segment_ids=segment_ids)
        return jnp.sum(out * out_weights) + jnp.sum(jnp.sin(final))

    with jax.enable_x64(True):
        gradient = jax.jit(jax.grad(loss, argnums=tuple(range(6))),
                           compiler_options=FAST_COMPILE)(*inputs)
        assert all(x.dtype == jnp.float64 for x in gradient)
        loss = jax.jit(loss, compiler_options=FAST_COMPILE)
        step = 1e-6
        for _ in range(3):
            directions = [rng.standard_normal(x.shape) for x in inputs]
            plus = loss(*[x + step * d for x, d in zip(inputs, directions)])
            minus = loss(*[x - step * d for x, d in zip(inputs, directions)])
            numeric = float(plus - minus) / (2 * step)
            analytic = sum(float(np.sum(np.asarray(gr) * d)) for gr, d in zip(gradient, directions))
            assert abs(numeric - analytic) < 1e-7 * max(1.0, abs(analytic))
