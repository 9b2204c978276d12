"""Constants shared by the short convolution's backward kernel, its XLA passes and its
`supports` (the Mosaic GPU helpers: mixer_kernels/mosaic_gpu/common.py).

    PAD              padding rows in front of x and the ids; the kernel takes W <= PAD + 1
                     taps
    BLOCK            rows per program
    GROUP            channels per program without normalize_heads
    SUPPORTED_HEAD_DIMS   channels per normalised head the kernel is built for
"""

PAD = 8
BLOCK = 64
GROUP = 64
SUPPORTED_HEAD_DIMS = (64, 128)
