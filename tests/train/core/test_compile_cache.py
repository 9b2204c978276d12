"""train.compile_cache: which directory JAX's persistent cache uses for a run, that the run's
cache holds for that run only, and that a cache set outside the run's config is kept."""

import contextlib
from pathlib import Path

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from tests.seeds import case_seed
from tests.train.tiny_run import fit_tiny_run
from train.core import compile_cache
from train.core.config import Config, ConfigError, TrainConfig
from train.core.validation import validate


@contextlib.contextmanager
def no_outside_cache():
    """The block runs as a process whose JAX has no cache directory; the tests' cache
    (tests/conftest.py) is set again after it."""
    before = jax.config.jax_compilation_cache_dir
    jax_cache.reset_cache()
    jax_cache.set_cache_dir(None)
    try:
        yield
    finally:
        jax_cache.reset_cache()
        jax_cache.set_cache_dir(before)


def test_cache_directory_by_setting(tmp_path):
    assert compile_cache.cache_directory("run", tmp_path) == tmp_path / "compile_cache"
    assert compile_cache.cache_directory("off", tmp_path) is None
    assert compile_cache.cache_directory("~/xla", tmp_path) == Path.home() / "xla"
    assert compile_cache.cache_directory("/shared/xla", tmp_path) == Path("/shared/xla")


def test_a_cache_set_outside_the_run_is_kept(tmp_path):
    outside = jax.config.jax_compilation_cache_dir
    assert outside   # tests/conftest.py sets one
    with compile_cache.RunCache("run", tmp_path) as line:
        assert line == f"compile cache: {outside} (set outside the run's config)"
        assert jax.config.jax_compilation_cache_dir == outside
    assert jax.config.jax_compilation_cache_dir == outside
    assert not (tmp_path / "compile_cache").exists()


def test_the_run_cache_holds_for_the_block_only(tmp_path):
    with no_outside_cache():
        with compile_cache.RunCache("off", tmp_path) as line:
            assert line == "compile cache: off"
            assert jax.config.jax_compilation_cache_dir is None
        shared = tmp_path / "shared"
        with compile_cache.RunCache(str(shared), tmp_path) as line:
            assert line == f"compile cache: {shared}"
            assert jax.config.jax_compilation_cache_dir == str(shared) and shared.is_dir()
        assert jax.config.jax_compilation_cache_dir is None


def test_an_unwritable_directory_is_one_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with no_outside_cache():
        with pytest.raises(ValueError, match=f"train.compile_cache: cannot create {blocker}/xla"):
            compile_cache.RunCache(str(blocker / "xla"), tmp_path)
        assert jax.config.jax_compilation_cache_dir is None


def test_fit_keeps_its_programs_in_the_run_directory(tmp_path):
    with no_outside_cache():
        run_dir = fit_tiny_run(tmp_path, seed=case_seed(1300))
        assert jax.config.jax_compilation_cache_dir is None     # unset after the run
    assert any((run_dir / "compile_cache").iterdir())


def test_an_empty_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="train.compile_cache must be 'run', 'off' or a directory"):
        validate(Config(train=TrainConfig(compile_cache=" ")))
