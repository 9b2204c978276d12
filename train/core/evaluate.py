"""Held-out evaluation: mean loss and per-position-bucket loss over eval batches.

    totals      sum over batches of eval_step's sums (train/core/step.py)
    loss        loss_sum / max(count, 1)
    per bucket  bucket_loss_sum / bucket_count (None for an empty bucket); bucket b covers
                document positions [b w, (b+1) w), w = ceil(seq_len / position_buckets),
                the last bucket also everything beyond

`evaluate_run` (`python -m train eval RUN`) checks the forward's memory lower bound
(train/core/memory.py `estimate_eval_memory`: params plus batch_size x seq_len tokens of the
residual stream, logits and int32 batch) against the device memory (on CPU the host's) before
the checkpoint is restored or anything compiles, and turns XLA's out-of-memory during the eval
into the same one-line DeviceMemoryError naming --seq-len / --batch-size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from train.core.config import Config, ConfigError
from train.core.memory import (check_fits, device_memory_bytes, estimate_eval_memory,
                               eval_what_to_lower, out_of_memory_errors)
from train.core.runs import load_run, restore_run_state
from train.core.session import Session, build_session, make_split_dataset, to_global
from train.core.sharding import BATCH_MESH_AXES, mesh_context


def evaluate(session: Session, params: Any, batches: Iterator[dict[str, np.ndarray]],
             num_batches: int, per_document: bool = False) -> dict[str, Any]:
    """Mean held-out loss over `num_batches` batches and the per-position-bucket mean loss.
    per_document: also "document_loss_sum" and "document_tokens", one entry per document piece
    (a row's segment with scored tokens), in batch, row, segment order, so that two models
    evaluated on the same batches pair up entry by entry."""
    totals, piece_sums, piece_counts = None, [], []
    with mesh_context(session.mesh):
        for _ in range(num_batches):
            out = dict(session.eval_step(params, to_global(session, next(batches))))
            sums, counts = out.pop("document_loss_sum"), out.pop("document_count")
            if per_document:
                counts = np.asarray(jax.device_get(counts))     # replicated (session.py)
                piece_sums.append(np.asarray(jax.device_get(sums))[counts > 0])
                piece_counts.append(counts[counts > 0])
            totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    totals = jax.device_get(totals)
    width = -(-session.config.data.seq_len // session.config.train.position_buckets)
    counts = totals["bucket_count"]
    per_position = [float(s / c) if c > 0 else None
                    for s, c in zip(totals["bucket_loss_sum"], counts)]
    result = {
        "loss": float(totals["loss_sum"] / max(totals["count"], 1.0)),
        "tokens": int(totals["count"]),
        "position_bucket_start": [i * width for i in range(len(counts))],
        "position_loss": per_position,
        "position_tokens": [int(c) for c in counts],
    }
    if per_document:
        result["document_loss_sum"] = [float(x) for x in np.concatenate(piece_sums)]
        result["document_tokens"] = [int(x) for x in np.concatenate(piece_counts)]
    return result


def _eval_config(config: Config, seq_len: int | None, batch_size: int | None) -> Config:
    """The run's config at the eval's seq_len and batch_size (None: the run's). A new batch
    size runs as one batch (train.grad_accum = 1: eval has no micro-batches)."""
    data = dataclasses.replace(config.data, seq_len=seq_len or config.data.seq_len,
                               batch_size=batch_size or config.data.batch_size)
    train = (config.train if batch_size is None
             else dataclasses.replace(config.train, grad_accum=1))
    return dataclasses.replace(config, data=data, train=train)


def evaluate_run(run_dir: str | Path, *, seq_len: int | None = None,
                 num_batches: int | None = None, step: int | None = None,
                 batch_size: int | None = None, per_document: bool = False) -> dict[str, Any]:
    """Held-out loss of a run's newest readable checkpoint, or of `step` (an error if that
    step is missing or unreadable), optionally at another context length or batch size
    (default: the run's data.seq_len, data.batch_size). A DeviceMemoryError, before anything
    is restored or compiled, when the forward's memory lower bound (module doc) exceeds the
    device's. per_document: as for `evaluate`. Read-only: no checkpoint file is moved or
    deleted."""
    for name, value in (("seq_len", seq_len), ("num_batches", num_batches),
                        ("batch_size", batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value}")
    run_config, tokenizer = load_run(run_dir)
    session = build_session(run_config, tokenizer.vocab_size)    # abstract shapes, no arrays
    config = _eval_config(run_config, seq_len, batch_size)
    mesh = dict(session.mesh.shape)
    shards = math.prod(mesh[axis] for axis in BATCH_MESH_AXES)
    if config.data.batch_size % shards:
        raise ConfigError(f"batch_size: expected a multiple of the mesh's data x fsdp = {shards} "
                          f"batch shards, got {config.data.batch_size}")
    estimate = estimate_eval_memory(config, session.abstract_state["params"],
                                    tokenizer.vocab_size, mesh)
    check_fits(config, estimate, device_memory_bytes(), subject="the eval forward",
               advice=eval_what_to_lower(config))
    restored = restore_run_state(run_dir, session, step)
    if config != run_config:
        session = build_session(config, tokenizer.vocab_size, session.mesh)
    with out_of_memory_errors(config, eval_what_to_lower(config)):
        batches = iter(make_split_dataset(config, tokenizer, "eval"))
        result = evaluate(session, restored.state["params"], batches,
                          num_batches or config.train.eval_batches, per_document)
    return {"step": restored.step, "seq_len": config.data.seq_len,
            "batch_size": config.data.batch_size, **result}
