"""Run a script in a fresh Python with N simulated CPU devices and read back its result.

XLA_FLAGS=--xla_force_host_platform_device_count must be set before JAX starts, so multi-device
checks run in a subprocess. The script prints one line `RESULT <json>`; its last such line is
returned as a dict. A non-zero exit fails the test with the script's stderr.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_on_cpu_devices(script: str, *args: str, devices: int = 8, timeout: int = 600) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    completed = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, completed.stderr[-4000:]
    line = [l for l in completed.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])
