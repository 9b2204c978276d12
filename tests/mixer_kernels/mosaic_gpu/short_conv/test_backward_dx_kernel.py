"""The short convolution's backward with dx formed in the kernel (short_conv/backward.py
DX_IN_KERNEL, backward_dx_kernel.py): its tiles own every row once and hold the rows each
owned row's dx reads; in GPU interpret mode it matches "xla" at T = 1, T shorter than the
taps, with a clipped last tile, at 2, 4 and 9 taps, with documents and in bf16; it lowers for
Hopper with its shift matrix in registers, at three programs per SM at D = 64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_core import interpret
from mixer_kernels.mosaic_gpu.short_conv import backward
from mixer_kernels.mosaic_gpu.short_conv.backward_dx_kernel import STEP, tiles_and_ends
from mixer_kernels.mosaic_gpu.short_conv.common import BLOCK, PAD
from tests.mixer_kernels.mosaic_gpu.short_conv.test_backward import (_loss_and_grads,
                                                                     _lowered_backward,
                                                                     assert_matches_xla)
from tests.seeds import case_seed


@pytest.mark.parametrize("length", [1, 8, 55, 56, 57, 63, 64, 65, 111, 112, 113, 2047, 2048])
def test_tiles_own_every_row_once_and_hold_what_dx_reads(length):
    rows = -(-length // BLOCK) * BLOCK
    tiles, ends = tiles_and_ends(length, rows)
    owner = np.zeros(rows, int)
    for k in range(tiles):
        offset, count = ends.get(k, (0, STEP))
        start = STEP * k - offset                  # the tile's first row
        assert 0 <= start and start + BLOCK <= rows
        assert offset % 8 == 0 and count % 8 == 0 and offset + count <= BLOCK
        owned = np.arange(STEP * k, STEP * k + count)
        owner[owned] += 1
        # each owned row's dx reads d total up to PAD rows later: inside the tile or past T
        assert min(owned[-1] + PAD, length - 1) < start + BLOCK
    assert np.all(owner[:length] == 1) and np.all(owner <= 1)
    assert len(ends) <= 1


CASES = {   # case: (length, channels, taps, normalize_heads, documents, dtype)
    "ragged_documents_heads": (70, 128, 4, 2, True, jnp.float32),
    "one_block_clipped_end": (64, 128, 4, None, False, jnp.float32),
    "t1": (1, 128, 4, 2, False, jnp.float32),
    "shorter_than_the_taps": (3, 64, 4, None, True, jnp.float32),
    "nine_taps_documents": (130, 128, PAD + 1, None, True, jnp.float32),
    "two_taps": (120, 128, 2, 2, True, jnp.float32),
    "bf16_several_tiles": (200, 128, 4, 2, True, jnp.bfloat16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_xla(case, monkeypatch):
    length, channels, taps, normalize_heads, documents, dtype = CASES[case]
    rng = np.random.default_rng(case_seed(1700 + sorted(CASES).index(case)))
    x = jnp.asarray(rng.standard_normal((2, length, channels)), dtype)
    kernel = jnp.asarray(rng.uniform(-0.5, 0.5, (taps, channels)), jnp.float32)
    segment_ids = None
    if documents:
        segment_ids = jnp.asarray(np.cumsum(rng.random((2, length)) < 0.08, axis=1), jnp.int32)
    cotangent = jnp.asarray(rng.standard_normal((2, length, channels)), jnp.float32)
    args = (x, kernel, segment_ids, normalize_heads, cotangent)
    y_xla, (dx_xla, dk_xla) = _loss_and_grads("xla", *args)
    exact = None if dtype == jnp.float32 else _loss_and_grads(
        "xla", x.astype(jnp.float32), *args[1:])
    monkeypatch.setattr(backward, "DX_IN_KERNEL", True)
    # a program of its own: the switch is read when the backward is traced, and
    # test_backward.py's compiled loss keeps the traces made without it
    with interpret.gpu_interpret():
        y, (dx, dk) = jax.jit(_loss_and_grads.__wrapped__, static_argnums=(0, 4))("pallas", *args)
    assert not interpret.races_found()
    assert_matches_xla((y, dx, dk), (y_xla, dx_xla, dk_xla), exact)


@pytest.mark.parametrize("length", [64, 130])   # with a clipped last tile, without
def test_kernel_lowers_for_hopper_at_three_programs_per_sm(length, monkeypatch):
    monkeypatch.setattr(backward, "DX_IN_KERNEL", True)
    _, smem, _, name = _lowered_backward(length)
    assert name.startswith("short_conv_backward_dx")
    assert 3 * (smem + 1024) <= 228 * 1024
