"""Preemption (train/checkpoint/preemption.py): the flag SIGTERM/SIGINT set, and a loop
that saves and exits on it."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from train.checkpoint.manager import Checkpointer
from train.checkpoint.preemption import install_preemption_handler


REPO = Path(__file__).resolve().parents[3]


_PREEMPTED_LOOP = """
    import os, sys, time
    import jax.numpy as jnp
    from train.checkpoint.manager import Checkpointer
    from train.checkpoint.preemption import install_preemption_handler

    directory = "{directory}"
    with Checkpointer(directory, save_interval_steps=1000) as checkpointer, \\
            install_preemption_handler() as stop:
        state = {"x": jnp.zeros((4,)), "step": jnp.int32(0)}
        for step in range(1, 100000):
            state = {"x": state["x"] + 1, "step": jnp.int32(step)}
            checkpointer.save(step, state=state)
            if step == 3:
                print("RUNNING", flush=True)
            if stop:
                checkpointer.save(step, state=state, force=True)
                checkpointer.wait_until_finished()
                print("STOPPED", step, stop.signal_name, flush=True)
                break
            time.sleep(0.01)
"""


def test_sigterm_makes_the_loop_save_and_exit(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    code = textwrap.dedent(_PREEMPTED_LOOP).replace("{directory}", str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "RUNNING"
    child.send_signal(signal.SIGTERM)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr[-2000:]
    _, step, signal_name = stdout.split()
    assert signal_name == "SIGTERM" and int(step) >= 3
    template = {"x": jnp.zeros((4,)), "step": jnp.int32(0)}
    with Checkpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore_latest(template)
    assert restored.step == int(step) == int(restored.state["step"])
    np.testing.assert_array_equal(restored.state["x"], np.full((4,), float(step)))


def test_preemption_flag_in_process():
    previous = signal.getsignal(signal.SIGTERM)
    with install_preemption_handler() as stop:
        assert not stop
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop and stop.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is previous
