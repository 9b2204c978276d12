"""Position encodings for the softmax baseline: rotary embeddings (RoPE) and ALiBi slopes.

RoPE, "rotate-half" convention (the two halves of the head dim form the rotated pairs):

    x = [x1, x2]                 x1, x2 = x[..., :D/2], x[..., D/2:]
    omega_i = base ** (-2 i / D)  i = 0 .. D/2 - 1;   angle_ti = positions_t * omega_i
    rope(x)_t = [x1 cos(angle_t) - x2 sin(angle_t),  x2 cos(angle_t) + x1 sin(angle_t)]

    x [B, T, H, D] (D even), positions [B, T] (int or float) -> [B, T, H, D], dtype of x
    (angles and the rotation in float32). Hence <rope(q)_t, rope(k)_s> depends on t - s only.

ALiBi slopes (Press et al.): for a power-of-two head count H, slope_i = 2 ** (-8 (i + 1) / H),
i = 0 .. H-1. Otherwise take the slopes of the nearest lower power of two P and append every
other slope of 2P until H slopes: [slopes(P), slopes(2P)[0::2][:H-P]]. The bias it defines is
-slope * (t - s) (see softmax.py).
"""

import math
import numbers

import jax.numpy as jnp

from fpa_jax.fpa import checks


def apply_rope(x, positions, *, base=10000.0):
    """Rotate x [B, T, H, D] by positions [B, T]; rotate-half pairing; returns x's dtype."""
    checks.require_rank("x", x, 4)
    checks.require_float("x", x)
    batch, length, _, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"x: expected an even head dim for RoPE, got shape {tuple(x.shape)}")
    checks.require_shape("positions", positions, (batch, length))
    if not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base: expected a Python float > 1, got {base!r}")
    half = head_dim // 2
    frequencies = float(base) ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)
    angles = jnp.asarray(positions, jnp.float32)[:, :, None, None] * frequencies  # [B,T,1,D/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def _power_of_two_slopes(count):
    return [2.0 ** (-8.0 * (i + 1) / count) for i in range(count)]


def alibi_slopes(num_heads):
    """ALiBi slopes [num_heads] float32 (geometric; interpolated for non-powers of two)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"num_heads: expected a positive int, got {num_heads!r}")
    num_heads = int(num_heads)
    lower = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _power_of_two_slopes(lower)
    slopes += _power_of_two_slopes(2 * lower)[0::2][:num_heads - lower]
    return jnp.asarray(slopes, jnp.float32)
