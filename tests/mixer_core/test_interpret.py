"""mixer_core.interpret: the GPU interpreter runs a Mosaic GPU kernel on the CPU, and
gpu_interpret() gives it the TMA add reduction, which JAX's interpreter lacks: every program
of a grid adds its tile into one zero-initialised accumulator, as on the hardware."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import callback as jax_callback
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mixer_core import interpret

ROWS = 8


def _sum_of_tiles(x, reduce):
    """(sum of x's [ROWS, 16] tiles into one accumulator, x copied through): one program per
    tile, the tile added by a TMA reduction (reduce=True) or plainly stored (False)."""
    acc = jax.new_ref(jnp.zeros((ROWS, x.shape[1]), jnp.float32))

    def body(x_ref, acc_ref, out_ref, tile, barrier):
        i = lax.axis_index("i")
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * ROWS, ROWS)], tile, barrier.at[0])
        plgpu.barrier_wait(barrier.at[0])
        plgpu.copy_smem_to_gmem(tile, acc_ref, reduction_op="add" if reduce else None)
        plgpu.copy_smem_to_gmem(tile, out_ref.at[pl.ds(i * ROWS, ROWS)])
        plgpu.wait_smem_to_gmem(0)

    out = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       scratch_types=[plgpu.SMEM((ROWS, x.shape[1]), jnp.float32),
                                      plgpu.Barrier(num_barriers=1)],
                       grid=(x.shape[0] // ROWS,), grid_names=("i",))(x, acc)
    return acc[...], out


def test_tma_add_reduction_sums_every_program_tile():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4 * ROWS, 16)), jnp.float32)
    interpret.reset()
    with interpret.gpu_interpret():
        total, copied = jax.jit(lambda x: _sum_of_tiles(x, True))(x)
        with interpret.gpu_interpret():   # entering again keeps one patch
            again, _ = jax.jit(lambda x: _sum_of_tiles(x + 1.0, True))(x)
    assert not interpret.races_found()
    np.testing.assert_allclose(np.asarray(total), np.asarray(x).reshape(4, ROWS, 16).sum(0),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(copied), np.asarray(x))
    np.testing.assert_allclose(np.asarray(again), np.asarray(total) + 4.0, rtol=1e-6, atol=1e-5)


def test_plain_stores_still_overwrite():
    """Without a reduction the copy stays a store: the accumulator holds one program's tile."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2 * ROWS, 16)), jnp.float32)
    interpret.reset()
    with interpret.gpu_interpret(detect_races=False):   # two programs store to one place
        last, _ = jax.jit(lambda x: _sum_of_tiles(x, False))(x)
    tiles = np.asarray(x).reshape(2, ROWS, 16)
    assert any(np.array_equal(np.asarray(last), tile) for tile in tiles)


def test_only_the_interpreters_callbacks_get_host_arrays():
    """gpu_interpret() hands the interpreter's own callbacks NumPy values (no device_put per
    memory access); any other io_callback still sees JAX arrays, as JAX gives them."""
    seen = []

    def record(x):
        seen.append(type(x))
        return x

    x = jnp.arange(4.0)
    y = jnp.asarray(np.random.default_rng(2).standard_normal((2 * ROWS, 16)), jnp.float32)
    interpret.reset()
    with interpret.gpu_interpret():
        got = jax.jit(lambda x: io_callback(record, jax.ShapeDtypeStruct(x.shape, x.dtype), x))(x)
        total, _ = jax.jit(lambda y: _sum_of_tiles(y, True))(y)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x))
    assert seen and all(issubclass(kind, jax.Array) for kind in seen), seen
    np.testing.assert_allclose(np.asarray(total), np.asarray(y[:ROWS] + y[ROWS:]), rtol=1e-6)
    assert getattr(jax_callback.io_callback_impl, "host_arrays", False)
