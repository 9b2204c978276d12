"""Fixtures shared by the trainer tests."""

import os

import pytest

from tests.devices import REPO
from tests.seeds import case_seed
from tests.train.tiny_run import TINY_FPA, fit_tiny_run


@pytest.fixture(scope="module")
def environment():
    """Environment for trainer subprocesses: CPU JAX and the repo importable. They inherit the
    session's persistent compilation cache (tests/conftest.py), so repeated runs of the same
    step compile once."""
    return dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")


@pytest.fixture(scope="session")
def tiny_trained_run(tmp_path_factory):
    """`fit_tiny_run` (2 steps on 12 documents), trained once per session (by each xdist worker
    that needs it) for the tests that only need some finished tiny run: they read it, or write
    into a copy of it (`tiny_run.copy_run`)."""
    return fit_tiny_run(tmp_path_factory.mktemp("tiny_trained_run"), seed=case_seed(3101))


@pytest.fixture(scope="session")
def tiny_fpa_run(tmp_path_factory):
    """`fit_tiny_run` of the tiny_fpa preset at the tiny LM's size (2 steps on 6 documents),
    trained once per session for the tests that read a finished FPA run (generate, export)."""
    return fit_tiny_run(tmp_path_factory.mktemp("tiny_fpa_run"), seed=case_seed(7300),
                        documents=6, preset="tiny_fpa", overrides=tuple(TINY_FPA))
