"""Pallas Mosaic GPU kernel for the backward of the gated delta layer's short convolution."""
