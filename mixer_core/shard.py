"""Run an attention or delta-rule op once per shard: batch over the batch mesh axes, heads over
the head axis, and time over the "context" axis for the ops' context-parallel forms, inside
`jax.shard_map`.

    mesh      the mesh in scope while tracing (`jax.set_mesh`; the trainer's mesh_context)
    B         batch dimension   -> BATCH_AXES = ("data", "fsdp")   (those the mesh has)
    H         heads dimension   -> HEAD_AXIS = "tensor"
    layouts   one string per array argument, one letter per dimension, e.g. q "BTHD",
              phi "BTH", beta "H", segment_ids "BT"; outputs likewise ("BTHD", state "BHKV");
              the ops' layouts are the *_LAYOUTS constants below
    per shard op(q[b, :, h], ...) sees B / |batch axes| rows and H / |tensor| heads

Attention and the delta rule are independent per (batch row, head), so the per-shard calls
compute exactly the unsplit op, with no communication in the forward. A Pallas call has no
sharding rule: without the shard_map XLA would gather its operands onto every device. In the
backward, an argument without B (FPA's beta [H]) gets its per-shard cotangents summed over the
batch axes by shard_map's transpose.

Every mesh axis is manual inside. A batch / head axis is used only when it (with the other
batch axis) divides that dimension in every array; an unused axis, like an axis the mesh
lacks or one of size 1, leaves the dimension whole (replicated). Outside a mesh, on a mesh of
one device, inside another shard_map (an axis already manual) or when no axis divides, the op
is simply called. Heads of different counts (GDN's H q/k heads and HV value heads, HV a
multiple of H) split consistently: value head j of a shard uses q/k head j // (HV / H) of the
same shard, as in the unsplit op.

check_vma=False: the ops' XLA paths (scans with fresh zero carries) and the Pallas kernels
(outputs without mesh-axis types) are not written for shard_map's varying-axis types; every
output is split over every used axis, so nothing is claimed replicated that is not.

Context parallelism: with a mesh axis CONTEXT_AXIS = "context" of size n > 1 in scope
(`context_size()`), a mixer runs its op's context-parallel form instead, which splits T over
that axis as well (`shard_over_context`) and exchanges along it what it needs (the ring forms
in fpa_jax/context_shard.py and gdn_jax/ops/context_shard.py). `ring_or_shard` is the one call
the layers make: it picks the form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

BATCH_AXES = ("data", "fsdp")
HEAD_AXIS = "tensor"
CONTEXT_AXIS = "context"
KEYWORD_LAYOUTS = {"segment_ids": "BT", "alibi_slopes": "H", "initial_state": "BHKV"}
FPA_LAYOUTS = ("BTHD", "BTHD", "BTHD", "BTH", "BTH", "H")     # q, k, v, phi, psi, beta
FPA_WALK_LAYOUTS = ("BTHD", "BTHD", "BTHD", "BTH", "BTH", "BTH", "H")   # q, k, v, delta, g, h, beta
FOX_LAYOUTS = ("BTHD", "BTHD", "BTHD", "BTH")                 # q, k, v, log_forget
SOFTMAX_LAYOUTS = ("BTHD", "BTHD", "BTHD")                    # q, k, v
GDN_LAYOUTS = ("BTHD", "BTHD", "BTHD", "BTH", "BTH")          # q, k, v, g, beta
GDN_OUT_LAYOUTS = ("BTHD", "BHKV")                            # out, final state (or None)


def _check_layouts(arrays: Sequence[Any], layouts: Sequence[str]) -> None:
    if len(arrays) != len(layouts):
        raise ValueError(f"layouts: expected one per argument ({len(arrays)}), got {len(layouts)}")
    for index, (array, layout) in enumerate(zip(arrays, layouts)):
        shape = getattr(array, "shape", None)
        if shape is None or len(layout) != len(shape):
            raise ValueError(f"layouts[{index}]: expected one letter per dimension of an array "
                             f"of shape {shape}, got {layout!r}")


def _dimension_sizes(arrays: Sequence[Any], layouts: Sequence[str], letter: str) -> list[int]:
    return [array.shape[layout.index(letter)] for array, layout in zip(arrays, layouts)
            if letter in layout]


def _dividing_axes(mesh: Any, axes: Sequence[str], sizes: list[int]) -> tuple[str, ...]:
    """`axes` (those of the mesh larger than 1) if their product divides every size, else ()."""
    present = tuple(a for a in axes if a in mesh.axis_names and mesh.shape[a] > 1)
    product = math.prod(mesh.shape[a] for a in present)
    return present if present and sizes and all(s % product == 0 for s in sizes) else ()


def plan(layouts: Sequence[str], arrays: Sequence[Any], mesh: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(batch axes, head axes) that the shard_map will use for these arrays on `mesh`;
    ((), ()) when the op should simply be called."""
    if mesh is None or mesh.empty or mesh.size == 1 or mesh.manual_axes:
        return (), ()
    batch = _dividing_axes(mesh, BATCH_AXES, _dimension_sizes(arrays, layouts, "B"))
    heads = _dividing_axes(mesh, (HEAD_AXIS,), _dimension_sizes(arrays, layouts, "H"))
    return batch, heads


def _spec(layout: str, batch: tuple[str, ...], heads: tuple[str, ...],
          time: str | None = None) -> PartitionSpec:
    names = {"B": batch or None, "H": (heads[0] if heads else None), "T": time}
    return PartitionSpec(*(names.get(letter) for letter in layout))


def shard_batch_and_heads(op: Callable[..., Any], *arrays: Any, layouts: Sequence[str],
                          out_layouts: str | tuple[str, ...] = "BTHD",
                          time_axis: str | None = None, **kwargs: Any) -> Any:
    """op(*arrays, **kwargs) computed per shard of the mesh in scope (module doc).

    layouts: one string per positional array. Keyword arguments named in KEYWORD_LAYOUTS are
    arrays split the same way (None passes through); every other keyword goes to op as is.
    out_layouts: one string for a single output, or a tuple matching op's tuple of outputs
    (an output that is None needs a layout too; it is ignored). time_axis: a mesh axis that
    also splits T (context parallelism, `shard_over_context`; op then exchanges
    along it what it needs); the op always runs under the shard_map then."""
    names = [name for name in KEYWORD_LAYOUTS if kwargs.get(name) is not None]
    split = list(arrays) + [kwargs.pop(name) for name in names]
    split_layouts = list(layouts) + [KEYWORD_LAYOUTS[name] for name in names]
    _check_layouts(split, split_layouts)
    batch, heads = plan(split_layouts, split, jax.sharding.get_abstract_mesh())

    def call(*shards):
        return op(*shards[:len(arrays)], **dict(zip(names, shards[len(arrays):])), **kwargs)

    if not (batch or heads or time_axis):
        return call(*split)
    in_specs = tuple(_spec(layout, batch, heads, time_axis) for layout in split_layouts)
    out_specs = (_spec(out_layouts, batch, heads, time_axis) if isinstance(out_layouts, str)
                 else tuple(_spec(layout, batch, heads, time_axis) for layout in out_layouts))
    # the inner jit keeps the op's trace-time constants inside it: as operands of the shard_map
    # (the zero-size scatter index of an `x.at[:, a:b].add` in a backward) they crashed
    # Shardy's canonicaliser in jax 0.11
    sharded = jax.shard_map(jax.jit(call), in_specs=in_specs, out_specs=out_specs,
                            check_vma=False)
    return sharded(*split)


def context_size() -> int:
    """n, the size of the CONTEXT_AXIS axis of the mesh in scope; 1 without a mesh, without that
    axis, or inside a shard_map."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.manual_axes or CONTEXT_AXIS not in mesh.axis_names:
        return 1
    return mesh.shape[CONTEXT_AXIS]


def bound_axis_size(axis_name: str) -> int:
    """Size of the mesh axis `axis_name` bound by the enclosing `jax.shard_map`; a ValueError
    naming it when it is not bound here (outside a shard_map, or a mesh without that axis)."""
    try:
        return jax.lax.axis_size(axis_name)
    except NameError as error:
        raise ValueError(f"axis_name: {axis_name!r} is not a mesh axis bound here; call this "
                         f"inside jax.shard_map over a mesh with that axis") from error


def shard_over_context(op: Callable[..., Any], *arrays: Any, layouts: Sequence[str],
                       out_layouts: str | tuple[str, ...] = "BTHD", **kwargs: Any) -> Any:
    """op(*arrays, **kwargs) per shard of batch, heads and time (T over CONTEXT_AXIS), op being
    a context-parallel form that exchanges along CONTEXT_AXIS what it needs; arguments as in
    `shard_batch_and_heads`. ValueError without a context axis larger than 1 in scope or when
    T (of the first array) does not split evenly over it."""
    size = context_size()
    if size < 2:
        raise ValueError(f"mesh: the context-parallel ops need a mesh in scope with a "
                         f"{CONTEXT_AXIS!r} axis larger than 1, got context size {size}")
    length = arrays[0].shape[1]
    if length % size:
        raise ValueError(f"q: the time axis ({length} tokens) must split evenly over the {size} "
                         f"devices of mesh axis {CONTEXT_AXIS!r}")
    return shard_batch_and_heads(op, *arrays, layouts=layouts, out_layouts=out_layouts,
                                 time_axis=CONTEXT_AXIS, **kwargs)


def ring_or_shard(op: Callable[..., Any], ring: Callable[..., Any], *arrays: Any,
                  layouts: Sequence[str], out_layouts: str | tuple[str, ...] = "BTHD",
                  **kwargs: Any) -> Any:
    """A mixer's op on the mesh in scope, the one call every layer makes.

    With time split over the devices (context_size() > 1): ring(*arrays, **kwargs), the op's
    context-parallel form, which takes the op's arguments and returns its outputs and splits
    T itself (`shard_over_context`). Otherwise op(*arrays, **kwargs) per shard of batch and
    heads (`shard_batch_and_heads` with `layouts` and `out_layouts`)."""
    if context_size() > 1:
        return ring(*arrays, **kwargs)
    return shard_batch_and_heads(op, *arrays, layouts=layouts, out_layouts=out_layouts, **kwargs)
