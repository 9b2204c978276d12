"""The session's random seed (see tests/conftest.py), mixed with a per-case number."""

import os

import numpy as np


def run_seed() -> int:
    return int(os.environ.setdefault("TEST_SEED", str(np.random.SeedSequence().entropy % 2**31)))


def case_seed(case: int) -> int:
    """A 31-bit seed for one test case, different in every session."""
    return int(np.random.SeedSequence([run_seed(), case]).generate_state(1)[0] % 2**31)
