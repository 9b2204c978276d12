"""JAX's persistent compilation cache for `fit` (train.compile_cache): a command run again, or a
run resumed, loads its compiled programs instead of compiling them again (the 125M attention
train steps take 10-40 s to compile on one GPU; docs/benchmarks.md).

    train.compile_cache = "run"    <run_dir>/compile_cache (the default: the run's own programs)
                        = "off"    no cache
                        = DIR      a directory shared by runs (JAX keys each program by its
                                   computation, compile options and devices)

A cache JAX was already given (JAX_COMPILATION_CACHE_DIR, or jax.config in the calling process)
is kept. The cache is trusted code: a directory others can write to lets them run code in the
training process, so a shared DIR must be writable by its owner alone.
"""

from __future__ import annotations

from pathlib import Path

import jax

DIRNAME = "compile_cache"   # train.compile_cache = "run": <run_dir>/DIRNAME


def cache_directory(setting: str, run_dir: str | Path) -> Path | None:
    """The directory train.compile_cache names for this run, or None for "off"."""
    if setting == "off":
        return None
    if setting == "run":
        return Path(run_dir) / DIRNAME
    return Path(setting).expanduser()


def enable(setting: str, run_dir: str | Path) -> str:
    """Points JAX's persistent cache at train.compile_cache's directory (before the run compiles
    anything) unless one is set already; returns the startup line that says which is used.
    A directory that cannot be created is a ValueError naming it."""
    current = jax.config.jax_compilation_cache_dir
    if current:
        return f"compile cache: {current} (set outside the run's config)"
    directory = cache_directory(setting, run_dir)
    if directory is None:
        return "compile cache: off"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"train.compile_cache: cannot create {directory} ({error.strerror}); "
                         "name a writable directory, or 'off'") from None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    return f"compile cache: {directory}"
