"""JAX's persistent compilation cache for `fit` (train.compile_cache): a command run again, or a
run resumed, loads its compiled programs instead of compiling them again (the 125M attention
train steps take 10-40 s to compile on one GPU; docs/benchmarks.md).

    train.compile_cache = "run"    <run_dir>/compile_cache (the default: the run's own programs)
                        = "off"    no cache
                        = DIR      a directory shared by runs (JAX keys each program by its
                                   computation, compile options and devices; a relative DIR is
                                   taken from the working directory)

A cache JAX was already given (JAX_COMPILATION_CACHE_DIR, or jax.config in the calling process)
is kept. The cache a run sets holds for that run only (`RunCache`): the next `fit` in the same
process (the stages of a schedule, the models of a comparison) sets its own. The cache is
trusted code: a directory others can write to lets them run code in the training process, so
a shared DIR must be writable by its owner alone.
"""

from __future__ import annotations

from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

DIRNAME = "compile_cache"   # train.compile_cache = "run": <run_dir>/DIRNAME


def cache_directory(setting: str, run_dir: str | Path) -> Path | None:
    """The directory train.compile_cache names for this run, or None for "off"."""
    if setting == "off":
        return None
    if setting == "run":
        return Path(run_dir) / DIRNAME
    return Path(setting).expanduser()


class RunCache:
    """The persistent cache of one run: construction checks the directory (a ValueError naming
    it if it cannot be created); `with RunCache(...) as line:` points JAX at it for the block
    (unless a cache was set outside the run) and yields the startup line that says which cache
    is used; on leaving, a cache it set is unset again, so JAX neither writes to a run
    directory that a failed start removed nor serves the next run from this one's."""

    def __init__(self, setting: str, run_dir: str | Path):
        current = jax.config.jax_compilation_cache_dir
        self.directory = None if current else cache_directory(setting, run_dir)
        if current:
            self.line = f"compile cache: {current} (set outside the run's config)"
        elif self.directory is None:
            self.line = "compile cache: off"
        else:
            self.line = f"compile cache: {self.directory}"
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise ValueError(f"train.compile_cache: cannot create {self.directory} "
                                 f"({error.strerror}); name a writable directory, or 'off'") \
                    from None

    def __enter__(self) -> str:
        if self.directory is not None:
            _point_at(str(self.directory))
        return self.line

    def __exit__(self, *exc_info) -> None:
        if self.directory is not None:
            _point_at(None)


def _point_at(directory: str | None) -> None:
    """JAX reads the cache directory once, at its first compile: setting another one takes a
    reset of what it read."""
    compilation_cache.reset_cache()
    compilation_cache.set_cache_dir(directory)
