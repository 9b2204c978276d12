"""Checkpoints of a training run: Orbax CheckpointManager, restorable onto any sharding.

    run_dir/config.json, run_dir/tokenizer/      written once per run (`save_run_files`)
    <directory>/<step>/state/      the train-state pytree (Orbax StandardSave); typed PRNG keys
                                   are stored as their uint32 key data and re-wrapped on restore
    <directory>/<step>/iterator/   data-iterator state, one JSON file per process (grain's
                                   handler; tuples kept by `encode_iterator_state`)
    <directory>/<step>/record/     JSON: step, wall_time, versions, config (the resolved
                                   run config), command_line (sys.argv), code ({"commit",
                                   "dirty"} of the git checkout holding this code, or None
                                   outside one), extra (the caller's record, e.g. continued
                                   pretraining's), leaves [{path, shape, dtype,
                                   fingerprint}], prng_keys {path: impl}
    <directory>/quarantine/        unreadable steps moved aside after a fallback restore

    fingerprint(x) = sum_i bits(x_i) * w_i  (mod 2^32),  bits = the element's raw bits as
                     uint32, w_i odd and depending on the element's index, so any single
                     changed element changes it; computed on device, independent of sharding.

Atomicity (Orbax 0.12.8, read in its source; exercised in tests/train/test_checkpoint.py):
a step is written into `<step>.orbax-checkpoint-tmp` (its items into `<item>.orbax-
checkpoint-tmp` inside) and renamed to `<step>` once every item is written; steps without
the final name are invisible. Old steps (beyond `max_to_keep`) are deleted only in the
save's finalize phase, after the new step is committed; a save that fails or is killed
deletes nothing. Leftover tmp directories are reported and removed when a Checkpointer
opens.

Restore (`restore_latest`) walks the steps newest first. A step whose files are missing,
truncated or altered (fingerprint mismatch), or whose record/iterator state is unreadable,
is skipped; once an older step restores, one warning line names the skipped steps and what
failed (e.g. "OUT_OF_RANGE reading state"; the full error is logged at INFO), and the
unreadable newer steps are moved to `quarantine/` so that training can save those step
numbers again. A failed read leaves no tensorstore read running (`_DrainingLoopPolicy`). A mismatch between the
requested abstract state and the recorded tree (paths, shapes, dtypes) is a caller error:
ValueError, nothing skipped, except for top-level entries named in `ignore_saved` (state
that older code saved and newer code no longer keeps, e.g. the trainer's unused per-step
"rng"): those are read and dropped. Arrays land on the shardings of the abstract state, so a
run saved on one device count restores onto another.

Preemption: `install_preemption_handler()` returns a flag that SIGTERM/SIGINT set; the loop
checks it each step, saves with `force=True`, calls `wait_until_finished()` and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

TMP_MARKER = ".orbax-checkpoint-tmp"
QUARANTINE_DIRNAME = "quarantine"
CONFIG_FILENAME = "config.json"
TOKENIZER_DIRNAME = "tokenizer"
_TUPLE_TAG = "__tuple__"
_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain",
                       "tokenizers", "numpy")


# ----------------------------------------------------------------------------- JSON helpers


def _tag_tuples(value: Any, where: str) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE_TAG: [_tag_tuples(v, where) for v in value]}
    if isinstance(value, list):
        return [_tag_tuples(v, where) for v in value]
    if isinstance(value, dict):
        if _TUPLE_TAG in value or not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: dict keys must be strings other than {_TUPLE_TAG!r}")
        return {k: _tag_tuples(v, where) for k, v in value.items()}
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{where}: cannot store {type(value).__name__} {value!r} as JSON")


def _untag_tuples(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag_tuples(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE_TAG}:
            return tuple(_untag_tuples(v) for v in value[_TUPLE_TAG])
        return {k: _untag_tuples(v) for k, v in value.items()}
    return value


def encode_iterator_state(state: Mapping[str, Any]) -> str:
    """JSON text of a data-iterator state that keeps tuples as tuples (grain needs them)."""
    return json.dumps(_tag_tuples(state, "data_iterator state"), sort_keys=True)


def decode_iterator_state(text: str) -> Any:
    """Inverse of `encode_iterator_state`."""
    return _untag_tuples(json.loads(text))


def _json_safe(value: Any, where: str) -> Any:
    """`value` as plain JSON types (tuples -> lists, numpy scalars -> Python, paths -> str)."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
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


def flat_keys(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for a nested mapping (the dotted keys of config overrides)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """"key: old -> new" for every dotted key whose value differs (JSON-level)."""
    before, after = flat_keys(_json_safe(old, "config")), flat_keys(_json_safe(new, "config"))
    return [f"{key}: {before.get(key, '(unset)')!r} -> {after.get(key, '(unset)')!r}"
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


# ----------------------------------------------------------------------------- run files


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
    text = json.dumps(_json_safe(config, "config"), indent=2, sort_keys=True) + "\n"
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
        from train.data.tokenizer import load_tokenizer

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


# ----------------------------------------------------------------------------- iterator item


class _EncodedIteratorState:
    """An encoded iterator state, shown to grain's handler the way a DataLoaderIterator shows
    its own: get_state() -> bytes, set_state(bytes). grain writes and reads the file."""

    def __init__(self, text: str = ""):
        self.text = text

    def get_state(self) -> bytes:
        return self.text.encode()

    def set_state(self, encoded: bytes) -> None:
        self.text = encoded.decode()

    def start_prefetch(self) -> None:
        """grain's restore calls this; there is nothing to prefetch."""


class _IteratorStateHandler(grain.checkpoint.CheckpointHandler):
    """grain's iterator handler (process_<i>-of-<n>.json per process); only the encoding
    differs: `encode_iterator_state` keeps the tuples that plain JSON would turn into lists."""

    def save(self, directory, item=None, args=None):
        super().save(directory, args=grain.checkpoint.CheckpointSave(
            _EncodedIteratorState(args.state_json)))

    def restore(self, directory, item=None, args=None):
        encoded = _EncodedIteratorState()
        super().restore(directory, args=grain.checkpoint.CheckpointRestore(encoded))
        return decode_iterator_state(encoded.text)


@ocp.args.register_with_handler(_IteratorStateHandler, for_save=True)
@dataclasses.dataclass
class IteratorStateSave(ocp.args.CheckpointArgs):
    state_json: str                 # encode_iterator_state(iterator.get_state()), taken at save


@ocp.args.register_with_handler(_IteratorStateHandler, for_restore=True)
@dataclasses.dataclass
class IteratorStateRestore(ocp.args.CheckpointArgs):
    pass


# ----------------------------------------------------------------------------- state helpers


def _is_prng_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _storable_state(state: Any) -> tuple[Any, dict[str, str]]:
    """Replaces typed PRNG key arrays by their uint32 key data; returns (tree, {path: impl})."""
    impls: dict[str, str] = {}

    def convert(path, leaf):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise TypeError(
                f"state{jax.tree_util.keystr(path)}: expected an array, got {type(leaf).__name__}"
            )
        if _is_prng_key(leaf):
            impls[jax.tree_util.keystr(path)] = str(jax.random.key_impl(leaf))
            return jax.random.key_data(leaf)
        return leaf

    return jax.tree_util.tree_map_with_path(convert, state), impls


def _abstract_storable(abstract_state: Any) -> tuple[Any, dict[str, str]]:
    """ShapeDtypeStructs (with shardings) of what `_storable_state` stores; {path: key dtype}."""
    key_dtypes: dict[str, str] = {}

    def convert(path, leaf):
        where = f"abstract_state{jax.tree_util.keystr(path)}"
        if isinstance(leaf, jax.Array):
            leaf = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            raise TypeError(
                f"{where}: expected jax.ShapeDtypeStruct or jax.Array, got {type(leaf).__name__}"
            )
        if leaf.sharding is None:
            raise ValueError(
                f"{where}: has no sharding; pass jax.ShapeDtypeStruct(shape, dtype, sharding=...)"
            )
        if _is_prng_key(leaf):
            key_dtypes[jax.tree_util.keystr(path)] = str(leaf.dtype)
            data = jax.eval_shape(jax.random.key_data, leaf)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding)
        return leaf

    return jax.tree_util.tree_map_with_path(convert, abstract_state), key_dtypes


_FINGERPRINT_MULTIPLIERS = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1,
                            0xD3A2646C, 0xFD7046C5, 0xB55A4F09)


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    elif x.dtype.itemsize in (1, 2):
        narrow = jnp.uint8 if x.dtype.itemsize == 1 else jnp.uint16
        bits = jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    elif x.dtype.itemsize in (4, 8):
        bits = jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8-byte: trailing axis of 2
    else:
        raise TypeError(f"cannot fingerprint dtype {x.dtype}")
    index_hash = jnp.zeros(bits.shape, jnp.uint32)
    for axis in range(bits.ndim):
        multiplier = jnp.uint32(_FINGERPRINT_MULTIPLIERS[axis % len(_FINGERPRINT_MULTIPLIERS)])
        position = jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis)
        index_hash = index_hash + position * multiplier
    weights = index_hash * jnp.uint32(2) + jnp.uint32(1)
    return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _fingerprints(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_leaf_fingerprint(x) for x in leaves]


def _leaf_records(storable: Any, with_fingerprints: bool) -> list[dict[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(storable)
    records = [
        {"path": jax.tree_util.keystr(path), "shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        for path, leaf in flat
    ]
    if with_fingerprints and flat:
        values = _fingerprints([leaf for _, leaf in flat])
        for record, value in zip(records, values):
            record["fingerprint"] = int(np.asarray(value.addressable_data(0)))  # replicated
    return records


def _all_processes(ok: bool) -> bool:
    """True iff `ok` on every process (so that all processes take the same branch)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


class StateMismatchError(ValueError):
    """The requested state's tree, shapes or dtypes differ from the checkpoint's; `problems`
    lists each difference ("<path>: checkpoint <shape> <dtype> vs requested ...")."""

    def __init__(self, step: int, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"abstract_state: does not match the state saved at step {step}: "
            + "; ".join(problems[:8])
            + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else ""))


def _check_tree_matches(recorded: list[dict], requested: list[dict], step: int) -> None:
    def table(records):
        return {r["path"]: (tuple(r["shape"]), r["dtype"]) for r in records}

    saved, wanted = table(recorded), table(requested)
    problems = [f"missing in checkpoint: {p}" for p in wanted if p not in saved]
    problems += [f"not in abstract_state: {p}" for p in saved if p not in wanted]
    problems += [
        f"{p}: checkpoint {saved[p][0]} {saved[p][1]} vs requested {wanted[p][0]} {wanted[p][1]}"
        for p in wanted if p in saved and saved[p] != wanted[p]
    ]
    if problems:
        raise StateMismatchError(step, problems)


def _with_ignored_entries(abstract_state: Any, recorded_leaves: list[dict],
                          ignore_saved: Collection[str]) -> tuple[Any, list[str]]:
    """abstract_state plus a replicated ShapeDtypeStruct for each `ignore_saved` key that the
    step holds as a top-level array and abstract_state lacks; and those keys."""
    if not ignore_saved:
        return abstract_state, []
    if not isinstance(abstract_state, Mapping):
        raise TypeError(f"abstract_state: ignore_saved needs a dict state, got "
                        f"{type(abstract_state).__name__}")
    recorded = {r["path"]: r for r in recorded_leaves}
    template = jax.tree.leaves(abstract_state)[0].sharding
    replicated = (NamedSharding(template.mesh, PartitionSpec())
                  if isinstance(template, NamedSharding) else template)
    extended, ignored = dict(abstract_state), []
    for name in ignore_saved:
        saved = recorded.get(jax.tree_util.keystr((jax.tree_util.DictKey(name),)))
        if name in abstract_state or saved is None:
            continue
        extended[name] = jax.ShapeDtypeStruct(tuple(saved["shape"]), jnp.dtype(saved["dtype"]),
                                              sharding=replicated)
        ignored.append(name)
    return extended, ignored


# ----------------------------------------------------------------------------- failed reads


class _DrainingLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """Event loops that let their unfinished tasks finish before closing (asyncio.run
    cancels and awaits them).

    Orbax runs each restore in a fresh loop (run_until_complete, then close, without that
    step) and reads the arrays with asyncio.gather. When one read fails, the gather raises at
    once and the loop closes while the other reads are still in flight: their tensorstore
    futures later call back into the closed loop ("RuntimeError: Event loop is closed" with a
    traceback, from tensorstore's threads, often at interpreter exit) and their failed tasks
    are logged when collected ("Task exception was never retrieved")."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        close = loop.close

        def drain_then_close() -> None:
            if not loop.is_closed() and not loop.is_running():
                # also runs the callbacks queued before it (gather marking the exceptions of
                # reads that failed after the first one as retrieved)
                loop.run_until_complete(_settle(asyncio.all_tasks(loop)))
            close()

        loop.close = drain_then_close
        return loop


_SETTLE_SECONDS = 60.0


async def _settle(tasks: set[asyncio.Task]) -> None:
    """Lets `tasks` finish (cancelling those still running after _SETTLE_SECONDS) and marks
    their errors as seen. Reads are not cancelled at once: a cancelled tensorstore read may
    still call back into the loop after it closed."""
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=_SETTLE_SECONDS)
        for task in late:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# absl status codes, as tensorstore starts its error messages
_STATUS_CODES = ("CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
_STATUS_CODE = re.compile(r"\b(" + "|".join(_STATUS_CODES) + r"): ")


def _read_failure(item: str, error: BaseException) -> str:
    """A few words on a failed Orbax read of `item` (e.g. "OUT_OF_RANGE reading state"): the
    status code of the innermost error that has one (orbax's own messages embed whole
    tensorstore specs), else the innermost error, shortened."""
    chain = [error]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) and cause not in chain:
        chain.append(cause)
    for inner in reversed(chain):
        if code := _STATUS_CODE.search(str(inner)):
            return f"{code.group(1)} reading {item}"
    inner = chain[-1]
    message = " ".join(str(inner).split())
    message = message if len(message) <= 120 else message[:117] + "..."
    return f"{type(inner).__name__} reading {item}" + (f": {message}" if message else "")


def _unreadable_steps(failures: Mapping[int, str]) -> str:
    """"step 4 is unreadable (why)" or "steps 6, 4 are unreadable (step 6: why; step 4: why)"."""
    if len(failures) == 1:
        [(step, problem)] = failures.items()
        return f"step {step} is unreadable ({problem})"
    problems = set(failures.values())
    why = (problems.pop() if len(problems) == 1
           else "; ".join(f"step {step}: {problem}" for step, problem in failures.items()))
    return f"steps {', '.join(map(str, failures))} are unreadable ({why})"


_LOOP_POLICY_LOCK = threading.Lock()


@contextlib.contextmanager
def _failed_reads_cleaned_up():
    """Orbax calls inside this block leave no reads running after a failure (see
    _DrainingLoopPolicy); a process with its own event loop policy (e.g. uvloop's) keeps it."""
    with _LOOP_POLICY_LOCK:
        previous = asyncio.get_event_loop_policy()
        if type(previous) is not asyncio.DefaultEventLoopPolicy:
            yield
            return
        asyncio.set_event_loop_policy(_DrainingLoopPolicy())
        try:
            yield
        finally:
            asyncio.set_event_loop_policy(previous)


# ----------------------------------------------------------------------------- checkpointer


@dataclasses.dataclass
class RestoredCheckpoint:
    """step: the restored step; state: the train state on the requested shardings;
    record: the JSON record saved with it (config, extra, ...)."""

    step: int
    state: Any
    record: dict[str, Any]


class UnreadableCheckpointError(RuntimeError):
    """A step exists but cannot be restored faithfully (missing, truncated or altered data)."""


class NoReadableCheckpointError(RuntimeError):
    """Steps exist but none of them can be restored."""


class Checkpointer:
    """Saves and restores train state + data-iterator state + a JSON record, one step at a time.

    directory: where the steps live (e.g. run_dir / "checkpoints"); created if missing.
    save_interval_steps: `save` writes only at multiples of this (or with force=True, or at an
        Orbax multi-host preemption sync point); unlike Orbax's default policy it does not
        also save whichever step comes first.
    max_to_keep: newest steps kept; older ones are deleted after a newer save commits.
    async_save: write in a background thread (the device->host copy happens inside `save`,
        so the caller may donate/overwrite the state buffers once `save` returns).
    verify_fingerprints: record per-leaf fingerprints at save and check them at restore.
    read_only: for readers (eval, export, a CPT reference): the directory must exist, nothing
        in it is created, cleaned up, quarantined or deleted, and `save` refuses.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        save_interval_steps: int = 1000,
        max_to_keep: int = 3,
        async_save: bool = True,
        verify_fingerprints: bool = True,
        read_only: bool = False,
    ):
        for name, value in (("save_interval_steps", save_interval_steps),
                            ("max_to_keep", max_to_keep)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        self.directory = Path(directory).absolute()
        self._verify = verify_fingerprints
        self.read_only = read_only
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(f"{self.directory}: no checkpoint (the directory does not exist)")
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in sorted(p for p in self.directory.iterdir()
                               if TMP_MARKER in p.name and not read_only):
            log.warning(
                "checkpoint %s was never committed (a save interrupted before its final rename); "
                "ignoring it and removing it", leftover,
            )
        policies = ocp.checkpoint_managers
        options = ocp.CheckpointManagerOptions(
            save_decision_policy=policies.AnySavePolicy([
                policies.FixedIntervalPolicy(save_interval_steps),
                policies.PreemptionCheckpointingPolicy(),
            ]),
            preservation_policy=policies.LatestN(n=max_to_keep),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=not read_only,
        )
        absl_log = logging.getLogger("absl")
        level = absl_log.level
        if read_only:   # Orbax warns that read_only turns saving off: that is the point
            absl_log.setLevel(logging.ERROR)
        try:
            options = dataclasses.replace(options, read_only=read_only)
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        finally:
            absl_log.setLevel(level)

    # -- queries

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def should_save(self, step: int) -> bool:
        return self._manager.should_save(step)

    def reached_preemption(self, step: int) -> bool:
        """True at a multi-host preemption sync point (jax.distributed preemption service)."""
        return self._manager.reached_preemption(step)

    # -- save

    def save(
        self,
        step: int,
        *,
        state: Any,
        data_iterator: Any = None,
        config: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        progress: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        """Saves `state` (pytree of arrays) at `step` if due (or `force`); returns whether it did.

        data_iterator: object with get_state() (e.g. a grain DatasetIterator), captured now.
        config: the run config (JSON-serialisable), stored in the step record.
        extra: the caller's own JSON-serialisable record of the step (e.g. which one-time
            transforms the run has applied), returned as `record["extra"]` on restore.
        progress: the trainer's counters that must survive a resume (e.g. skipped steps),
            returned as `record["progress"]`.
        A step that already exists is not rewritten (returns False).
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step: expected an int >= 0, got {step!r}")
        if self.read_only:
            raise RuntimeError(f"{self.directory}: opened read-only, cannot save step {step}")
        if step in self._manager.all_steps():
            log.info("checkpoint step %d already exists; not saving it again", step)
            return False
        if not force and not self._manager.should_save(step):
            return False
        storable, key_impls = _storable_state(state)
        record = {
            "step": step,
            "wall_time": time.time(),
            "versions": library_versions(),
            "config": _json_safe(config or {}, "config"),
            "command_line": list(sys.argv),
            "code": code_revision(),
            "extra": _json_safe(extra or {}, "extra"),
            "progress": _json_safe(progress or {}, "progress"),
            "process_count": jax.process_count(),
            "has_iterator_state": data_iterator is not None,
            "prng_keys": key_impls,
            "leaves": _leaf_records(storable, self._verify),
        }
        items = {
            "state": ocp.args.StandardSave(storable),
            "record": ocp.args.JsonSave(record),
        }
        if data_iterator is not None:
            items["iterator"] = IteratorStateSave(encode_iterator_state(data_iterator.get_state()))
        saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        if saved:
            log.info("checkpoint step %d started in %s", step, self.directory)
        return saved

    # -- restore

    def restore_latest(
        self, abstract_state: Any, data_iterator: Any = None, *,
        ignore_saved: Collection[str] = (),
    ) -> RestoredCheckpoint | None:
        """Restores the newest readable step (None if there are no steps; see module doc).

        abstract_state: pytree like the saved state whose leaves are jax.ShapeDtypeStruct with
            .sharding (or jax.Array): the restored arrays get these shardings.
        data_iterator: if given, its set_state() receives the saved iterator state.
        ignore_saved: top-level keys of a dict state that a step may hold (one array each,
            saved by older code) although abstract_state has none: read and dropped.
        Skipped steps are reported in one warning line once an older step restored; raises
        NoReadableCheckpointError (naming each step's problem) if steps exist but none is
        readable.
        """
        self._manager.reload()
        steps = sorted(self._manager.all_steps(), reverse=True)
        if not steps:
            return None
        failures: dict[int, str] = {}
        for step in steps:
            try:
                restored = self._restore_step(step, abstract_state, data_iterator, ignore_saved)
            except UnreadableCheckpointError as error:
                failures[step] = str(error)
                continue
            if failures:
                moved = "" if self.read_only else (
                    f"; moved {'it' if len(failures) == 1 else 'them'} to "
                    f"{self.directory / QUARANTINE_DIRNAME}")
                log.warning("%s: checkpoint %s; restored step %d instead%s", self.directory,
                            _unreadable_steps(failures), step, moved)
                if not self.read_only:
                    self._quarantine(list(failures))
            return restored
        raise NoReadableCheckpointError(
            f"no readable checkpoint in {self.directory}: {_unreadable_steps(failures)}")

    def restore(
        self, step: int, abstract_state: Any, data_iterator: Any = None, *,
        ignore_saved: Collection[str] = (),
    ) -> RestoredCheckpoint:
        """Restores exactly `step`; raises UnreadableCheckpointError if it is damaged (its
        message: what failed in a few words, e.g. "OUT_OF_RANGE reading state")."""
        self._manager.reload()
        if step not in self._manager.all_steps():
            raise ValueError(f"step: {step} not among the checkpoints {self.all_steps()}")
        return self._restore_step(step, abstract_state, data_iterator, ignore_saved)

    def read_record(self, step: int) -> dict[str, Any]:
        """The JSON record of `step` alone (no arrays are read); UnreadableCheckpointError if
        it cannot be read."""
        restored, problem = self._read(step, {"record": ocp.args.JsonRestore()})
        if problem is not None:
            raise UnreadableCheckpointError(problem)
        return restored["record"]

    def _read(self, step: int, items: Mapping[str, Any]) -> tuple[Any, str | None]:
        """(the restored Composite, None), or (None, a one-line gist of what failed); the
        full error is logged at INFO (-v)."""
        try:
            with _failed_reads_cleaned_up():
                return self._manager.restore(step, args=ocp.args.Composite(**items)), None
        except Exception as error:  # noqa: BLE001 - any failure to read means unreadable
            log.info("checkpoint step %d in %s: reading %s failed", step, self.directory,
                     " and ".join(items), exc_info=True)
            return None, _read_failure(" and ".join(items), error)

    def _restore_step(
        self, step: int, abstract_state: Any, data_iterator: Any, ignore_saved: Collection[str]
    ) -> RestoredCheckpoint:
        restored, problem = self._read(step, {"record": ocp.args.JsonRestore()})
        if problem is None:
            try:
                record = restored["record"]
                recorded_leaves, recorded_keys = record["leaves"], record["prng_keys"]
            except (KeyError, TypeError) as error:
                problem = f"record is incomplete ({type(error).__name__}: {error})"
        if not _all_processes(problem is None):
            raise UnreadableCheckpointError(problem or "record unreadable on another process")
        abstract_state, ignored = _with_ignored_entries(abstract_state, recorded_leaves,
                                                        ignore_saved)
        abstract, key_dtypes = _abstract_storable(abstract_state)
        _check_tree_matches(recorded_leaves, _leaf_records(abstract, False), step)
        if set(recorded_keys) != set(key_dtypes):
            raise ValueError(
                f"abstract_state: PRNG key leaves {sorted(key_dtypes)} differ from the saved "
                f"ones {sorted(recorded_keys)} at step {step}"
            )
        if data_iterator is not None and record["process_count"] != jax.process_count():
            raise ValueError(
                f"data_iterator: step {step} holds iterator states of {record['process_count']} "
                f"processes, this job has {jax.process_count()}; pass data_iterator=None to "
                "restart the data stream"
            )
        items = {"state": ocp.args.StandardRestore(abstract)}
        if data_iterator is not None and record.get("has_iterator_state"):
            items["iterator"] = IteratorStateRestore()
        elif data_iterator is not None:
            log.warning("checkpoint step %d has no data-iterator state; the iterator is left "
                        "where it is", step)
        restored, problem = self._read(step, items)
        if not _all_processes(problem is None):
            raise UnreadableCheckpointError(problem or "arrays unreadable on another process")
        storable = restored["state"]
        iterator_state = restored["iterator"] if "iterator" in items else None
        if self._verify and recorded_leaves and "fingerprint" in recorded_leaves[0]:
            actual = _leaf_records(storable, True)
            bad = [a["path"] for a, r in zip(actual, recorded_leaves)
                   if a["fingerprint"] != r["fingerprint"]]
            if bad:
                raise UnreadableCheckpointError(
                    f"fingerprint mismatch (data altered) in {', '.join(bad[:3])}"
                    + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""))
        state = jax.tree_util.tree_map_with_path(
            lambda path, leaf: (
                jax.random.wrap_key_data(leaf, impl=recorded_keys[jax.tree_util.keystr(path)])
                if jax.tree_util.keystr(path) in recorded_keys else leaf
            ),
            storable,
        )
        for name in ignored:
            log.info("checkpoint step %d: dropped its %r (no longer part of the state)", step, name)
            state.pop(name)
        if iterator_state is not None:
            data_iterator.set_state(iterator_state)
        log.info("restored checkpoint step %d from %s", step, self.directory)
        return RestoredCheckpoint(step=step, state=state, record=record)

    def _quarantine(self, steps: Sequence[int]) -> None:
        if jax.process_index() == 0:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            target_dir = self.directory / QUARANTINE_DIRNAME
            target_dir.mkdir(exist_ok=True)
            for step in steps:
                source = self.directory / str(step)
                target = target_dir / f"{step}-{stamp}"
                shutil.move(source, target)
                log.info("moved unreadable checkpoint %s to %s", source, target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("train.checkpoint.manager.quarantine")
        self._manager.reload()

    # -- lifecycle

    def wait_until_finished(self) -> None:
        """Blocks until the pending async save is committed (raises if it failed)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ----------------------------------------------------------------------------- preemption


class PreemptionFlag:
    """Set by SIGTERM/SIGINT. `bool(flag)` is True once a stop was requested.

    Use as a context manager (or call `uninstall()`) to restore the previous handlers. A
    second SIGINT after a stop was requested raises KeyboardInterrupt (impatient Ctrl-C).
    """

    def __init__(self, signals: Sequence[int]):
        self.requested = False
        self.signal_name: str | None = None
        self._previous = {}
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = self.signal_name or name
        log.warning("received %s: will save a checkpoint and stop after the current step", name)

    def __bool__(self) -> bool:
        return self.requested

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def __enter__(self) -> "PreemptionFlag":
        return self

    def __exit__(self, *exc_info) -> None:
        self.uninstall()


def install_preemption_handler(
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
) -> PreemptionFlag:
    """Installs handlers for `signals` (main thread only) and returns the flag they set.

    Loop pattern:
        with install_preemption_handler() as stop:
            for step in ...:
                ...train step...
                checkpointer.save(step, state=..., data_iterator=it)
                if stop:
                    checkpointer.save(step, state=..., data_iterator=it, force=True)
                    checkpointer.wait_until_finished()
                    break
    With several processes, a signal may reach only some of them: combine the flag across
    processes (or use `Checkpointer.reached_preemption(step)`) before acting on it.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_preemption_handler: must be called from the main thread")
    return PreemptionFlag(signals)
