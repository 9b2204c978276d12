"""Pallas Mosaic GPU kernels for causal attention with FPA, FoX or no bias (see `vjp`)."""
