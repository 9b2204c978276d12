"""The files of a run beside its checkpoints, and the provenance recorded with each step.

    run_dir/config.json            the run's resolved config (JSON), written once; a later,
                                   different config is kept beside it as config.<time>.json
    run_dir/tokenizer/             the run's tokenizer, written once (a run keeps one)

`library_versions()` and `code_revision()` (the git commit of the checkout holding this code)
go into every checkpoint's record (train/checkpoint/manager.py).
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from train.data.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


CONFIG_FILENAME = "config.json"


TOKENIZER_DIRNAME = "tokenizer"


_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain",
                       "tokenizers", "numpy")


def json_safe(value: Any, where: str) -> Any:
    """`value` as plain JSON types (tuples -> lists, numpy scalars -> Python, paths -> str)."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{where}: cannot store {type(value).__name__} {value!r} as JSON")


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


@functools.cache
def code_revision() -> dict[str, Any] | None:
    """{"commit": HEAD's sha, "dirty": tracked files changed} of the git checkout holding
    this module; None outside a checkout (or without git)."""
    here = str(Path(__file__).resolve().parent)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def save_run_files(
    run_dir: str | os.PathLike, *, config: Mapping[str, Any], tokenizer=None
) -> None:
    """Writes run_dir/config.json and run_dir/tokenizer/ once, beside the checkpoints.

    config: the run's JSON-serialisable config dict. If config.json exists with different
        content (a resumed run with changed settings), it is kept and the new config is written
        to config.<UTC time>.json, unless an earlier attempt already wrote the same one.
    tokenizer: a train.data.tokenizer tokenizer or None. An existing run_dir/tokenizer must have
        the same fingerprint (ValueError otherwise: changing tokenisation mid-run is an error).
    """
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(config, "config"), indent=2, sort_keys=True) + "\n"
    config_path = run / CONFIG_FILENAME
    if not config_path.exists():
        config_path.write_text(text)
    elif config_path.read_text() != text and not any(
            copy.read_text() == text for copy in run.glob("config.*.json")):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        config_path.with_name(f"config.{stamp}.json").write_text(text)
        log.info("config differs from %s (the trainer warns naming the keys); kept it and "
                 "wrote config.%s.json", config_path, stamp)
    if tokenizer is None:
        return
    tokenizer_dir = run / TOKENIZER_DIRNAME
    if tokenizer_dir.exists():
        saved = load_tokenizer(tokenizer_dir)
        if saved.fingerprint != tokenizer.fingerprint:
            raise ValueError(
                f"tokenizer: differs from the one saved in {tokenizer_dir} "
                f"({tokenizer!r} vs {saved!r}); a run keeps one tokenizer"
            )
    else:
        tokenizer.save(tokenizer_dir)


class RunConfigError(ValueError):
    """run_dir/config.json exists but is not a JSON object (damaged or edited by hand)."""


def load_run_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The config dict written by `save_run_files`; FileNotFoundError naming the directory
    when it is not a run directory, RunConfigError naming the file when it is not a JSON
    object."""
    path = Path(run_dir) / CONFIG_FILENAME
    if not Path(run_dir).exists():
        raise FileNotFoundError(f"{run_dir}: run directory does not exist")
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no {CONFIG_FILENAME})")
    try:
        config = json.loads(path.read_text())
    except UnicodeDecodeError as error:
        raise RunConfigError(f"{path} is not valid JSON (not UTF-8 text: {error.reason} at "
                             f"byte {error.start})") from error
    except json.JSONDecodeError as error:
        raise RunConfigError(f"{path} is not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise RunConfigError(f"{path} is not a JSON object (holds a {type(config).__name__})")
    return config
