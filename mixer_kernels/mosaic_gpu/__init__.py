"""Pallas Mosaic GPU kernels (Hopper): attention (FPA, FoX, softmax), the chunked gated delta
rule and the short convolution's backward; `common` holds the helpers they share."""
