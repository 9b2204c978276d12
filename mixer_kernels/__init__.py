"""Kernels of the mixers' ops, one subpackage per backend (`mosaic_gpu`): pure functions of
arrays, no Flax. A backend imports `mixer_core` and itself only; the ops in `fpa_jax` and
`gdn_jax` import a backend's `register` modules into their dispatch tables."""
