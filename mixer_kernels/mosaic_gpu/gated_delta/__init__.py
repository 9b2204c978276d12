"""Pallas Mosaic GPU kernels for the chunked gated delta rule (see `state_kernels`)."""
