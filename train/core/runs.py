"""A training run on disk: its config, tokenizer and checkpoints.

    run_dir/config.json       the fully resolved config (train/checkpoint/manager.py save_run_files)
    run_dir/tokenizer/        the run's tokenizer
    run_dir/checkpoints/      Checkpointer steps (train/checkpoint/manager.py)
    run_dir/run.lock          "pid P on HOST" of the one process writing the run (flock'd)

Default run directory (`default_run_dir`): runs/<config name>, plus "-<8 hex>" of a hash of
the resolved config's differences from the preset when there are any, so re-running the same
command (a requeued job) resumes the same run; `new=True` picks runs/<...>-2, -3, ... instead.

One writer per run directory (`claimed_run_dir`): an exclusive flock on run.lock, which the
kernel drops when the holder exits or dies (a lock file left by a dead process is stale and is
taken over). A run that fails before it has written a metric or a checkpoint removes the run
directory it created.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import jax

from train.checkpoint.manager import Checkpointer, RestoredCheckpoint, UnreadableCheckpointError
from train.checkpoint.run_files import CONFIG_FILENAME, TOKENIZER_DIRNAME, load_run_config
from train.core import compile_cache
from train.core.config import Config, changed_from_preset
from train.core.metrics import METRICS_FILE
from train.core.presets import config_from_dict, load_config
from train.core.session import RETIRED_STATE_KEYS, Session
from train.data.tokenizer import Tokenizer, load_tokenizer

CHECKPOINT_DIRNAME = "checkpoints"
LOCK_FILE = "run.lock"
DEFAULT_RUNS_DIR = Path("runs")

log = logging.getLogger(__name__)


class RunLockedError(RuntimeError):
    """Another live process holds the run directory."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIRNAME


def load_run(run_dir: str | Path) -> tuple[Config, Tokenizer]:
    """The config (run_dir/config.json) and tokenizer (run_dir/tokenizer) of a run."""
    run_dir = Path(run_dir)
    config = config_from_dict(load_run_config(run_dir))
    tokenizer_dir = run_dir / TOKENIZER_DIRNAME
    tokenizer = load_tokenizer(tokenizer_dir if tokenizer_dir.exists() else config.data.tokenizer)
    return config, tokenizer


def restore_run_state(run_dir: str | Path, session: Session,
                      step: int | None = None) -> RestoredCheckpoint:
    """The newest (or given) checkpoint of a run, restored onto `session`'s shardings.
    Read-only: nothing in the run directory is moved or deleted (an unreadable newest step is
    skipped, not quarantined; an unreadable requested `step` raises)."""
    checkpointer = Checkpointer(checkpoint_dir(run_dir), read_only=True)
    try:
        if step is None:
            restored = checkpointer.restore_latest(session.abstract_state,
                                                   ignore_saved=RETIRED_STATE_KEYS)
            if restored is None:
                raise FileNotFoundError(f"{run_dir}: no checkpoint in {checkpointer.directory}")
            return restored
        if step not in checkpointer.all_steps():
            raise FileNotFoundError(f"{run_dir}: no checkpoint step {step} (steps: "
                                    f"{checkpointer.all_steps()})")
        try:
            return checkpointer.restore(step, session.abstract_state,
                                        ignore_saved=RETIRED_STATE_KEYS)
        except UnreadableCheckpointError as error:
            raise UnreadableCheckpointError(
                f"{run_dir}: checkpoint step {step} is unreadable: {error}") from error
    finally:
        checkpointer.close()


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Committed checkpoint steps of a run (from the directory names; nothing is opened)."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def default_run_dir(config_source: str | None, config: Config, *, new: bool = False,
                    runs_dir: Path = DEFAULT_RUNS_DIR) -> Path:
    """runs/<name>[-<hash of the differences from the preset>]; with `new`, the first of
    that, -2, -3, ... that does not exist yet."""
    differences = changed_from_preset(load_config(config_source, []), config)
    name = config.name
    if differences:
        digest = hashlib.sha256(json.dumps(differences, sort_keys=True).encode()).hexdigest()
        name += "-" + digest[:8]
    path, index = runs_dir / name, 1
    while new and path.exists():
        index += 1
        path = runs_dir / f"{name}-{index}"
    return path


def _take_lock(fd: int, run_dir: Path) -> bool:
    """flock the open run.lock without waiting (True); RunLockedError naming its holder. A
    filesystem without flock support (some network filesystems): a warning, no lock (False)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown process"
        raise RunLockedError(
            f"{run_dir} is in use by another process ({holder}); wait for it to finish, "
            f"or pass another --run-dir (or --new)") from None
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        log.warning("%s: this filesystem does not support locks (%s); nothing stops a second "
                    "process from writing this run directory", run_dir, error.strerror)
        return False
    return True


def require_unlocked(run_dir: str | Path) -> None:
    """RunLockedError now if another process holds run_dir's lock (so a refused command says
    so before announcing a new or resumed run); `run_lock` still takes the lock itself."""
    path = Path(run_dir) / LOCK_FILE
    if jax.process_index() != 0 or not path.is_file():
        return
    fd = os.open(path, os.O_RDWR)
    try:
        if _take_lock(fd, Path(run_dir)):
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Exclusive lock on run_dir/run.lock (process 0 of a multi-host run takes it)."""
    run_dir = Path(run_dir)
    if jax.process_index() != 0:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = _take_lock(fd, run_dir)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _progress(run_dir: Path) -> tuple:
    """What a run has produced so far: its checkpoint steps and the size of its metrics."""
    metrics = run_dir / METRICS_FILE
    return (tuple(checkpoint_steps(run_dir)), metrics.stat().st_size if metrics.is_file() else 0)


def _is_setup_file(name: str) -> bool:
    """The files a run writes before its first step (config, its copies, tokenizer, lock, its
    compile cache)."""
    return (name in (CONFIG_FILENAME, TOKENIZER_DIRNAME, LOCK_FILE, compile_cache.DIRNAME)
            or (name.startswith("config.") and name.endswith(".json")))


@contextlib.contextmanager
def claimed_run_dir(run_dir: str | Path) -> Iterator[Path]:
    """The run directory, locked for this process. If the body fails before it wrote a metric
    or checkpoint, what it added is removed again: the directory, if this call created it;
    else the setup files it added (config copies, tokenizer, lock), while the user's files,
    earlier runs' files and every checkpoint stay. So a failed attempt leaves no partial run
    behind, in a fresh directory or in one that a job script made beforehand."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    before = set() if created else {entry.name for entry in run_dir.iterdir()}
    progress = (), 0
    locked = False              # a process refused the lock must not remove the holder's dir
    try:
        with run_lock(run_dir):
            locked = True
            progress = _progress(run_dir)
            yield run_dir
    except BaseException:
        if (locked and jax.process_index() == 0 and run_dir.is_dir()
                and _progress(run_dir) == progress):
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                for entry in run_dir.iterdir():
                    if entry.name not in before and _is_setup_file(entry.name):
                        if entry.is_dir():
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            entry.unlink(missing_ok=True)
        raise
