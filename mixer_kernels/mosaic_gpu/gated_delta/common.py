"""Constants shared by the gated delta rule's kernels (their Mosaic GPU helpers:
mixer_kernels/mosaic_gpu/common.py).

    CHUNK                the chunk length C of the WY form (the op's chunk_size must equal it)
    SMEM_BYTES           an H200 block's shared memory (227 KiB)
    SUPPORTED_DIMS       key / value head dims the kernels are built for
"""

CHUNK = 64
SMEM_BYTES = 232448
SUPPORTED_DIMS = (64, 128, 256)
