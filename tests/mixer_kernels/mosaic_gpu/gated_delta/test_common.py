"""The gated delta kernels' shared helpers (mixer_kernels/mosaic_gpu/gated_delta/common.py):
the head sizes of grouped value heads and the shared-memory check's error."""

import pytest

from mixer_kernels.mosaic_gpu.gated_delta.common import SMEM_BYTES, check_smem, head_sizes


def test_head_sizes_of_grouped_value_heads():
    # q / k [B=2, Tp=128, H=4, K=64] read by HV=8 value heads of dim V=128: groups of 2
    assert head_sizes((2, 128, 4, 64), 8, 128) == (2, 4, 64, 8, 128, 2)
    assert head_sizes((1, 64, 3, 32), 3, 16) == (1, 3, 32, 3, 16, 1)


def test_check_smem_names_the_kernel_and_the_sizes():
    check_smem("WY kernel", SMEM_BYTES, 64, 64)      # exactly the budget fits
    with pytest.raises(ValueError, match=r"the WY kernel needs 232449 bytes .* K = 256, V = 128"):
        check_smem("WY kernel", SMEM_BYTES + 1, 256, 128)
