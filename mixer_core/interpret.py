"""Pallas Mosaic GPU interpret mode: run the GPU kernels on the CPU, for tests.

    with gpu_interpret():            # races and uninitialised reads are detected
        out = fpa_attention(..., implementation="pallas")

Under `gpu_interpret()` every Mosaic GPU `pallas_call` / `plgpu.kernel` traced inside runs in
JAX's GPU interpreter (simulated shared memory, barriers, TMA), with fresh buffers filled with
NaN so a read of memory nothing wrote shows up in the result, and the happens-before race
detector on. The ops' "pallas" entries accept the CPU only while this mode is active
(`interpret_active`). After a kernel raises inside the interpreter, call `reset()` before
interpreting again in the same process.

The interpreter does not implement TMA reductions (`plgpu.copy_smem_to_gmem(...,
reduction_op="add")`); `gpu_interpret()` adds "add" as a read-add-write of the destination.
It runs the grid's programs one after another, so for kernels of one warpgroup per block and
clusters of one (every kernel here) that equals the hardware's atomic reduction up to the
order of the float32 additions; concurrent warpgroups of one block reducing into the same
place could lose updates. The race detector skips the reduced destination (concurrent
reductions are not a race) and still checks the shared-memory source. A reduction that
reaches out of bounds raises (the hardware would drop the out-of-bounds part).
"""

import contextlib
import functools

import jax
import numpy as np
from jax._src import config as _jax_config
from jax.experimental.pallas import mosaic_gpu as plgpu


def test_params(detect_races: bool = True) -> plgpu.InterpretGPUParams:
    return plgpu.InterpretGPUParams(detect_races=detect_races, uninitialized_memory="nan")


@contextlib.contextmanager
def gpu_interpret(detect_races: bool = True):
    """Force GPU interpret mode for kernels traced inside this context."""
    _add_tma_reduction()
    _pass_host_arrays_to_interpreter_callbacks()
    with plgpu.force_gpu_interpret_mode(test_params(detect_races)):
        yield


def _add_tma_reduction() -> None:
    """Teach the interpreter's SMEM -> GMEM copy the "add" reduction (module docstring)."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks as callbacks
    if getattr(callbacks.copy_smem_to_gmem, "reduces", False):
        return
    copy = getattr(callbacks.copy_smem_to_gmem, "__wrapped__", callbacks.copy_smem_to_gmem)

    class AddTask(callbacks.AsyncCopySmemToGmemTask):
        def __call__(self, tma_thread_id):
            memory = callbacks._get_shared_memory()
            self.pre_read(tma_thread_id, memory)
            value, _, _ = memory.get_buffer_content(self.src_allocation_key, self.src_access,
                                                    self.thread)
            old, _, _ = memory.get_buffer_content(self.dst_allocation_key, self.dst_access,
                                                  self.thread)
            if value is None or old is None or value.shape != old.shape:
                raise IndexError(f"TMA reduction out of bounds: [{self.src_access}] into "
                                 f"[{self.dst_access}]")
            if memory.detect_races:  # the source was checked; the reduction is atomic
                self.clock.inc(tma_thread_id)
                self.read_clock = self.write_clock = self.clock.copy()
            memory.store_buffer_content(self.dst_allocation_key, self.dst_access, old + value,
                                        self.thread)
            self.post_write(tma_thread_id, memory)

    @callbacks.fail_on_exception
    def copy_smem_to_gmem(*, token, mesh_location, thread, src_allocation_key_as_array,
                          src_transforms, dst_allocation_key_as_array, dst_transforms,
                          predicate, source_info, commit_group, reduction_op):
        if reduction_op is None:
            return copy(token=token, mesh_location=mesh_location, thread=thread,
                        src_allocation_key_as_array=src_allocation_key_as_array,
                        src_transforms=src_transforms,
                        dst_allocation_key_as_array=dst_allocation_key_as_array,
                        dst_transforms=dst_transforms, predicate=predicate,
                        source_info=source_info, commit_group=commit_group,
                        reduction_op=None)
        if str(reduction_op).lower().rsplit(".", 1)[-1] != "add" or predicate is not None:
            raise NotImplementedError(f"TMA reduction {reduction_op} with predicate "
                                      f"{predicate} in the interpreter")
        key = callbacks.HostAllocationKey
        src = key.from_array(src_allocation_key_as_array)
        dst = key.from_array(dst_allocation_key_as_array)
        src_transforms = jax.tree.map(int, callbacks._remove_noop_transforms(src_transforms))
        dst_transforms = jax.tree.map(int, callbacks._remove_noop_transforms(dst_transforms))
        memory = callbacks._get_shared_memory()
        clock = memory.incr_clock(thread) if memory.detect_races else None
        task = AddTask(mesh_location=mesh_location, thread=thread, src_allocation_key=src,
                       src_access=memory.access(src, src_transforms), dst_allocation_key=dst,
                       dst_access=memory.access(dst, dst_transforms), source_info=source_info,
                       clock=clock)
        memory.execute_async_task(task)
        return token

    copy_smem_to_gmem.reduces = True
    callbacks.copy_smem_to_gmem = copy_smem_to_gmem


def _pass_host_arrays_to_interpreter_callbacks() -> None:
    """Hand the interpreter's host callbacks their NumPy arguments as they are.

    JAX's `io_callback` puts every argument on a CPU device (`device_put`) before the Python
    function sees it; the interpreter calls back for each memory access and barrier, and that
    copy was a third of an interpreted kernel's time. The interpreter's callbacks read their
    arguments as NumPy values (ints, indices, buffers), so for them the copy is skipped; every
    other callback keeps JAX's behaviour."""
    from jax._src import callback as jax_callback
    impl = jax_callback.io_callback_impl
    if getattr(impl, "host_arrays", False):
        return

    def io_callback_impl(*args, callback, **params):
        function = getattr(callback, "callback_func", None)
        while isinstance(function, functools.partial):
            function = function.func
        module = getattr(function, "__module__", "") or ""
        if not module.startswith("jax._src.pallas.mosaic_gpu.interpret"):
            return impl(*args, callback=callback, **params)
        return jax.tree.map(np.asarray, callback(*map(_host_value, args)))

    io_callback_impl.host_arrays = True
    jax_callback.io_callback_impl = io_callback_impl


def _host_value(arg):
    """A callback argument as the interpreter reads it: integer scalars (thread ids, tokens,
    mesh coordinates) as Python ints, everything else as a NumPy array."""
    value = np.asarray(arg)
    if value.ndim == 0 and np.issubdtype(value.dtype, np.integer):
        return int(value)
    return value


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
