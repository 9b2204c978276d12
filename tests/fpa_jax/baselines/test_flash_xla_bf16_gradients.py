"""bf16 outputs and gradients of FoX and softmax attention on the blocked path
(fpa_jax/baselines/flash_xla.py, implementation="xla") within BOUND = 5e-3 of float32 from the
same rounded inputs (tests/bf16_errors.py).

FoX's d log_forget_u sums dS_ts over the pairs s < u <= t, a small difference of row and
column sums of dS. Both bias gradients must sum the same float32 dS, with Delta taken from the
float32 out: a d row_bias from the identity sum_s dS_ts = dlse_t next to a d col_bias summed
from a dS whose Delta came from the bf16-rounded output does not cancel (7.6e-3 .. 2.4e-2 at
SHAPE over 18 draws, 2.2e-2 at T = 1000, against 1.1e-3 .. 1.8e-3 when both come from one dS).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax import fox_attention, softmax_attention
from tests.bf16_errors import BLOCK, bf16_inputs, check, rel_errors
from tests.seeds import case_seed

SHAPE = (2, 330, 2, 32)  # (B, T, H, D): T not a multiple of the block, 11 key blocks


@pytest.mark.parametrize("case", [0, 1])
def test_fox_bf16_gradients_match_float32(case):
    seed = case_seed(1600 + case)
    q, k, v, weight = bf16_inputs(seed, SHAPE)
    gate_logit = 3.0 + np.random.default_rng(seed + 1).standard_normal(SHAPE[:3], np.float32)
    # log sigmoid: forget gates around 0.95, float32
    log_forget = jnp.asarray(-np.logaddexp(np.float32(0), -gate_logit))

    def attend(implementation, q, k, v, log_forget):
        return fox_attention(q, k, v, log_forget, implementation=implementation,
                             block_size=BLOCK)

    errors = rel_errors(attend, weight, q, k, v, log_forget)
    check(["out", "dq", "dk", "dv", "dlog_forget"], errors)


def test_softmax_bf16_gradients_match_float32():
    q, k, v, weight = bf16_inputs(case_seed(1610), SHAPE)

    def attend(implementation, q, k, v):
        return softmax_attention(q, k, v, implementation=implementation, block_size=BLOCK)

    errors = rel_errors(attend, weight, q, k, v)
    check(["out", "dq", "dk", "dv"], errors)
