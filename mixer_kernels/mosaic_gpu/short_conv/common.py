"""Constants shared by the short convolution's backward kernels, their XLA passes and their
`supports` (the Mosaic GPU helpers: mixer_kernels/mosaic_gpu/common.py).

    PAD              padding rows around x or the ids in time; the kernels take W <= PAD + 1
                     taps
    BLOCK            rows per program
    GROUP            channels per program without normalize_heads
    DX_IN_KERNEL     read when the backward is traced. False (the default): the kernel
                     returns d total and XLA forms dx (`backward_kernel.conv_backward`); True:
                     the kernel writes dx itself (`backward_kernel.conv_backward_dx`) where its
                     buffers fit in shared memory (`dx_kernel_fits`). On an H200 the second
                     took 0.256 against 0.149 ms of device time per forward+backward at
                     (8, 2048, 768) (docs/benchmarks.md, "dx in the convolution's kernel")
    SMEM_ALIGNMENT   Pallas Mosaic GPU's alignment of each scratch buffer (bytes)
    REDUCTION_BYTES  its default shared memory for cross-warp reductions (bytes)
"""

from mixer_kernels.mosaic_gpu.gated_delta.common import SMEM_BYTES

PAD = 8
BLOCK = 64
GROUP = 64
DX_IN_KERNEL = False
SMEM_ALIGNMENT = 1024
REDUCTION_BYTES = 2048


def dx_kernel_smem_bytes(width: int, dim: int, itemsize: int) -> int:
    """Shared memory of one `conv_backward_dx` program: 2W - 1 tiles of x and W of dy
    ([BLOCK, D], `itemsize` bytes), dx's tile, the ids of BLOCK + 2 PAD rows, the taps and
    their gradient [W, D] float32 and the barrier, each aligned as Pallas places them, plus
    the cross-warp reductions' scratch."""
    aligned = lambda size: -(-size // SMEM_ALIGNMENT) * SMEM_ALIGNMENT
    buffers = ((2 * width - 1) * BLOCK * dim * itemsize, width * BLOCK * dim * itemsize,
               BLOCK * dim * itemsize, (BLOCK + 2 * PAD) * 4, width * dim * 4, width * dim * 4, 8)
    return sum(map(aligned, buffers)) + REDUCTION_BYTES


def dx_kernel_fits(width: int, dim: int, itemsize: int) -> bool:
    """Whether one `conv_backward_dx` program fits in an H200 block's shared memory."""
    return dx_kernel_smem_bytes(width, dim, itemsize) <= SMEM_BYTES
