"""Device memory of a train step, estimated before compiling, and XLA out-of-memory errors.

    state        S = bytes of params + optimizer state (the session's abstract state),
                 split over the model-parallel devices: S / (fsdp * tensor)
    gradients    G = bytes of params / (fsdp * tensor)
    activations  A = tokens per device per micro-batch * a, with
                 tokens = (data.batch_size / train.grad_accum) * data.seq_len
                          / (data * fsdp * context)      (context: mesh.context, time split)
                 a = c * (sum over layers of w_layer) + 2 * V * 4         bytes per token
                 w_layer = 4 d + (|q| + |k| + |v| + |out|) + 2 mlp   (the values one block
                 keeps for its backward: norms, residuals, the mixer's q/k/v/output (4 H Dh
                 for attention, 2 H K + 2 HV V for GDN), MLP hidden), or d with model.remat
                 (only the block input; one block's w_layer is live while it recomputes);
                 with context > 1 an attention layer adds (context - 1) 2 H Dh: its ring's
                 backward keeps the key and value blocks received from the other context - 1
                 devices (fpa_jax/context_parallel.py), O(T) per device, not O(T / context)
                 c = bytes of the compute dtype; 2 V float32 per token: the logits and
                 their gradient
    estimate     S + G + A per device

The estimate leaves out XLA's temporaries and fragmentation, so it errs low: a step it
refuses cannot fit; one it accepts may still run out, and then `out_of_memory_error` turns
XLA's RESOURCE_EXHAUSTED into one DeviceMemoryError line naming what to lower.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re

import jax
import numpy as np

from train.config import Config
from train.model import resolve_vocab_size

GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


class DeviceMemoryError(RuntimeError):
    """The train step does not fit device memory (estimated, or XLA ran out)."""


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


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def _nbytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _layer_width(config: Config, kind: str, context: int) -> int:
    if kind == "attention":   # q, k, v, out; with context > 1 the other devices' k, v blocks
        mixer = (4 + 2 * (context - 1)) * config.attention.num_heads * config.attention.head_dim
    else:
        g = config.gdn
        mixer = 2 * g.num_heads * g.head_dim + 2 * (g.num_v_heads or g.num_heads) * (
            g.v_head_dim or g.head_dim)
    return 4 * config.model.d_model + mixer + 2 * config.mlp_dim()


def activation_bytes_per_token(config: Config, vocab_size: int, context: int = 1) -> int:
    """a of the module doc; vocab_size: the tokenizer's (padded as the model pads it);
    context: the size of the mesh's context axis."""
    vocab_size = resolve_vocab_size(config, vocab_size)
    compute = _DTYPE_BYTES[config.model.dtype]
    widths = [_layer_width(config, kind, context) for kind in config.layer_kinds()]
    if config.model.remat:
        kept = config.model.d_model * len(widths) + max(widths)
    else:
        kept = sum(widths)
    return compute * kept + 2 * vocab_size * 4


def estimate_train_memory(config: Config, abstract_state, vocab_size: int,
                          mesh_shape: tuple[int, ...]) -> MemoryEstimate:
    """mesh_shape: (data, fsdp, tensor[, context]) sizes. abstract_state: {"params",
    "opt_state", ...} of ShapeDtypeStructs (Session.abstract_state)."""
    if len(mesh_shape) not in (3, 4) or any(not isinstance(n, (int, np.integer)) or n < 1
                                              for n in mesh_shape):
        raise ValueError(f"mesh_shape: expected (data, fsdp, tensor[, context]) positive ints, "
                         f"got {mesh_shape!r}")
    data, fsdp, tensor, context = (*mesh_shape, 1)[:4]
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


def device_memory_bytes(device: jax.Device | None = None) -> int | None:
    """The allocator's limit of `device` (GPU/TPU), None where it reports none (CPU)."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:   # some backends do not implement it
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def _what_to_lower(config: Config) -> str:
    d, t = config.data, config.train
    hints = [f"data.batch_size ({d.batch_size})", f"data.seq_len ({d.seq_len})"]
    more = [f"raise train.grad_accum ({t.grad_accum}; the micro-batch is "
            f"batch_size / grad_accum)"]
    if not config.model.remat:
        more.append("set model.remat=true")
    return "lower " + " or ".join(hints) + ", " + " or ".join(more)


def check_fits(config: Config, estimate: MemoryEstimate, limit_bytes: int | None) -> None:
    """DeviceMemoryError when the estimate exceeds `limit_bytes` (None: nothing to check)."""
    if limit_bytes is None or estimate.total_bytes <= limit_bytes:
        return
    raise DeviceMemoryError(
        f"the train step needs at least {estimate.describe()}, more than the "
        f"{format_bytes(limit_bytes)} of device memory: {_what_to_lower(config)}")


def check_session_fits(config: Config, abstract_state, vocab_size: int,
                       mesh_shape: dict[str, int]) -> MemoryEstimate:
    """The estimate of a session's train step (mesh_shape: its mesh.shape), checked against
    this device's memory (`check_fits`); returns the estimate."""
    estimate = estimate_train_memory(config, abstract_state, vocab_size,
                                     (mesh_shape["data"], mesh_shape["fsdp"],
                                      mesh_shape["tensor"], mesh_shape.get("context", 1)))
    check_fits(config, estimate, device_memory_bytes())
    return estimate


@contextlib.contextmanager
def out_of_memory_errors(config: Config):
    """Inside the block, XLA's out-of-memory is raised as a DeviceMemoryError."""
    try:
        yield
    except Exception as error:
        memory_error = out_of_memory_error(error, config)
        if memory_error is None:
            raise
        raise memory_error from error


def out_of_memory_error(error: BaseException, config: Config) -> DeviceMemoryError | None:
    """XLA's out-of-memory (RESOURCE_EXHAUSTED) as a DeviceMemoryError; None for others."""
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return None
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
        return None
    allocation = re.search(r"Out of memory while trying to allocate ([0-9.]+ ?[KMGT]?i?B)", text)
    what = (f"could not allocate {allocation.group(1)}" if allocation else
            " ".join(text.strip().splitlines()[0].split())[:200])
    return DeviceMemoryError(f"out of device memory ({what}): {_what_to_lower(config)}")
