"""One fresh random seed per test session, shared by all xdist workers.

Tests draw inputs from `run_seed()` mixed with their own case number, so every run checks new
inputs. A failing run is reproduced with `TEST_SEED=<seed shown in the header> ./dev.sh test`.
"""

import os

import numpy as np


def pytest_configure(config):
    os.environ.setdefault("TEST_SEED", str(np.random.SeedSequence().entropy % 2**31))


def pytest_report_header(config):
    return f"TEST_SEED={os.environ['TEST_SEED']} (fresh random inputs; set it to reproduce)"
