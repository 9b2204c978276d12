"""Constants and helpers shared by the attention kernels and their XLA pre- and post-passes.

    BIG                  stands for +inf in minima (no inf - inf)
    SUPPORTED_HEAD_DIMS  head dims the kernels are built for
    decay(excess, tau)   exp(-excess / tau) for excess >= 0 (clamped), with a multiply
"""

import jax.numpy as jnp

BIG = 1e30
SUPPORTED_HEAD_DIMS = (64, 128)


def decay(excess, tau):
    """exp(-excess / tau) for excess >= 0 (negative excess is clamped to 0)."""
    return jnp.exp(jnp.maximum(excess, 0.0) * (-1.0 / tau))
