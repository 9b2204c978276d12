"""Constants shared by the gated delta rule's kernels (their Mosaic GPU helpers:
mixer_kernels/mosaic_gpu/common.py).

    CHUNK                the chunk length C of the WY form (the op's chunk_size must equal it)
    SMEM_BYTES           an H200 block's shared memory (227 KiB)
    SUPPORTED_HEAD_DIMS  key / value head dims the kernels are built for
    check_smem(kernel, need, key_dim, value_dim)   a clear error when a block needs more
                         shared memory than SMEM_BYTES
"""

CHUNK = 64
SMEM_BYTES = 232448
SUPPORTED_HEAD_DIMS = (64, 128, 256)


def check_smem(kernel: str, need: int, key_dim: int, value_dim: int) -> None:
    if need > SMEM_BYTES:
        raise ValueError(f"the {kernel} needs {need} bytes of shared memory for K = {key_dim}, "
                         f"V = {value_dim}, more than {SMEM_BYTES}")
