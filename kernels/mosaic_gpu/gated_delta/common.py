"""Constants shared by the gated delta rule's kernels (their Mosaic GPU helpers:
kernels/mosaic_gpu/common.py).

    SMEM_BYTES           an H200 block's shared memory (227 KiB)
    SUPPORTED_DIMS       key / value head dims the kernels are built for
"""

SMEM_BYTES = 232448
SUPPORTED_DIMS = (64, 128, 256)
