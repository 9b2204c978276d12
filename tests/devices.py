"""Run a script in a fresh Python with N simulated CPU devices and read back its result.

XLA_FLAGS=--xla_force_host_platform_device_count must be set before JAX starts, so multi-device
checks run in a subprocess. The script prints one line `RESULT <json>`; its last such line is
returned as a dict. A non-zero exit fails the test with the script's stderr.

The subprocess keeps the session's other XLA flags (the CPU optimisation level of
tests/conftest.py); `default_level=True` drops that level, so the script compiles at XLA's
default.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def xla_flags(devices: int, default_level: bool = False) -> str:
    """XLA_FLAGS for a subprocess with `devices` CPU devices: the session's flags with this
    device count (and without the session's CPU optimisation level if `default_level`)."""
    kept = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
            if "xla_force_host_platform_device_count" not in flag
            and not (default_level and "xla_backend_optimization_level" in flag)]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={devices}"])


def run_on_cpu_devices(script: str, *args: str, devices: int = 8, timeout: int = 600,
                       default_level: bool = False) -> dict:
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices, default_level), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO))
    completed = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, completed.stderr[-4000:]
    line = [l for l in completed.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])
