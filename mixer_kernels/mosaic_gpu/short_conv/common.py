"""Constants shared by the short convolution's backward kernels, their XLA passes and their
`supports` (the Mosaic GPU helpers: mixer_kernels/mosaic_gpu/common.py).

    PAD              padding rows around x or the ids in time; the kernels take W <= PAD + 1
                     taps
    BLOCK            rows per program
    GROUP            channels per program without normalize_heads
"""

PAD = 8
BLOCK = 64
GROUP = 64
