"""A failed Orbax read (train/checkpoint/failed_reads.py) leaves no other read running: after
failed restores of a step whose array files are emptied, nothing reports "Event loop is closed"
from tensorstore's threads, asyncio logs no "Task exception was never retrieved", and no
traceback reaches stderr."""

import gc
import logging
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.checkpoint.restore_helpers import _abstract, _array_data_files
from train.checkpoint.manager import Checkpointer, UnreadableCheckpointError


def test_failed_restore_leaves_no_reads_running(tmp_path, caplog, capfd, monkeypatch):
    """A failed read of many arrays leaves no other read in flight: one still running when
    Orbax's event loop closes reports "RuntimeError: Event loop is closed" from tensorstore's
    threads (sys.unraisablehook: a traceback on stderr) and logs "Task exception was never
    retrieved" when collected."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    rng = np.random.default_rng(8)
    state = {f"w{i}": jnp.asarray(rng.normal(size=(40, 56)), jnp.float32) for i in range(32)}
    with Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, state=state)
    for path in _array_data_files(tmp_path / "1"):
        path.write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="asyncio")
    with Checkpointer(tmp_path, read_only=True) as checkpointer:
        for _ in range(4):
            with pytest.raises(UnreadableCheckpointError):
                checkpointer.restore(1, _abstract(state))
    time.sleep(0.2)
    gc.collect()
    assert not unraisable, [repr(u.exc_value) for u in unraisable[:3]]
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text[:2000]
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out, captured.err[:2000]
