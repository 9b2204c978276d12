"""Padding along time, shared by the kernels' wrappers and the blocked XLA paths.

    pad_time(x, Tp, axis=1, value=0)   x [..., T (at axis), ...] -> [..., Tp, ...]; new = value
"""

import jax.numpy as jnp


def pad_time(x, length, axis=1, value=0):
    """Pad x along `axis` at the end up to `length` with `value` (no copy if already there)."""
    pad = length - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)
