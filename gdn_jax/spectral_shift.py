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

`optimizer_labels(params)` names the optimizer group of every parameter, for
optax.multi_transform: "alpha" (a_proj kernels; learning rate scaled by s), "no_decay" (leaves
named scale, bias, A_log, dt_bias or rho (FPA), and every leaf of a module whose name contains
"norm") or "default" (everything else, embeddings and conv kernels included). A boxed leaf
(nn.Partitioned) gets one label, which optax accepts as a prefix of the boxed tree.
"""

import math
import numbers
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

ALPHA_PROJECTION = ("a_proj", "kernel")
NO_DECAY_NAMES = frozenset({"A_log", "dt_bias", "rho", "bias", "scale"})
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
    names = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            names.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            names.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            names.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
            names.append(str(entry.key))
        else:
            names.append(str(entry))
    return tuple(names)


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


def _label(names: tuple[str, ...]) -> str:
    if _is_alpha_projection(names):
        return "alpha"
    leaf = names[-1] if names else ""
    parent = names[-2] if len(names) >= 2 else ""
    if leaf in NO_DECAY_NAMES or "norm" in parent.lower():
        return "no_decay"
    return "default"


def optimizer_labels(params):
    """Same-structure pytree of "alpha" | "no_decay" | "default" (a box becomes one label)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: _label(_path_names(path)), params, is_leaf=_is_box)
