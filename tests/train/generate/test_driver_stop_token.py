"""Generation (train/generate/driver.py) stops once every row has produced the stop token: it
runs until the last row stops, to max_new_tokens without a stop token, and ends at once when
all rows stop together. The scripted decoder (tests/train/generate/scripted_decoder.py) says
exactly when each row emits the stop token."""

import numpy as np

from tests.seeds import case_seed
from tests.train.generate.scripted_decoder import STOP, generate, script


def test_generation_runs_until_every_row_has_stopped():
    seed = case_seed(2911)
    stop_steps = [0, 2, 5]          # row 0 stops on its first (prefill) token, row 2 last
    table = script(seed, stop_steps, 12)
    table[0, 5] = table[1, 5] = 1   # at row 2's stop no other row repeats the stop token
    table[2, 6:] = 2                # and row 2 never again: no later step has all three
    result, streamed = generate(table, 12)
    assert result.tokens.shape == (3, 6), f"seed {seed}: {result.tokens}"
    np.testing.assert_array_equal(result.tokens, table[:, :6])
    np.testing.assert_array_equal(streamed, result.tokens)
    # without a stop token (or one never produced) it runs to max_new_tokens
    assert generate(table, 12, stop_token=None)[0].tokens.shape == (3, 12)
    assert generate(np.where(table == STOP, 0, table), 12)[0].tokens.shape == (3, 12)
    # all rows stopped at once: generation ends there
    together = script(seed, [3, 3, 3], 12)
    assert generate(together, 12)[0].tokens.shape == (3, 4)
