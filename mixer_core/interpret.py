"""Pallas Mosaic GPU interpret mode: run the GPU kernels on the CPU, for tests.

    with gpu_interpret():            # races and uninitialised reads are detected
        out = fpa_attention(..., implementation="pallas")

Under `gpu_interpret()` every Mosaic GPU `pallas_call` / `plgpu.kernel` traced inside runs in
JAX's GPU interpreter (simulated shared memory, barriers, TMA), with fresh buffers filled with
NaN so a read of memory nothing wrote shows up in the result, and the happens-before race
detector on. The ops' "pallas" entries accept the CPU only while this mode is active
(`interpret_active`). After a kernel raises inside the interpreter, call `reset()` before
interpreting again in the same process.
"""

import contextlib

from jax._src import config as _jax_config
from jax.experimental.pallas import mosaic_gpu as plgpu


def test_params(detect_races: bool = True) -> plgpu.InterpretGPUParams:
    return plgpu.InterpretGPUParams(detect_races=detect_races, uninitialized_memory="nan")


@contextlib.contextmanager
def gpu_interpret(detect_races: bool = True):
    """Force GPU interpret mode for kernels traced inside this context."""
    with plgpu.force_gpu_interpret_mode(test_params(detect_races)):
        yield


def interpret_active() -> bool:
    """True while `gpu_interpret()` (or JAX's own forcing) is in effect."""
    return _jax_config.pallas_tpu_interpret_mode_context_manager.value is not None


def races_found() -> bool:
    """Whether the race detector reported a race in the last interpreted kernel."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    races = gpu_callbacks._races  # None until a kernel has run with detect_races
    return bool(races is not None and races.races_found)


def reset() -> None:
    """Clear the interpreter's state after a kernel raised inside it."""
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    interpret_pallas_call.reset_gpu_interpret_mode_state()
