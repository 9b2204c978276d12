"""SpectralShift: the one-time reparameterisation of the alpha (retention) projections.

    s = (L_ref / L_tar) ** k                      k = 0.5 by default
    W_alpha [..., D_in, HV]   every leaf whose path ends in ".../a_proj/kernel"
    matrix mode: mu = mean(W_alpha over its last two axes)          one scalar per layer
    row mode:    mu = mean(W_alpha over axis -2 (D_in))             one mean per alpha output
                 unit, i.e. per column of the Dense kernel (= per row of the PyTorch weight)
    W_alpha <- mu + s * (W_alpha - mu)            in float32 (or wider), cast back to its dtype

Leading axes beyond the last two (e.g. layers stacked by nn.scan) are independent layers.
Nothing else changes: not a_proj's bias, not A_log, not dt_bias. Apply it exactly once per
extension stage, to the parameters only (never to an optimizer state).

`optimizer_labels(params, freeze_gdn_decay=False)` names the optimizer group of every
parameter, for optax.multi_transform (the one rule; train/core/optimizer.py uses it), first match:

    "alpha"     path ends in a_proj/kernel          learning rate x s, weight decay
    "frozen"    A_log, dt_bias (freeze_gdn_decay)   zero update
    "no_decay"  leaves named scale, bias, rho (FPA), A_log, dt_bias, and every 0-/1-D leaf
    "default"   everything else (embeddings and conv kernels included)

A boxed leaf (nn.Partitioned) gets one label, which optax accepts as a prefix of the boxed tree.
Paths are named by jax.tree_util.keystr (simple, "/"-separated).
"""

import math
import numbers
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

ALPHA_PROJECTION = ("a_proj", "kernel")
GDN_DECAY_NAMES = frozenset({"A_log", "dt_bias"})
NO_DECAY_NAMES = GDN_DECAY_NAMES | {"rho", "bias", "scale"}
OPTIMIZER_GROUPS = ("default", "no_decay", "alpha", "frozen")
SPECTRAL_SHIFT_MODES = ("matrix", "row")


def _real_number(where: str, value, *, minimum: float, inclusive: bool) -> float:
    """float(value) for a finite real number (not a bool) above `minimum`, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < minimum or (value == minimum and not inclusive):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{where} must be a finite number {bound}, got {value!r}")
    return float(value)


def spectralshift_scale(l_ref: float, l_tar: float, k: float = 0.5) -> float:
    """s = (l_ref / l_tar) ** k for extending the context from l_ref to l_tar tokens."""
    l_ref = _real_number("spectralshift_scale: l_ref", l_ref, minimum=0.0, inclusive=False)
    l_tar = _real_number("spectralshift_scale: l_tar", l_tar, minimum=0.0, inclusive=False)
    k = _real_number("spectralshift_scale: k", k, minimum=0.0, inclusive=True)
    if l_tar < l_ref:
        raise ValueError(f"spectralshift_scale: l_tar must be >= l_ref (an extension), got l_ref={l_ref}, "
                         f"l_tar={l_tar}; are the arguments swapped?")
    return (l_ref / l_tar) ** k


def _path_names(path) -> tuple[str, ...]:
    return tuple(jax.tree_util.keystr(path, simple=True, separator="/").split("/"))


def _is_box(node) -> bool:
    return isinstance(node, nn.meta.AxisMetadata)


def _map_leaves(fn: Callable[[tuple[str, ...], Any], Any], tree):
    """Apply fn(path_names, unboxed_value) to every leaf; boxes (nn.Partitioned ...) keep their metadata."""
    def visit(path, node):
        if _is_box(node):
            return node.replace_boxed(fn(_path_names(path), node.unbox()))
        return fn(_path_names(path), node)
    return jax.tree_util.tree_map_with_path(visit, tree, is_leaf=_is_box)


def _is_alpha_projection(names: tuple[str, ...]) -> bool:
    return names[-len(ALPHA_PROJECTION):] == ALPHA_PROJECTION


def _shift(weight: jax.Array, names: tuple[str, ...], s: float, mode: str) -> jax.Array:
    weight = jnp.asarray(weight)
    where = "/".join(names)
    if weight.ndim < 2:
        raise ValueError(f"spectral_shift: {where} must have rank >= 2 ([..., D_in, HV]), got shape {weight.shape}")
    if not jnp.issubdtype(weight.dtype, jnp.floating):
        raise TypeError(f"spectral_shift: {where} must be floating point, got {weight.dtype}")
    wide = weight.astype(jnp.promote_types(weight.dtype, jnp.float32))
    axes = (-2, -1) if mode == "matrix" else (-2,)
    mean = jnp.mean(wide, axis=axes, keepdims=True)
    return (mean + s * (wide - mean)).astype(weight.dtype)


def spectral_shift(params, *, s: float, mode: str = "matrix"):
    """Return params with every ".../a_proj/kernel" W replaced by mu + s (W - mu) (see module doc).

    params: dict / FrozenDict tree, boxed (nn.Partitioned) or not; returned with the same structure.
    """
    s = _real_number("spectral_shift: s", s, minimum=0.0, inclusive=False)
    if mode not in SPECTRAL_SHIFT_MODES:
        raise ValueError(f"spectral_shift: mode must be one of {SPECTRAL_SHIFT_MODES}, got {mode!r}")
    found = []

    def rewrite(names, value):
        if not _is_alpha_projection(names):
            return value
        found.append("/".join(names))
        return _shift(value, names, s, mode)

    shifted = _map_leaves(rewrite, params)
    if not found:
        raise ValueError("spectral_shift: found no alpha projection weights (no leaf path ending in "
                         "'a_proj/kernel'); pass the model parameters of a model with GatedDeltaNet layers")
    return shifted


def _label(names: tuple[str, ...], ndim: int, freeze_gdn_decay: bool) -> str:
    if _is_alpha_projection(names):
        return "alpha"
    if freeze_gdn_decay and names[-1] in GDN_DECAY_NAMES:
        return "frozen"
    if names[-1] in NO_DECAY_NAMES or ndim < 2:
        return "no_decay"
    return "default"


def optimizer_labels(params, freeze_gdn_decay: bool = False):
    """Same-structure pytree of OPTIMIZER_GROUPS names (a box becomes one label; module doc)."""
    def label(path, node):
        value = node.unbox() if _is_box(node) else node
        return _label(_path_names(path), jnp.ndim(value), freeze_gdn_decay)

    return jax.tree_util.tree_map_with_path(label, params, is_leaf=_is_box)
