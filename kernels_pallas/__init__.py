"""Pallas Mosaic GPU kernels (pure functions of arrays, no Flax) and the dispatch registry
that the ops in `fpa_jax` and `gdn_jax` use to choose between them and the XLA paths."""
