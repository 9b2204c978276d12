"""Pieces every attention layer shares: projections, initialisers, RoPE positions, checks.

    q, k, v = x @ W_query, x @ W_key, x @ W_value        [B, T, H, head_dim]  (W_*: [D, H, head_dim])
    y       = o @ W_out                                   [B, T, D]            (W_out: [H, head_dim, D])
    scalar map  x [B, T, D] -> <w_h, x_t> + c_h           float32 [B, T, H]    (w: [D, H], c: [H])
    positions   0, 1, 2, ... restarting at every document start (RoPE's default)

Parameters carry logical axis names: projection kernels ("embed", "heads", "head_dim"), output
kernel ("heads", "head_dim", "embed"), scalar-map kernels ("embed", "heads"), per-head vectors
("heads",). Every check raises naming the layer and the field or argument.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from fpa_jax.baselines.rope import apply_rope
from fpa_jax.fpa.fields import document_starts
from fpa_jax.registries import REGISTRIES
from mixer_core.inputs import check_mixer_inputs

PROJECTION_AXES = ("embed", "heads", "head_dim")
OUTPUT_AXES = ("heads", "head_dim", "embed")
SCALAR_MAP_AXES = ("embed", "heads")
PER_HEAD_AXES = ("heads",)

DEFAULT_FORGET_INIT_RANGE = (0.95, 0.99)


# ----------------------------------------------------------------------------------------------
# Initialisers
# ----------------------------------------------------------------------------------------------


def per_head_forget_values(num_heads: int, forget_init_range=DEFAULT_FORGET_INIT_RANGE) -> np.ndarray:
    """Initial forget gates f_h, one per head, spread over `forget_init_range` = (low, high).

    The decay rates -log f_h are geometrically spaced between -log(low) and -log(high), so the
    heads start with time-scales 1/(-log f_h) spread evenly on a log scale (about 20 to 100
    tokens for the default (0.95, 0.99)). A single head gets the geometric middle.
    """
    low, high = forget_init_range
    rate_fast, rate_slow = -math.log(low), -math.log(high)
    if num_heads == 1:
        rates = np.array([math.sqrt(rate_fast * rate_slow)])
    else:
        rates = np.exp(np.linspace(math.log(rate_fast), math.log(rate_slow), num_heads))
    return np.exp(-rates)


def constant_vector_init(values: np.ndarray):
    """Initialiser returning the given per-head vector (shape must match)."""

    def init(key, shape, dtype=jnp.float32):
        del key
        if tuple(shape) != values.shape:
            raise ValueError(f"per-head init: expected shape {values.shape}, got {tuple(shape)}")
        return jnp.asarray(values, dtype)

    return init


def logical(init, axes):
    return nn.with_logical_partitioning(init, axes)


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------


def check_positive_int(layer: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{layer}: {name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value}")


def check_positive_float(layer: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{layer}: {name} must be a positive number, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{layer}: {name} must be a positive finite number, got {value}")


def check_choice(layer: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{layer}: {name} must be one of {list(choices)}, got {value!r}")


def check_float_dtype(layer: str, name: str, value) -> None:
    try:
        ok = jnp.issubdtype(jnp.dtype(value), jnp.floating)
    except TypeError:
        ok = False
    if not ok:
        raise TypeError(f"{layer}: {name} must be a floating dtype, got {value!r}")


def check_implementation(module) -> None:
    """`module.implementation` must be None or a name in the registry of `module.op_name`."""
    try:
        REGISTRIES[module.op_name].check_name(module.implementation)
    except ValueError as error:
        raise ValueError(f"{type(module).__name__}: {error}") from None


def check_block_size(module) -> None:
    """`module.block_size`: None (the op's default) or a positive multiple of 8."""
    size = module.block_size
    if size is not None:
        check_positive_int(type(module).__name__, "block_size", size)
        if size % 8:
            raise ValueError(f"{type(module).__name__}: block_size must be a multiple of 8, got {size}")


def block_options(module) -> dict:
    """{"block_size": module.block_size} when it is set, else {} (the op's own default)."""
    return {} if module.block_size is None else {"block_size": module.block_size}


def check_common(module) -> None:
    layer = type(module).__name__
    check_positive_int(layer, "num_heads", module.num_heads)
    check_positive_int(layer, "head_dim", module.head_dim)
    check_float_dtype(layer, "dtype", module.dtype)
    check_float_dtype(layer, "param_dtype", module.param_dtype)
    check_implementation(module)


def check_forget_init_range(layer: str, value) -> None:
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(f, (int, float)) and 0.0 < f < 1.0 for f in value)
        and value[0] <= value[1]
    )
    if not ok:
        raise ValueError(
            f"{layer}: forget_init_range must be (low, high) with 0 < low <= high < 1, got {value!r}"
        )


# ----------------------------------------------------------------------------------------------
# Positions and RoPE
# ----------------------------------------------------------------------------------------------


def positions_within_segments(segment_ids, batch: int, length: int):
    """0, 1, 2, ... along the sequence, restarting at each document start. Returns [B, T] int32."""
    steps = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if segment_ids is None:
        return steps
    segment_start = jax.lax.cummax(jnp.where(document_starts(segment_ids), steps, 0), axis=1)
    return steps - segment_start


def check_rope(layer: str, module) -> None:
    check_positive_float(layer, "rope_base", module.rope_base)
    if module.position == "rope" and module.head_dim % 2:
        raise ValueError(f"{layer}: position='rope' needs an even head_dim, got {module.head_dim}")


def checked_rope_projections(module, x, segment_ids, positions, position_choices):
    """Checks of a layer with `position` and `rope_base` fields, then its q, k, v
    [B, T, H, head_dim], q and k rotated by RoPE when position == "rope"."""
    layer = type(module).__name__
    check_common(module)
    check_choice(layer, "position", module.position, position_choices)
    check_rope(layer, module)
    check_mixer_inputs(layer, x, segment_ids, positions)
    q, k, v = head_projections(module, x, ("query", "key", "value"))
    if module.position == "rope":
        q, k = rotate(module, q, k, x, segment_ids, positions)
    return q, k, v


def rotate(module, q, k, x, segment_ids, positions):
    """RoPE on q and k [B, T, H, D]; positions default to restarting at each document."""
    if positions is None:
        positions = positions_within_segments(segment_ids, *x.shape[:2])
    return (apply_rope(q, positions, base=module.rope_base),
            apply_rope(k, positions, base=module.rope_base))


# ----------------------------------------------------------------------------------------------
# Projections (called inside the layers' compact __call__)
# ----------------------------------------------------------------------------------------------


def head_projections(module, x, names):
    """q/k/v-style projections x [B,T,D] -> [B,T,H,head_dim], one DenseGeneral per name."""
    return [
        nn.DenseGeneral(
            features=(module.num_heads, module.head_dim),
            axis=-1,
            use_bias=False,
            dtype=module.dtype,
            param_dtype=module.param_dtype,
            kernel_init=logical(nn.initializers.lecun_normal(), PROJECTION_AXES),
            name=name,
        )(x)
        for name in names
    ]


def output_projection(module, heads_out, model_dim: int):
    """[B,T,H,head_dim] -> [B,T,D] through the "out" kernel [H, head_dim, D]."""
    return nn.DenseGeneral(
        features=model_dim,
        axis=(-2, -1),
        use_bias=False,
        dtype=module.dtype,
        param_dtype=module.param_dtype,
        kernel_init=logical(nn.initializers.lecun_normal(), OUTPUT_AXES),
        name="out",
    )(heads_out)


def per_head_scalar_map(module, x, name: str, bias_init=nn.initializers.zeros):
    """x [B,T,D] -> float32 [B,T,H]: <w_h, x_t> + c_h; kernel [D, H] starts at zero."""
    return nn.Dense(
        features=module.num_heads,
        use_bias=True,
        dtype=jnp.float32,
        param_dtype=module.param_dtype,
        kernel_init=logical(nn.initializers.zeros, SCALAR_MAP_AXES),
        bias_init=logical(bias_init, PER_HEAD_AXES),
        name=name,
    )(x)


def attention_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
