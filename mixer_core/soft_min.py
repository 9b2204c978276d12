"""Numerics shared by FPA's XLA paths and its kernels' passes: a finite stand-in for +inf in
minima, and the soft-minimum's weights relative to a hard minimum.

    BIG                 stands for +inf in minima (no inf - inf)
    decay(excess, tau)  exp(-excess / tau) for excess >= 0 (negative excess, masked garbage
                        included, is clamped to 0 so nothing overflows), with a multiply
"""

import jax.numpy as jnp

BIG = 1e30


def decay(excess, tau):
    """exp(-excess / tau) for excess >= 0 (negative excess is clamped to 0)."""
    return jnp.exp(jnp.maximum(excess, 0.0) * (-1.0 / tau))
