"""Fixtures shared by the trainer tests."""

import os

import pytest

from tests.devices import REPO


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    """Environment for trainer subprocesses: CPU JAX, the repo importable, and one persistent
    compilation cache per test module so repeated runs of the same step compile once."""
    cache = tmp_path_factory.mktemp("jax_cache")
    return dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
                JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
