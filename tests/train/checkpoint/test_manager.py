"""Orbax checkpoints (train/checkpoint/manager.py): round trips, retention, corruption,
kills, resharding."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.devices import xla_flags
from tests.train.checkpoint.list_iterator import ListIterator
from tests.train.checkpoint.restore_helpers import _abstract, _array_data_files
from train.checkpoint.manager import (QUARANTINE_DIRNAME, TMP_MARKER, Checkpointer,
                                      NoReadableCheckpointError, UnreadableCheckpointError)


REPO = Path(__file__).resolve().parents[3]


def _train_state(seed):
    rng = np.random.default_rng(seed)

    def normal(shape, dtype=np.float32):
        return jnp.asarray(rng.normal(size=shape).astype(dtype))

    params = {"dense": {"kernel": normal((6, 5)), "bias": normal((5,), jnp.bfloat16)},
              "scale": normal((3, 1, 4))}
    opt_state = optax.adamw(1e-3).init(params)
    opt_state = jax.tree.map(lambda x: normal(x.shape, x.dtype) if x.ndim else x + seed + 3,
                             opt_state)
    return {"params": params, "opt_state": opt_state, "step": jnp.int32(seed + 17),
            "rng": jax.random.key(seed + 1), "legacy_rng": jax.random.PRNGKey(seed + 2)}


def _bits(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.atleast_1d(np.asarray(x)).view(np.uint8)


def _assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(_bits(x), _bits(y))


def _run_python(code, *, devices=1, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO),
               XLA_FLAGS=xla_flags(devices),
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("seed", [0, 5])
def test_round_trip_is_bitwise(tmp_path, seed):
    state = _train_state(seed)
    iterator = ListIterator()
    iterator.position = 41 + seed
    with Checkpointer(tmp_path, save_interval_steps=10) as checkpointer:
        assert checkpointer.save(10, state=state, data_iterator=iterator,
                                 config={"model": {"width": 8}, "lr": 1e-3},
                                 extra={"tokens_seen": np.int64(1234),
                                        "markers": [{"l_ref": 8, "l_tar": 32, "s": 0.5}]})
        assert not checkpointer.save(11, state=state)  # not a multiple of the interval
        assert not checkpointer.save(10, state=state, force=True)  # exists already
    restored_iterator = ListIterator()
    with Checkpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore_latest(_abstract(state), restored_iterator)
    assert restored.step == 10 and restored_iterator.position == 41 + seed
    _assert_bitwise_equal(restored.state, state)
    record = restored.record
    assert record["config"] == {"model": {"width": 8}, "lr": 1e-3}
    assert record["extra"] == {"tokens_seen": 1234, "markers": [{"l_ref": 8, "l_tar": 32, "s": 0.5}]}
    assert record["versions"]["jax"] == jax.__version__ and record["wall_time"] > 0


def test_ignored_saved_entry_is_read_and_dropped(tmp_path):
    """State saved by older code with a top-level entry newer code dropped (the trainer's
    per-step "rng") restores when that key is named in ignore_saved, and only then."""
    old = _train_state(2)
    new = {k: v for k, v in old.items() if k not in ("rng", "legacy_rng")}
    with Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(3, state={**new, "rng": jax.random.PRNGKey(9)})
    with Checkpointer(tmp_path) as checkpointer:
        with pytest.raises(ValueError, match=r"not in abstract_state: \['rng'\]"):
            checkpointer.restore(3, _abstract(new))
        restored = checkpointer.restore_latest(_abstract(new), ignore_saved=("rng",))
        # a name the step does not hold is fine
        again = checkpointer.restore(3, _abstract(new), ignore_saved=("rng", "other"))
    assert restored.step == 3 and "rng" not in restored.state
    _assert_bitwise_equal(restored.state, new)
    _assert_bitwise_equal(again.state, new)


def test_keeps_last_k(tmp_path):
    state = _train_state(1)
    with Checkpointer(tmp_path, save_interval_steps=2, max_to_keep=2) as checkpointer:
        for step in range(1, 11):
            checkpointer.save(step, state={**state, "step": jnp.int32(step)})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [8, 10]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["10", "8"]
    with Checkpointer(tmp_path) as checkpointer:
        assert int(checkpointer.restore_latest(_abstract(state)).state["step"]) == 10


def _largest_file(step_dir):
    return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["delete", "truncate", "overwrite", "record"])
def test_corrupt_latest_step_falls_back(tmp_path, caplog, damage):
    caplog.set_level(logging.WARNING, logger="train.checkpoint.manager")
    states = {step: _train_state(step) for step in (3, 6)}
    with Checkpointer(tmp_path, save_interval_steps=3, max_to_keep=3) as checkpointer:
        for step, state in states.items():
            checkpointer.save(step, state=state)
    victim = _largest_file(tmp_path / "6")
    if damage == "delete":
        victim.unlink()
    elif damage == "truncate":
        with open(victim, "r+b") as handle:
            handle.truncate(victim.stat().st_size // 3)
    elif damage == "overwrite":  # same size, altered bytes: only the fingerprint notices
        with open(victim, "r+b") as handle:
            handle.seek(victim.stat().st_size // 2)
            handle.write(b"\x5a" * 64)
    else:
        (tmp_path / "6" / "record" / "metadata").write_text("{not json")
    with Checkpointer(tmp_path, save_interval_steps=3) as checkpointer:
        restored = checkpointer.restore_latest(_abstract(states[3]))
        assert restored.step == 3
        _assert_bitwise_equal(restored.state, states[3])
        assert "step 6" in caplog.text and "unreadable" in caplog.text
        assert checkpointer.all_steps() == [3]
        assert [p.name.split("-")[0] for p in (tmp_path / QUARANTINE_DIRNAME).iterdir()] == ["6"]
        assert checkpointer.save(6, state=states[6])  # the step number is free again
        checkpointer.wait_until_finished()
        _assert_bitwise_equal(checkpointer.restore_latest(_abstract(states[6])).state, states[6])


def test_mismatched_abstract_state_is_an_error_not_a_fallback(tmp_path):
    state = _train_state(2)
    with Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, state=state)
        checkpointer.save(2, state=state)
    wrong = _abstract(state)
    wrong["params"]["scale"] = jax.ShapeDtypeStruct((3, 4), jnp.float32,
                                                   sharding=state["step"].sharding)
    with Checkpointer(tmp_path) as checkpointer:
        with pytest.raises(ValueError, match=r"abstract_state.*\['scale'\]"):
            checkpointer.restore_latest(wrong)
        unsharded = dict(_abstract(state), step=jax.ShapeDtypeStruct((), jnp.int32))
        with pytest.raises(ValueError, match="sharding"):
            checkpointer.restore_latest(unsharded)
        assert checkpointer.all_steps() == [1, 2]
    assert not (tmp_path / QUARANTINE_DIRNAME).exists()


def test_all_steps_unreadable_raises(tmp_path):
    state = _train_state(4)
    with Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, state=state)
    _largest_file(tmp_path / "1").unlink()
    with Checkpointer(tmp_path) as checkpointer:
        with pytest.raises(RuntimeError, match="no readable checkpoint"):
            checkpointer.restore_latest(_abstract(state))
        with pytest.raises(UnreadableCheckpointError):
            checkpointer.restore(1, _abstract(state))
        assert checkpointer.all_steps() == [1]  # nothing moved when nothing restored
    with Checkpointer(tmp_path / "empty") as checkpointer:
        assert checkpointer.restore_latest(_abstract(state)) is None


@pytest.mark.parametrize("damage,gist", [
    ("truncate", r"[A-Z_]+ reading state"),           # tensorstore's status code, no spec
    ("delete", r"[A-Z_]+ reading state"),
    ("record", r"JSONDecodeError reading record: Expecting property name .*"),
])
def test_unreadable_step_errors_are_one_short_line(tmp_path, caplog, damage, gist):
    state = _train_state(3)
    with Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, state=state)
        checkpointer.save(2, state=state)
    for step in (1, 2):
        for victim in _array_data_files(tmp_path / str(step)):
            if damage == "truncate":
                victim.write_bytes(victim.read_bytes()[:10])
            elif damage == "delete":
                victim.unlink()
        if damage == "record":
            (tmp_path / str(step) / "record" / "metadata").write_text("{not json")
    caplog.set_level(logging.WARNING)
    with Checkpointer(tmp_path, read_only=True) as checkpointer:
        with pytest.raises(UnreadableCheckpointError) as error:
            checkpointer.restore(2, _abstract(state))
        assert re.fullmatch(gist, str(error.value)), str(error.value)
        with pytest.raises(NoReadableCheckpointError) as error:
            checkpointer.restore_latest(_abstract(state))
        message = str(error.value)
        assert message.startswith(f"no readable checkpoint in {tmp_path}: steps 2, 1 are "
                                  "unreadable (") and "\n" not in message and len(message) < 300
    assert caplog.text == ""                # nothing logged above INFO: the error says it all


_KILLED_SAVE = """
    import asyncio, time
    import jax, jax.numpy as jnp
    from orbax.checkpoint._src.path import atomicity
    from train.checkpoint.manager import Checkpointer

    def state(step):
        return {"w": jnp.full((256, 256), float(step)), "step": jnp.int32(step)}

    checkpointer = Checkpointer("{directory}", save_interval_steps=1, max_to_keep=1)
    checkpointer.save(1, state=state(1))
    checkpointer.wait_until_finished()

    async def never_commit(self, *args, **kwargs):
        await asyncio.sleep(3600)

    atomicity.AtomicRenameTemporaryPath.finalize = never_commit
    checkpointer.save(2, state=state(2))  # async: returns while writing
    print("SAVE STARTED", flush=True)
    time.sleep(3600)
"""


def test_kill_during_async_save_keeps_previous_step(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="train.checkpoint.manager")
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    code = textwrap.dedent(_KILLED_SAVE).replace("{directory}", str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline().strip() == "SAVE STARTED"
        deadline = time.time() + 60
        written = f"2{TMP_MARKER}*/state*/_METADATA"  # step 2's arrays are on disk
        while not list(tmp_path.glob(written)) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let the background writer get well into step 2
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert list(tmp_path.glob(f"2{TMP_MARKER}*")), "expected an uncommitted step-2 directory"
    assert (tmp_path / "1").is_dir()  # max_to_keep=1, yet step 1 survives the killed save

    template = {"w": jnp.zeros((256, 256)), "step": jnp.int32(0)}
    with Checkpointer(tmp_path, save_interval_steps=1, max_to_keep=1) as checkpointer:
        assert "never committed" in caplog.text
        assert checkpointer.all_steps() == [1]
        restored = checkpointer.restore_latest(template)
        assert restored.step == 1 and float(restored.state["w"][0, 0]) == 1.0
        assert checkpointer.save(2, state={"w": jnp.ones((256, 256)) * 2, "step": jnp.int32(2)})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [2]
    assert not list(tmp_path.glob(f"*{TMP_MARKER}*"))


_RESHARD = """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
    from train.checkpoint.manager import Checkpointer

    assert jax.device_count() == 4
    def expected():
        rng = np.random.default_rng(7)
        return {"embed": jnp.asarray(rng.normal(size=(8, 12)), jnp.float32),
                "proj": jnp.asarray(rng.normal(size=(4, 6, 2)), jnp.bfloat16),
                "step": jnp.int32(99), "rng": jax.random.key(7)}

    def bits(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.atleast_1d(np.asarray(x)).view(np.uint8)

    def placed(tree, shardings):
        return jax.tree.map(jax.device_put, tree, shardings)

    def abstract(tree, shardings):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)

    def mesh(devices, shape, names):
        return jax.sharding.Mesh(np.array(devices).reshape(shape), names)

    four = mesh(jax.devices(), (2, 2), ("data", "model"))
    save_shardings = {"embed": NamedSharding(four, P("data", "model")),
                      "proj": NamedSharding(four, P(None, "model", None)),
                      "step": NamedSharding(four, P()), "rng": NamedSharding(four, P())}
    with Checkpointer("{directory}", save_interval_steps=5) as checkpointer:
        checkpointer.save(5, state=placed(expected(), save_shardings))

    two = mesh(jax.devices()[2:], (2,), ("model",))
    targets = {
        "two_devices": {"embed": NamedSharding(two, P(None, "model")),
                        "proj": NamedSharding(two, P("model")),
                        "step": NamedSharding(two, P()), "rng": NamedSharding(two, P())},
        "one_device": jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[1]),
                                   save_shardings),
    }
    report = {}
    with Checkpointer("{directory}") as checkpointer:
        for name, shardings in targets.items():
            state = checkpointer.restore_latest(abstract(expected(), shardings)).state
            same = all(np.array_equal(bits(a), bits(b))
                       for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(expected())))
            placed_right = all(leaf.sharding == s for leaf, s in
                               zip(jax.tree.leaves(state), jax.tree.leaves(shardings)))
            report[name] = [same, placed_right,
                            len(state["embed"].sharding.device_set)]
    print(json.dumps(report))
"""


def test_restore_onto_other_device_counts(tmp_path):
    output = _run_python(_RESHARD.replace("{directory}", str(tmp_path)), devices=4)
    report = json.loads(output.strip().splitlines()[-1])
    assert report == {"two_devices": [True, True, 2], "one_device": [True, True, 1]}

    # This process has one device: restore the 4-device checkpoint here as well.
    rng = np.random.default_rng(7)
    expected = {"embed": jnp.asarray(rng.normal(size=(8, 12)), jnp.float32),
                "proj": jnp.asarray(rng.normal(size=(4, 6, 2)), jnp.bfloat16),
                "step": jnp.int32(99), "rng": jax.random.key(7)}
    with Checkpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore_latest(_abstract(expected))
    _assert_bitwise_equal(restored.state, expected)


@pytest.mark.parametrize("kwargs,match", [
    ({"save_interval_steps": 0}, "save_interval_steps"),
    ({"max_to_keep": 0}, "max_to_keep"),
])
def test_checkpointer_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Checkpointer(tmp_path, **kwargs)
