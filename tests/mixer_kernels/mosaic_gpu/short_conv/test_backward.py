"""short_conv(implementation="pallas") in GPU interpret mode against "xla": the output of the
forward kernel, and the gradients of x and the taps from the kernel backward (dx formed by XLA
from the kernel's d total), with and without documents, with and without L2-normalised heads,
at awkward lengths and in bf16; forward and backward run the kernels; they lower for Hopper on
a machine without one."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu
import pytest

from benchmarks.kernel_op_count import (captured_kernels, shared_memory_bytes,
                                        warpgroup_barriers)
from gdn_jax.ops.short_conv import REGISTRY, short_conv
from mixer_core import interpret
from mixer_core.registry import UnsupportedImplementationError
from mixer_kernels.mosaic_gpu.short_conv.backward_kernel import PAD, conv_backward
from gdn_jax.ops.short_conv import short_conv_pallas
from tests.seeds import case_seed


def _inputs(seed, batch, length, channels, width, dtype, documents):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((batch, length, channels)), dtype)
    kernel = jnp.asarray(rng.uniform(-0.5, 0.5, (width, channels)), jnp.float32)
    segment_ids = None
    if documents:   # ids above 2^24, where float32 cannot tell neighbours apart
        starts = rng.random((batch, length)) < 0.08
        segment_ids = jnp.asarray(2**24 + np.cumsum(starts, axis=1), jnp.int32)
    return x, kernel, segment_ids


# compiled whole (op by op, each small op of the loss and its gradient compiled on its own)
@functools.partial(jax.jit, static_argnums=(0, 4))
def _loss_and_grads(implementation, x, kernel, segment_ids, normalize_heads, cotangent):
    def loss(x, kernel):
        y = short_conv(x, kernel, segment_ids, dtype=x.dtype, normalize_heads=normalize_heads,
                       implementation=implementation)
        return jnp.sum(y.astype(jnp.float32).reshape(cotangent.shape) * cotangent), y
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, kernel)
    return y, grads


CASES = {   # case: (length, normalize_heads, documents, dtype)
    0: (70, 2, True, jnp.float32),      # T not a multiple of the block, documents, heads
    1: (64, None, False, jnp.float32),  # groups of 64 channels, no documents
    2: (1, 2, False, jnp.float32),      # T = 1: only the last tap sees data
    3: (3, None, True, jnp.float32),    # T shorter than the taps
    4: (130, 2, True, jnp.bfloat16),    # bf16, several blocks
}


@functools.cache
def _case(case):
    """Inputs, cotangent and the "xla" output and gradients of one case, plus "xla"'s
    gradients on float32 x for bf16."""
    length, normalize_heads, documents, dtype = CASES[case]
    x, kernel, segment_ids = _inputs(case_seed(case), 2, length, 128, 4, dtype, documents)
    cotangent = jnp.asarray(np.random.default_rng(case_seed(case) + 1).standard_normal(
        (2, length, 128)), jnp.float32)
    reference = _loss_and_grads("xla", x, kernel, segment_ids, normalize_heads, cotangent)
    exact = None
    if dtype != jnp.float32:
        exact = _loss_and_grads("xla", x.astype(jnp.float32), kernel, segment_ids,
                                normalize_heads, cotangent)
    return (x, kernel, segment_ids, normalize_heads, cotangent), reference, exact


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_match_xla(case):
    args, (y_xla, (dx_xla, dk_xla)), exact = _case(case)
    with interpret.gpu_interpret():
        y, (dx, dk) = _loss_and_grads("pallas", *args)
    assert not interpret.races_found()
    assert_matches_xla((y, dx, dk), (y_xla, dx_xla, dk_xla), exact)


def assert_matches_xla(got, xla, exact):
    """got, xla: (y, dx, d taps) of "pallas" and "xla"; exact: "xla"'s (y, (dx, d taps)) on
    float32 x for 16-bit x, else None. Compared on the host (no compilations)."""
    f32 = lambda a: np.asarray(a).astype(np.float32)
    error = lambda a, b: float(np.max(np.abs(f32(a) - f32(b))))
    scale = lambda a: float(np.max(np.abs(f32(a)))) + 1e-6
    for ours, theirs in zip(got, xla):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    if exact is None:      # float32: the same sums in another order
        for ours, theirs, rtol in zip(got, xla, (1e-6, 2e-5, 2e-5)):
            assert error(ours, theirs) <= rtol * scale(theirs)
        return
    # bf16: "xla" rounds silu's output to bf16 before the norm and the cotangent between the
    # norm and silu, the kernels keep float32 throughout; both against float32 on the same
    # rounded x
    y_f32, (dx_f32, dk_f32) = exact
    for ours, theirs, truth in zip(got, xla, (y_f32, dx_f32, dk_f32)):
        assert error(ours, truth) <= 1e-2 * scale(truth)
        assert error(ours, truth) <= 1.5 * error(theirs, truth) + 1e-6 * scale(truth)


def _kernels(x, kernel, normalize_heads):
    """The names of the Mosaic GPU kernels in short_conv_pallas's forward and backward (traced
    only)."""
    def grads(x, kernel):
        def loss(x, kernel):
            return jnp.sum(short_conv_pallas(x, kernel, None, dtype=x.dtype,
                                             normalize_heads=normalize_heads).astype(jnp.float32))
        return jax.grad(loss, argnums=(0, 1))(x, kernel)
    return set(re.findall(r"short_conv_\w*", str(jax.make_jaxpr(grads)(x, kernel))))


def test_forward_and_backward_run_the_kernels_at_any_tap_count():
    x = jnp.zeros((1, 100, 256), jnp.bfloat16)
    for taps in (4, 9):   # 9 = PAD + 1, the most the kernels take
        assert _kernels(x, jnp.zeros((taps, 256), jnp.float32), 2) == \
            {"short_conv_forward", "short_conv_backward"}


def test_taps_before_each_document_read_zero():
    """dtotal at a document's first rows ignores the previous document's rows: the kernel's
    taps gradient with documents differs from the one without, exactly by those terms."""
    x, kernel, _ = _inputs(case_seed(5), 1, 64, 64, 4, jnp.float32, False)
    ids_two = jnp.asarray(np.r_[np.zeros(32), np.ones(32)][None], jnp.float32)
    dy = jnp.ones((1, 64, 1, 64), jnp.float32)
    taps = kernel.reshape(4, 1, 64)
    with interpret.gpu_interpret():
        results = [conv_backward(x.reshape(1, 64, 1, 64), dy, jnp.pad(ids, ((0, 0), (PAD, 0)), constant_values=-1.0),
                                 taps, normalize=False, eps=1e-6)
                   for ids in (jnp.zeros((1, 64), jnp.float32), ids_two)]
    (dtotal_one, dw_one), (dtotal_two, dw_two) = results
    # rows 32..34 lose their taps into rows 29..31: total changes there, nowhere else
    changed = np.flatnonzero(np.any(np.asarray(dtotal_one != dtotal_two), axis=(0, 2, 3)))
    assert changed.tolist() == [32, 33, 34]
    assert not np.allclose(dw_one, dw_two)


def test_pallas_needs_hopper_or_the_interpreter():
    x, kernel, _ = _inputs(0, 1, 8, 64, 4, jnp.bfloat16, False)
    with pytest.raises(UnsupportedImplementationError, match="Hopper"):
        short_conv(x, kernel, implementation="pallas")
    assert REGISTRY.select(None, platform="gpu", compute_capability="9.0", dtype=jnp.bfloat16,
                           channels=96, normalize_heads=None, kernel_size=4)[0] == "xla"


@pytest.mark.parametrize("normalize_heads, channels, length", [
    (2, 128, 100), (None, 192, 100), (3, 384, 100), (2, 128, 1), (None, 64, 256)])
def test_kernel_lowers_for_hopper(normalize_heads, channels, length):
    x = jnp.zeros((2, length, channels), jnp.bfloat16)
    kernel = jnp.zeros((4, channels), jnp.float32)
    segment_ids = jnp.zeros((2, length), jnp.int32)

    def grads(x, kernel):
        def loss(x, kernel):
            return jnp.sum(short_conv_pallas(x, kernel, segment_ids, dtype=jnp.bfloat16,
                                             normalize_heads=normalize_heads).astype(jnp.float32))
        return jax.grad(loss, argnums=(0, 1))(x, kernel)

    lowered = jax.jit(grads).trace(x, kernel).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


def _lowered_backward(length, monkeypatch=None, params=None):
    """(warpgroup barriers, shared-memory bytes, uses ex2.approx, name) of the backward kernel of
    (2, length, 768) x with 12 normalised heads, lowered for Hopper (with `params` in place of
    the kernel's own options when given)."""
    from mixer_kernels.mosaic_gpu.short_conv import backward_kernel
    if params is not None:
        monkeypatch.setattr(backward_kernel, "backward_params", lambda: params)
    x, kernel = jnp.zeros((2, length, 768), jnp.bfloat16), jnp.zeros((4, 768), jnp.float32)

    def grads(x, kernel):
        return jax.grad(lambda x, kernel: jnp.sum(short_conv_pallas(
            x, kernel, None, dtype=x.dtype, normalize_heads=12).astype(jnp.float32)),
            argnums=(0, 1))(x, kernel)
    with captured_kernels() as kernels:
        jax.jit(grads).trace(x, kernel).lower(lowering_platforms=("cuda",))
    ((name, module),) = [(name, module) for name, module in kernels if "backward" in name]
    return (warpgroup_barriers(module), shared_memory_bytes(module),
            "ex2.approx" in str(module), name)


def test_backward_kernel_sums_across_warps_in_one_round_at_three_programs_per_sm(monkeypatch):
    """The taps' gradient sums [64, 64] tiles over their rows across the four warps: with 8 KiB
    of reduction scratch each sum takes one round (two warpgroup barriers), fewer barriers
    than with Mosaic's default 2 KiB; the program still fits three to an SM (228 KiB, 1 KiB
    each reserved), and its exp is the hardware's ex2."""
    barriers, smem, approx, _ = _lowered_backward(128)
    default_barriers, default_smem, _, _ = _lowered_backward(
        192, monkeypatch, plgpu.CompilerParams(approx_math=True))
    assert barriers <= default_barriers - 4 * 6     # four sums, three rounds fewer each
    assert smem == default_smem + 6 * 1024
    assert 3 * (smem + 1024) <= 228 * 1024
    assert approx
