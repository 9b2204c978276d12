"""RoPE when a model trained at context L_ref continues at L_tar = r * L_ref (docs/gdn.md,
"Attention layers when extending"): ABF, YaRN, DroPE.

    omega_i  = base ** (-2 i / D)           i = 0 .. D/2 - 1 (rotate-half pairs, fpa_jax/baselines/rope.py)
    lambda_i = 2 pi / omega_i               wavelength of pair i, in tokens

    ABF    a larger base: base' = base * r ** (D / (D - 2)), so the slowest pair's wavelength
           grows by r (or any base' > base given explicitly); nothing else changes
    YaRN   factor r, original context L0:   rho_i = L0 / lambda_i  (turns of pair i within L0)
           ramp_i   = clip((rho_i - low) / (high - low), 0, 1)        low = 1, high = 32
           omega'_i = ramp_i * omega_i + (1 - ramp_i) * omega_i / r
           fast pairs (many turns within L0) keep their frequency, slow pairs are interpolated
           by r, the ones between are blended; q and k are each multiplied by
           m = 0.1 ln r + 1, i.e. the logits by m ** 2 (the attention temperature)
    DroPE  no rotation at all (the layer runs as NoPE; a config choice, no code here)

`YarnScaling(factor, original_length)` is the layer's option (hashable, a Flax field);
`rotate_yarn(q, k, positions, base=..., scaling=...)` applies it to q, k [B, T, H, D].
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp

from fpa_jax.fpa import checks

YARN_LOW = 1.0
YARN_HIGH = 32.0


def _positive(name: str, value, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not value > minimum:
        raise ValueError(f"{name}: expected a finite number > {minimum}, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """YaRN's parameters: factor r >= 1 and the context L0 the model was trained at."""

    factor: float
    original_length: int
    low: float = YARN_LOW
    high: float = YARN_HIGH

    def __post_init__(self):
        if _positive("YarnScaling.factor", self.factor) < 1.0:
            raise ValueError(f"YarnScaling.factor: expected >= 1, got {self.factor!r}")
        if isinstance(self.original_length, bool) or not isinstance(
                self.original_length, numbers.Integral) or self.original_length < 1:
            raise ValueError(f"YarnScaling.original_length: expected an int >= 1, got "
                             f"{self.original_length!r}")
        if not 0 < _positive("YarnScaling.low", self.low) < _positive("YarnScaling.high", self.high):
            raise ValueError(f"YarnScaling: expected 0 < low < high, got low={self.low}, "
                             f"high={self.high}")


def rope_frequencies(head_dim: int, base: float) -> jnp.ndarray:
    """omega_i = base ** (-2 i / D), [D/2] float32."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim < 2 \
            or head_dim % 2:
        raise ValueError(f"head_dim: expected an even int >= 2, got {head_dim!r}")
    base = _positive("base", base, 1.0)
    return base ** (-jnp.arange(head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim)


def abf_base(base: float, factor: float, head_dim: int) -> float:
    """base * factor ** (D / (D - 2)): the slowest pair's wavelength grows by `factor`."""
    base, factor = _positive("base", base, 1.0), _positive("factor", factor)
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim < 4 \
            or head_dim % 2:
        raise ValueError(f"head_dim: expected an even int >= 4, got {head_dim!r}")
    if factor < 1.0:
        raise ValueError(f"factor: expected >= 1 (an extension), got {factor}")
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_frequencies(head_dim: int, base: float, scaling: YarnScaling) -> jnp.ndarray:
    """omega'_i of YaRN (module doc), [D/2] float32."""
    omega = rope_frequencies(head_dim, base)
    turns = scaling.original_length * omega / (2.0 * math.pi)            # rho_i = L0 / lambda_i
    ramp = jnp.clip((turns - scaling.low) / (scaling.high - scaling.low), 0.0, 1.0)
    return ramp * omega + (1.0 - ramp) * omega / scaling.factor


def yarn_attention_factor(factor: float) -> float:
    """m = 0.1 ln r + 1, applied to q and to k (the logits scale by m ** 2)."""
    return 0.1 * math.log(_positive("factor", factor)) + 1.0


def rotate_by_frequencies(x, positions, frequencies):
    """x [B, T, H, D] rotated pairwise (rotate-half) by angles positions_t * frequencies_i;
    frequencies [D/2]; float32 inside, x's dtype out."""
    checks.require_rank("x", x, 4)
    checks.require_float("x", x)
    batch, length, _, head_dim = x.shape
    checks.require_shape("positions", positions, (batch, length))
    checks.require_shape("frequencies", frequencies, (head_dim // 2,))
    angles = jnp.asarray(positions, jnp.float32)[:, :, None, None] * frequencies
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rotate_yarn(q, k, positions, *, base: float, scaling: YarnScaling):
    """(q, k) [B, T, H, D] rotated by YaRN's frequencies and each scaled by m (module doc)."""
    if not isinstance(scaling, YarnScaling):
        raise TypeError(f"scaling: expected a YarnScaling, got {type(scaling).__name__}")
    frequencies = yarn_frequencies(q.shape[-1], base, scaling)
    m = yarn_attention_factor(scaling.factor)
    return tuple((rotate_by_frequencies(x, positions, frequencies).astype(jnp.float32) * m
                  ).astype(x.dtype) for x in (q, k))
