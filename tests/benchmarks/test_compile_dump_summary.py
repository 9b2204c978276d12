"""compile_dump_summary reads XLA's dump of a compiled program: fusion calls and custom calls
with the size of their lines."""

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.compile_dump_summary import hlo_counts, summarise

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import jax, jax.numpy as jnp
def layer(x):
    return jnp.tanh(x * 2.0 + 1.0).sum(axis=-1, keepdims=True) * x
@jax.jit
def guarded(x):
    for _ in range(3):
        x = layer(x)
    return x
guarded(jnp.ones((64, 64))).block_until_ready()
"""


def test_hlo_counts_reads_fusions_and_custom_calls():
    call = '%d = f32[4] custom-call(%c), custom_call_target="mosaic_gpu_v2"'
    text = ("%a = f32[4] fusion(%x), kind=kLoop, calls=%fused_1\n"
            "%b = f32[4] fusion(%a), kind=kLoop, calls=%fused_1\n"
            "%c = f32[4] fusion(%b), kind=kInput, calls=%fused_2\n" + call + "\n")
    assert hlo_counts(text) == (3, {"mosaic_gpu_v2": 1}, {"mosaic_gpu_v2": len(call)})


def test_summary_of_a_real_dump(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_dump_to={tmp_path} --xla_dump_hlo_as_text "
                         "--xla_dump_hlo_module_re=.*guarded.*")
    subprocess.run([sys.executable, "-c", PROGRAM], check=True, env=env, cwd=REPO)
    line = summarise(str(tmp_path), "guarded")
    assert "jit_guarded" in line and "custom calls: none" in line, line
    calls = int(line.split(" MB, ")[1].split(" fusion calls")[0])
    assert calls >= 1
    assert "no optimised HLO" in summarise(str(tmp_path), "no_such_module")
