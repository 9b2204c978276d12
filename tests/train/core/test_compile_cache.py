"""train.compile_cache: which directory JAX's persistent cache uses for a run, and that a cache
set outside the run's config (the environment, the calling process) is kept."""

from pathlib import Path

import jax
import pytest

from train.core import compile_cache
from train.core.config import Config, ConfigError, TrainConfig
from train.core.validation import validate


def test_cache_directory_by_setting(tmp_path):
    assert compile_cache.cache_directory("run", tmp_path) == tmp_path / "compile_cache"
    assert compile_cache.cache_directory("off", tmp_path) is None
    assert compile_cache.cache_directory("~/xla", tmp_path) == Path.home() / "xla"
    assert compile_cache.cache_directory("/shared/xla", tmp_path) == Path("/shared/xla")


def test_enable_sets_the_run_cache_only_where_none_is_set(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert compile_cache.enable("off", tmp_path) == "compile cache: off"
        assert jax.config.jax_compilation_cache_dir is None
        line = compile_cache.enable("run", tmp_path)
        assert line == f"compile cache: {tmp_path / 'compile_cache'}"
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "compile_cache")
        assert (tmp_path / "compile_cache").is_dir()
        other = tmp_path / "other"
        assert compile_cache.enable(str(other), other) == (
            f"compile cache: {tmp_path / 'compile_cache'} (set outside the run's config)")
        assert not other.exists()
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_an_unwritable_directory_is_one_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        with pytest.raises(ValueError, match=f"train.compile_cache: cannot create {blocker}/xla"):
            compile_cache.enable(str(blocker / "xla"), tmp_path)
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_an_empty_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="train.compile_cache must be 'run', 'off' or a directory"):
        validate(Config(train=TrainConfig(compile_cache=" ")))
