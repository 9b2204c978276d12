"""The train-state pytree as a checkpoint stores it, and the checks of a restore against it.

Typed PRNG key arrays are stored as their uint32 key data (and re-wrapped on restore). Each
leaf is recorded as {path, shape, dtype, fingerprint}:

    fingerprint(x) = sum_i bits(x_i) * w_i  (mod 2^32),  bits = the element's raw bits as
                     uint32, w_i odd and depending on the element's index, so any single
                     changed element changes it; computed on device, independent of sharding.

A requested tree that differs from the recorded one (paths, shapes, dtypes) is a
StateMismatchError, except for top-level entries the caller names as ignored.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def _is_prng_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def storable_state(state: Any) -> tuple[Any, dict[str, str]]:
    """Replaces typed PRNG key arrays by their uint32 key data; returns (tree, {path: impl})."""
    impls: dict[str, str] = {}

    def convert(path, leaf):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise TypeError(
                f"state{jax.tree_util.keystr(path)}: expected an array, got {type(leaf).__name__}"
            )
        if _is_prng_key(leaf):
            impls[jax.tree_util.keystr(path)] = str(jax.random.key_impl(leaf))
            return jax.random.key_data(leaf)
        return leaf

    return jax.tree_util.tree_map_with_path(convert, state), impls


def abstract_storable(abstract_state: Any) -> tuple[Any, dict[str, str]]:
    """ShapeDtypeStructs (with shardings) of what `storable_state` stores; {path: key dtype}."""
    key_dtypes: dict[str, str] = {}

    def convert(path, leaf):
        where = f"abstract_state{jax.tree_util.keystr(path)}"
        if isinstance(leaf, jax.Array):
            leaf = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            raise TypeError(
                f"{where}: expected jax.ShapeDtypeStruct or jax.Array, got {type(leaf).__name__}"
            )
        if leaf.sharding is None:
            raise ValueError(
                f"{where}: has no sharding; pass jax.ShapeDtypeStruct(shape, dtype, sharding=...)"
            )
        if _is_prng_key(leaf):
            key_dtypes[jax.tree_util.keystr(path)] = str(leaf.dtype)
            data = jax.eval_shape(jax.random.key_data, leaf)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding)
        return leaf

    return jax.tree_util.tree_map_with_path(convert, abstract_state), key_dtypes


_FINGERPRINT_MULTIPLIERS = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1,
                            0xD3A2646C, 0xFD7046C5, 0xB55A4F09)


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    elif x.dtype.itemsize in (1, 2):
        narrow = jnp.uint8 if x.dtype.itemsize == 1 else jnp.uint16
        bits = jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    elif x.dtype.itemsize in (4, 8):
        bits = jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8-byte: trailing axis of 2
    else:
        raise TypeError(f"cannot fingerprint dtype {x.dtype}")
    index_hash = jnp.zeros(bits.shape, jnp.uint32)
    for axis in range(bits.ndim):
        multiplier = jnp.uint32(_FINGERPRINT_MULTIPLIERS[axis % len(_FINGERPRINT_MULTIPLIERS)])
        position = jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis)
        index_hash = index_hash + position * multiplier
    weights = index_hash * jnp.uint32(2) + jnp.uint32(1)
    return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _fingerprints(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_leaf_fingerprint(x) for x in leaves]


def leaf_records(storable: Any, with_fingerprints: bool) -> list[dict[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(storable)
    records = [
        {"path": jax.tree_util.keystr(path), "shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        for path, leaf in flat
    ]
    if with_fingerprints and flat:
        values = _fingerprints([leaf for _, leaf in flat])
        for record, value in zip(records, values):
            record["fingerprint"] = int(np.asarray(value.addressable_data(0)))  # replicated
    return records


def all_processes(ok: bool) -> bool:
    """True iff `ok` on every process (so that all processes take the same branch)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


class StateMismatchError(ValueError):
    """The requested state's tree, shapes or dtypes differ from the checkpoint's; `problems`
    lists each difference ("<path>: checkpoint <shape> <dtype> vs requested ...")."""

    def __init__(self, step: int, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"abstract_state: does not match the state saved at step {step}: "
            + "; ".join(problems[:8])
            + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else ""))


def check_tree_matches(recorded: list[dict], requested: list[dict], step: int) -> None:
    def table(records):
        return {r["path"]: (tuple(r["shape"]), r["dtype"]) for r in records}

    saved, wanted = table(recorded), table(requested)
    problems = [f"missing in checkpoint: {p}" for p in wanted if p not in saved]
    problems += [f"not in abstract_state: {p}" for p in saved if p not in wanted]
    problems += [
        f"{p}: checkpoint {saved[p][0]} {saved[p][1]} vs requested {wanted[p][0]} {wanted[p][1]}"
        for p in wanted if p in saved and saved[p] != wanted[p]
    ]
    if problems:
        raise StateMismatchError(step, problems)


def with_ignored_entries(abstract_state: Any, recorded_leaves: list[dict],
                          ignore_saved: Collection[str]) -> tuple[Any, list[str]]:
    """abstract_state plus a replicated ShapeDtypeStruct for each `ignore_saved` key that the
    step holds as a top-level array and abstract_state lacks; and those keys."""
    if not ignore_saved:
        return abstract_state, []
    if not isinstance(abstract_state, Mapping):
        raise TypeError(f"abstract_state: ignore_saved needs a dict state, got "
                        f"{type(abstract_state).__name__}")
    recorded = {r["path"]: r for r in recorded_leaves}
    template = jax.tree.leaves(abstract_state)[0].sharding
    replicated = (NamedSharding(template.mesh, PartitionSpec())
                  if isinstance(template, NamedSharding) else template)
    extended, ignored = dict(abstract_state), []
    for name in ignore_saved:
        saved = recorded.get(jax.tree_util.keystr((jax.tree_util.DictKey(name),)))
        if name in abstract_state or saved is None:
            continue
        extended[name] = jax.ShapeDtypeStruct(tuple(saved["shape"]), jnp.dtype(saved["dtype"]),
                                              sharding=replicated)
        ignored.append(name)
    return extended, ignored
