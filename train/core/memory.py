"""Device memory of a train step or an eval forward, estimated before compiling, and XLA
out-of-memory errors.

    state        S = bytes of params + optimizer state (the session's abstract state),
                 split over the model-parallel devices: S / (fsdp * tensor)
    gradients    G = bytes of params / (fsdp * tensor)
    activations  A = tokens per device per micro-batch * a, with
                 tokens = (data.batch_size / train.grad_accum) * data.seq_len
                          / (data * fsdp * context)      (context: mesh.context, time split)
                 a = c * (sum over layers of w_layer) + 2 * V * 4         bytes per token
                 w_layer = 4 d + (|q| + |k| + |v| + |out|) + 2 mlp   (the values one block
                 keeps for its backward: norms, residuals, the mixer's q/k/v/output (its
                 kind's `MixerSpec.width`, train/core/mixers.py: 4 H Dh for attention; for
                 GDN 4 H K + 5 HV V and its chunk states where its op keeps them, else
                 2 H K + 4 HV V on one device along T), MLP
                 hidden), or d with model.remat (only the block input; one block's w_layer
                 is live while it recomputes);
                 with context > 1 an attention layer adds (context - 1) 2 H Dh: its ring's
                 backward keeps the key and value blocks received from the other context - 1
                 devices (fpa_jax/context_parallel.py), O(T) per device, not O(T / context)
                 c = bytes of the compute dtype; 2 V float32 per token: the logits and
                 their gradient
    estimate     S + G + A per device

An eval forward (`estimate_eval_memory`, train/core/evaluate.py) keeps nothing for a backward, so
only what is surely live at one moment is counted:

    params       P = bytes of params / (fsdp * tensor)
    activations  tokens = batch_size * seq_len / (data * fsdp * context) per device, times
                 e = c d + c V / tensor + 8   bytes per token: the residual stream entering
                 the output head, the head's logits (compute dtype, before the float32 cast;
                 vocab split over tensor) and the int32 tokens and segment ids
    estimate     P + A per device; no layer's mixer or MLP values, no optimizer state (the
                 restored checkpoint's optimizer state is left out too), no float32 logits
                 or loss temporaries: a strict lower bound, far below a train step's

The limit (`device_memory_bytes`): the allocator's bytes_limit on GPU/TPU. The CPU platform
reports none, and its devices allocate from the host's memory, so there the limit is the
host's (`host_memory_bytes`: the smaller of physical RAM, os.sysconf, and the cgroup memory
limit, v2 memory.max or v1 memory.limit_in_bytes, of this process's cgroup and its
ancestors) split evenly over the process's CPU devices.

The estimates leave out XLA's temporaries and fragmentation, so they err low: a step they
refuse cannot fit; one they accept may still run out, and then `out_of_memory_error` turns
XLA's RESOURCE_EXHAUSTED into one DeviceMemoryError line naming what to lower.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np

from train.core.config import Config
from train.core.mixers import MIXERS, layer_kinds
from train.core.model import resolve_vocab_size

GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


class DeviceMemoryError(RuntimeError):
    """A train step or eval forward does not fit device memory (estimated, or XLA ran out)."""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    state_bytes: int                 # params + optimizer state, per device
    gradient_bytes: int              # per device
    activation_bytes_per_token: int
    tokens_per_device: int           # one micro-batch

    @property
    def activation_bytes(self) -> int:
        return self.activation_bytes_per_token * self.tokens_per_device

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.gradient_bytes + self.activation_bytes

    def describe(self) -> str:
        return (f"{format_bytes(self.total_bytes)} per device (params + optimizer "
                f"{format_bytes(self.state_bytes)}, gradients {format_bytes(self.gradient_bytes)}"
                f", activations {format_bytes(self.activation_bytes)} = "
                f"{self.tokens_per_device} tokens x "
                f"{format_bytes(self.activation_bytes_per_token)})")


@dataclasses.dataclass(frozen=True)
class EvalMemoryEstimate:
    param_bytes: int                 # per device
    activation_bytes_per_token: int  # e of the module doc
    tokens_per_device: int           # one eval batch

    @property
    def activation_bytes(self) -> int:
        return self.activation_bytes_per_token * self.tokens_per_device

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.activation_bytes

    def describe(self) -> str:
        return (f"{format_bytes(self.total_bytes)} per device (params "
                f"{format_bytes(self.param_bytes)}, forward activations "
                f"{format_bytes(self.activation_bytes)} = {self.tokens_per_device} tokens x "
                f"{format_bytes(self.activation_bytes_per_token)}; a lower bound)")


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def _nbytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _layer_width(config: Config, kind: str, context: int) -> int:
    return 4 * config.model.d_model + MIXERS[kind].width(config, context) + 2 * config.mlp_dim()


def activation_bytes_per_token(config: Config, vocab_size: int, context: int = 1) -> int:
    """a of the module doc; vocab_size: the tokenizer's (padded as the model pads it);
    context: the size of the mesh's context axis."""
    vocab_size = resolve_vocab_size(config, vocab_size)
    compute = _DTYPE_BYTES[config.model.dtype]
    widths = [_layer_width(config, kind, context) for kind in layer_kinds(config)]
    if config.model.remat:
        kept = config.model.d_model * len(widths) + max(widths)
    else:
        kept = sum(widths)
    return compute * kept + 2 * vocab_size * 4


def estimate_train_memory(config: Config, abstract_state, vocab_size: int,
                          mesh_shape) -> MemoryEstimate:
    """mesh_shape: (data, fsdp, tensor[, context]) sizes, or a mesh's `.shape`. abstract_state: {"params",
    "opt_state", ...} of ShapeDtypeStructs (Session.abstract_state)."""
    data, fsdp, tensor, context = _mesh_sizes(mesh_shape)
    model_parallel = fsdp * tensor
    params = _nbytes(abstract_state["params"])
    state = params + _nbytes(abstract_state["opt_state"])
    micro_batch = config.data.batch_size // config.train.grad_accum
    tokens = -(-micro_batch * config.data.seq_len // (data * fsdp * context))
    return MemoryEstimate(state_bytes=-(-state // model_parallel),
                          gradient_bytes=-(-params // model_parallel),
                          activation_bytes_per_token=activation_bytes_per_token(
                              config, vocab_size, context),
                          tokens_per_device=tokens)


def _mesh_sizes(mesh_shape) -> tuple[int, int, int, int]:
    """(data, fsdp, tensor, context) from a tuple of 3 or 4 sizes or a mesh's `.shape`."""
    if isinstance(mesh_shape, Mapping):
        mesh_shape = (mesh_shape["data"], mesh_shape["fsdp"], mesh_shape["tensor"],
                      mesh_shape.get("context", 1))
    if len(mesh_shape) not in (3, 4) or any(not isinstance(n, (int, np.integer)) or n < 1
                                              for n in mesh_shape):
        raise ValueError(f"mesh_shape: expected (data, fsdp, tensor[, context]) positive ints, "
                         f"got {mesh_shape!r}")
    return tuple(int(n) for n in (*mesh_shape, 1)[:4])


def eval_bytes_per_token(config: Config, vocab_size: int, tensor: int = 1) -> int:
    """e of the module doc; vocab_size: the tokenizer's (padded as the model pads it);
    tensor: the size of the mesh's tensor axis (the logits' vocab is split over it)."""
    compute = _DTYPE_BYTES[config.model.dtype]
    logits = -(-resolve_vocab_size(config, vocab_size) // tensor)
    return compute * (config.model.d_model + logits) + 2 * 4


def estimate_eval_memory(config: Config, abstract_params, vocab_size: int,
                         mesh_shape) -> EvalMemoryEstimate:
    """The lower bound of one eval forward per device (module doc) at config.data.batch_size
    x config.data.seq_len; mesh_shape: (data, fsdp, tensor[, context]) sizes or a mesh's
    `.shape`;
    abstract_params: ShapeDtypeStructs of the params (Session.abstract_state["params"])."""
    data, fsdp, tensor, context = _mesh_sizes(mesh_shape)
    tokens = -(-config.data.batch_size * config.data.seq_len // (data * fsdp * context))
    return EvalMemoryEstimate(param_bytes=-(-_nbytes(abstract_params) // (fsdp * tensor)),
                              activation_bytes_per_token=eval_bytes_per_token(
                                  config, vocab_size, tensor),
                              tokens_per_device=tokens)


CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
_CGROUP_UNLIMITED = 2**62     # v1 writes "no limit" as 2**63 - 1 rounded down to a page


def physical_memory_bytes() -> int | None:
    """The host's physical RAM (os.sysconf), None where it is not reported."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_limit_files(root: Path, self_cgroup: Path) -> list[Path]:
    """memory.max (v2) and memory/memory.limit_in_bytes (v1) at the mount's root and at
    this process's cgroup (/proc/self/cgroup) and each of its ancestors."""
    files = [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        files += [base.joinpath(*parts[:depth], name) for depth in range(1, len(parts) + 1)]
    return files


def cgroup_memory_limit_bytes(root: Path = CGROUP_ROOT,
                              self_cgroup: Path = SELF_CGROUP) -> int | None:
    """The lowest cgroup memory limit over `_cgroup_limit_files`; None where none is set
    (absent, v2 "max", or v1's "unlimited" near 2**63)."""
    limits = []
    for path in _cgroup_limit_files(Path(root), Path(self_cgroup)):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _CGROUP_UNLIMITED:
            limits.append(int(text))
    return min(limits) if limits else None


def host_memory_bytes() -> int | None:
    """The memory this process may use on the host: the smaller of physical RAM and the
    cgroup limit (None where neither is known)."""
    known = [n for n in (physical_memory_bytes(), cgroup_memory_limit_bytes()) if n]
    return min(known) if known else None


def device_memory_bytes(device: jax.Device | None = None) -> int | None:
    """The memory limit of `device`: the allocator's on GPU/TPU (None where it reports
    none); on CPU the host's memory split over this process's CPU devices (module doc)."""
    device = device or jax.local_devices()[0]
    if device.platform == "cpu":
        host = host_memory_bytes()
        return host // max(1, len(jax.local_devices(backend="cpu"))) if host else None
    try:
        stats = device.memory_stats()
    except Exception:   # some backends do not implement it
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def memory_limit_name(device: jax.Device | None = None) -> str:
    """What `device_memory_bytes` measures, for messages."""
    device = device or jax.local_devices()[0]
    if device.platform != "cpu":
        return "device memory"
    count = len(jax.local_devices(backend="cpu"))
    return "host memory" + (f" (1/{count} of it per CPU device)" if count > 1 else "")


def describe_limit(limit_bytes: int | None) -> str:
    """The tail of the "memory estimate: ..." startup line: " of <limit> of <what>"."""
    if not limit_bytes:
        return " (device memory not reported)"
    return f" of {format_bytes(limit_bytes)} of {memory_limit_name()}"


def _what_to_lower(config: Config) -> str:
    d, t = config.data, config.train
    hints = [f"data.batch_size ({d.batch_size})", f"data.seq_len ({d.seq_len})"]
    more = [f"raise train.grad_accum ({t.grad_accum}; the micro-batch is "
            f"batch_size / grad_accum)"]
    if not config.model.remat:
        more.append("set model.remat=true")
    return "lower " + " or ".join(hints) + ", " + " or ".join(more)


def check_fits(config: Config, estimate: MemoryEstimate | EvalMemoryEstimate,
               limit_bytes: int | None, *, subject: str = "the train step",
               advice: str | None = None) -> None:
    """DeviceMemoryError when the estimate exceeds `limit_bytes` (None: nothing to check).
    subject: what the estimate is of; advice: what to lower (default: the train step's
    config keys)."""
    if limit_bytes is None or estimate.total_bytes <= limit_bytes:
        return
    raise DeviceMemoryError(
        f"{subject} needs at least {estimate.describe()}, more than the "
        f"{format_bytes(limit_bytes)} of {memory_limit_name()}: "
        f"{advice or _what_to_lower(config)}")


def eval_what_to_lower(config: Config) -> str:
    """The `eval` options to lower, with the values in use."""
    return (f"lower --seq-len ({config.data.seq_len}) or --batch-size "
            f"({config.data.batch_size})")


@contextlib.contextmanager
def out_of_memory_errors(config: Config, what_to_lower: str | None = None):
    """Inside the block, XLA's out-of-memory is raised as a DeviceMemoryError."""
    try:
        yield
    except Exception as error:
        memory_error = out_of_memory_error(error, config, what_to_lower)
        if memory_error is None:
            raise
        raise memory_error from error


def out_of_memory_error(error: BaseException, config: Config,
                        what_to_lower: str | None = None) -> DeviceMemoryError | None:
    """XLA's out-of-memory (RESOURCE_EXHAUSTED) as a DeviceMemoryError; None for others.
    what_to_lower: the advice after the colon (default: the train step's config keys)."""
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return None
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
        return None
    allocation = re.search(r"Out of memory while trying to allocate ([0-9.]+ ?[KMGT]?i?B)", text)
    what = (f"could not allocate {allocation.group(1)}" if allocation else
            " ".join(text.strip().splitlines()[0].split())[:200])
    return DeviceMemoryError(f"out of device memory ({what}): "
                             f"{what_to_lower or _what_to_lower(config)}")
