"""Fixtures shared by the trainer tests."""

import os

import pytest

from tests.devices import REPO


@pytest.fixture(scope="module")
def environment():
    """Environment for trainer subprocesses: CPU JAX and the repo importable. They inherit the
    session's persistent compilation cache (tests/conftest.py), so repeated runs of the same
    step compile once."""
    return dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
