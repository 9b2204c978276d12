"""Device mesh, the one logical-axis rules table, and the shardings of params, state and batches.

    mesh axes            ("data", "fsdp", "tensor"), sizes from config.mesh, all AxisType.Auto;
                         with mesh.context = n > 1 a fourth axis "context" (size n)
    logical -> mesh      batch -> ("data", "fsdp"); embed -> fsdp; vocab, mlp, heads,
                         heads_x_dim, v_heads -> tensor; expert (MoE) -> data;
                         everything else replicated
    param [d_0..d_n]     NamedSharding(mesh, P(rule(axis_0), ..., rule(axis_n))); a mesh axis that
                         does not divide its dimension is dropped (that dimension is replicated)
    batch [B, T+1]       P(("data", "fsdp"), None): each process feeds its rows, B / process_count
                         (so one batch shard's devices share a process: `check_rows_per_process`)
    context axis         activation rules map "length" -> "context" (`activation_rules`): the
                         activations [B, T, ...] are split along time, every per-token op
                         (embedding, norms, MLP, loss) runs on the device's stretch, and the
                         mixers run their context-parallel ops (mixer_core/shard.py ring_or_shard);
                         the int32 batch [B, T+1] (T+1 tokens do not split) stays whole along it

The rules are applied in order and a mesh axis is used once per array, so activations
("batch", "length", "embed") shard the batch over data x fsdp and leave embed whole.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from mixer_core import shard

MESH_AXES = (*shard.BATCH_AXES, shard.HEAD_AXIS, shard.CONTEXT_AXIS)   # context: only when > 1
BATCH_MESH_AXES = shard.BATCH_AXES      # the mixers' ops split rows and heads the same way
LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_MESH_AXES),
    ("embed", "fsdp"),
    ("vocab", shard.HEAD_AXIS),         # the tensor axis, over which the heads split
    ("mlp", shard.HEAD_AXIS),
    ("heads", shard.HEAD_AXIS),
    ("heads_x_dim", shard.HEAD_AXIS),
    ("v_heads", shard.HEAD_AXIS),
    ("expert", "data"),
    ("length", None),
    ("head_dim", None),
    ("v_head_dim", None),
    ("conv", None),
)

def maybe_initialize_distributed() -> bool:
    """jax.distributed.initialize() when the environment describes a multi-process job.

    Recognised: JAX_COORDINATOR_ADDRESS (with JAX_NUM_PROCESSES, JAX_PROCESS_ID), or a SLURM
    job step with more than one task (auto-detected by JAX), or Open MPI (OMPI_COMM_WORLD_SIZE).
    Returns True when it initialised.
    """
    coordinator = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if coordinator:
        num_processes = os.environ.get("JAX_NUM_PROCESSES")
        process_id = os.environ.get("JAX_PROCESS_ID")
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=int(num_processes) if num_processes else None,
            process_id=int(process_id) if process_id else None)
        return True
    tasks = max(int(os.environ.get("SLURM_NTASKS", "1")), int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    if tasks > 1:
        jax.distributed.initialize()
        return True
    return False


def make_mesh(sizes: tuple[int, ...], devices: Any = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh, or ("data", "fsdp", "tensor", "context") for four
    sizes, with Auto axis types (sizes from validate_for_devices)."""
    devices = jax.devices() if devices is None else devices
    if len(sizes) not in (len(MESH_AXES) - 1, len(MESH_AXES)):
        raise ValueError(f"make_mesh: sizes must be (data, fsdp, tensor[, context]), got {sizes}")
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"make_mesh: sizes {sizes} need {int(np.prod(sizes))} devices, "
                         f"got {len(devices)}")
    axes = MESH_AXES[:len(sizes)]
    return jax.make_mesh(tuple(sizes), axes, axis_types=(AxisType.Auto,) * len(axes),
                         devices=devices)


def activation_rules() -> tuple[tuple[str, Any], ...]:
    """LOGICAL_AXIS_RULES for activations under the mesh in scope: "length" -> "context" when
    that mesh has a context axis, else the table as it is."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or shard.CONTEXT_AXIS not in mesh.axis_names:
        return LOGICAL_AXIS_RULES
    return tuple((name, shard.CONTEXT_AXIS if name == "length" else axes)
                 for name, axes in LOGICAL_AXIS_RULES)


def mesh_context(mesh: Mesh):
    """The mesh in scope while tracing: the model's activation constraints resolve against it."""
    return jax.set_mesh(mesh)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    check_rows_per_process(mesh)
    return NamedSharding(mesh, PartitionSpec(BATCH_MESH_AXES))


def check_rows_per_process(mesh: Mesh) -> None:
    """ValueError unless the devices holding each batch shard (one data x fsdp coordinate) all
    belong to one process. Each process feeds its own rows (`global_batch`): a tensor or context
    axis spanning processes would have two processes put different rows into one shard, which
    the ops would then treat as one row (silently: nothing compares the copies)."""
    devices = np.asarray(mesh.devices)
    names = tuple(mesh.axis_names)
    batch = [names.index(axis) for axis in BATCH_MESH_AXES if axis in names]
    rest = [axis for axis in range(devices.ndim) if axis not in batch]
    shards = int(np.prod([devices.shape[axis] for axis in batch]))
    for index, group in enumerate(np.transpose(devices, batch + rest).reshape(shards, -1)):
        processes = sorted({device.process_index for device in group})
        if len(processes) > 1:
            raise ValueError(
                f"mesh: batch shard {index} (one data x fsdp coordinate) is held by devices of "
                f"processes {processes}, but each process feeds its own rows; keep the tensor "
                f"and context axes within one process (mesh.tensor * mesh.context at most the "
                f"devices per process, data / fsdp outermost)")


def _fit_to_shape(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Drop mesh axes that do not divide their dimension (replicate that dimension instead)."""
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[name] for name in names])) if names else 1
        fitted.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*fitted)


def logical_shardings(boxed_tree: Any, mesh: Mesh) -> Any:
    """NamedShardings for a tree of (possibly nn.LogicallyPartitioned) arrays or ShapeDtypeStructs.

    Leaves without logical names are replicated.
    """
    logical_specs = nn.get_partition_spec(boxed_tree)
    mesh_specs = nn.logical_to_mesh(logical_specs, LOGICAL_AXIS_RULES)
    values = nn.meta.unbox(boxed_tree)
    return jax.tree.map(
        lambda spec, value: NamedSharding(mesh, _fit_to_shape(spec, value.shape, mesh)),
        mesh_specs, values, is_leaf=lambda x: isinstance(x, PartitionSpec))


def state_shardings(abstract_opt_state: Any, abstract_params: Any, param_shardings: Any,
                    mesh: Mesh) -> Any:
    """Optimizer-state shardings: a leaf whose trailing path names name a param of the same shape
    (Adam moments, momenta) follows that param; everything else (counts, scalars) replicates."""
    by_path = {}
    for path, value in jax.tree_util.tree_leaves_with_path(abstract_params):
        by_path[_path_names(path)] = value.shape
    shardings = dict(zip((_path_names(p) for p, _ in
                          jax.tree_util.tree_leaves_with_path(param_shardings)),
                         jax.tree.leaves(param_shardings)))

    def sharding_for(path, leaf):
        keys = _path_names(path)
        for start in range(len(keys)):
            suffix = keys[start:]
            if suffix in by_path and by_path[suffix] == leaf.shape:
                return shardings[suffix]
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(sharding_for, abstract_opt_state)


def _path_names(path: tuple) -> tuple[str, ...]:
    return tuple(jax.tree_util.keystr(path, simple=True, separator="/").split("/"))


def global_batch(local_batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Assemble each process's rows into one global array sharded over (data, fsdp)."""
    return {name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
            for name, value in local_batch.items()}
