"""Checkpoints of a training run: Orbax CheckpointManager, restorable onto any sharding.

    run_dir/config.json, run_dir/tokenizer/      written once per run (run_files.py)
    <directory>/<step>/state/      the train-state pytree (Orbax StandardSave); typed PRNG keys
                                   are stored as their uint32 key data and re-wrapped on restore
    <directory>/<step>/iterator/   data-iterator state, one JSON file per process (grain's
                                   handler; tuples kept by `encode_iterator_state`)
    <directory>/<step>/record/     JSON: step, wall_time, versions, config (the resolved
                                   run config), command_line (sys.argv), code ({"commit",
                                   "dirty"} of the git checkout holding this code, or None
                                   outside one), extra (the caller's record, e.g. continued
                                   pretraining's), leaves [{path, shape, dtype,
                                   fingerprint}], prng_keys {path: impl} (state_tree.py)
    <directory>/quarantine/        unreadable steps moved aside after a fallback restore

Atomicity (Orbax 0.12.8, read in its source; exercised in tests/train/checkpoint/):
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
numbers again. A failed read leaves no tensorstore read running (failed_reads.py). A
mismatch between the requested abstract state and the recorded tree (paths, shapes, dtypes)
is a caller error: ValueError (StateMismatchError, state_tree.py), nothing skipped, except
for top-level entries named in `ignore_saved` (state that older code saved and newer code no
longer keeps, e.g. the trainer's unused per-step "rng"): those are read and dropped. Arrays
land on the shardings of the abstract state, so a run saved on one device count restores
onto another.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import shutil
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from train.checkpoint.failed_reads import failed_reads_cleaned_up, read_failure, unreadable_steps
from train.checkpoint.iterator_state import (IteratorStateRestore, IteratorStateSave,
                                             encode_iterator_state)
from train.checkpoint.run_files import code_revision, json_safe, library_versions
from train.checkpoint.state_tree import (abstract_storable, all_processes, check_tree_matches,
                                         leaf_records, storable_state, with_ignored_entries)

log = logging.getLogger(__name__)


TMP_MARKER = ".orbax-checkpoint-tmp"


QUARANTINE_DIRNAME = "quarantine"


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
        storable, key_impls = storable_state(state)
        record = {
            "step": step,
            "wall_time": time.time(),
            "versions": library_versions(),
            "config": json_safe(config or {}, "config"),
            "command_line": list(sys.argv),
            "code": code_revision(),
            "extra": json_safe(extra or {}, "extra"),
            "progress": json_safe(progress or {}, "progress"),
            "process_count": jax.process_count(),
            "has_iterator_state": data_iterator is not None,
            "prng_keys": key_impls,
            "leaves": leaf_records(storable, self._verify),
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
                            unreadable_steps(failures), step, moved)
                if not self.read_only:
                    self._quarantine(list(failures))
            return restored
        raise NoReadableCheckpointError(
            f"no readable checkpoint in {self.directory}: {unreadable_steps(failures)}")

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
            with failed_reads_cleaned_up():
                return self._manager.restore(step, args=ocp.args.Composite(**items)), None
        except Exception as error:  # noqa: BLE001 - any failure to read means unreadable
            log.info("checkpoint step %d in %s: reading %s failed", step, self.directory,
                     " and ".join(items), exc_info=True)
            return None, read_failure(" and ".join(items), error)

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
        if not all_processes(problem is None):
            raise UnreadableCheckpointError(problem or "record unreadable on another process")
        abstract_state, ignored = with_ignored_entries(abstract_state, recorded_leaves,
                                                        ignore_saved)
        abstract, key_dtypes = abstract_storable(abstract_state)
        check_tree_matches(recorded_leaves, leaf_records(abstract, False), step)
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
        if not all_processes(problem is None):
            raise UnreadableCheckpointError(problem or "arrays unreadable on another process")
        storable = restored["state"]
        iterator_state = restored["iterator"] if "iterator" in items else None
        if self._verify and recorded_leaves and "fingerprint" in recorded_leaves[0]:
            actual = leaf_records(storable, True)
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
