"""Held-out evaluation: mean loss and per-position-bucket loss over eval batches.

    totals      sum over batches of eval_step's sums (train/step.py)
    loss        loss_sum / max(count, 1)
    per bucket  bucket_loss_sum / bucket_count (None for an empty bucket); bucket b covers
                document positions [b w, (b+1) w), w = ceil(seq_len / position_buckets),
                the last bucket also everything beyond
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from train.runs import load_run, restore_run_state
from train.session import Session, build_session, make_split_dataset, to_global
from train.sharding import mesh_context


def evaluate(session: Session, params: Any, batches: Iterator[dict[str, np.ndarray]],
             num_batches: int) -> dict[str, Any]:
    """Mean held-out loss over `num_batches` batches and the per-position-bucket mean loss."""
    totals = None
    with mesh_context(session.mesh):
        for _ in range(num_batches):
            out = session.eval_step(params, to_global(session, next(batches)))
            totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    totals = jax.device_get(totals)
    width = -(-session.config.data.seq_len // session.config.train.position_buckets)
    counts = totals["bucket_count"]
    per_position = [float(s / c) if c > 0 else None
                    for s, c in zip(totals["bucket_loss_sum"], counts)]
    return {
        "loss": float(totals["loss_sum"] / max(totals["count"], 1.0)),
        "tokens": int(totals["count"]),
        "position_bucket_start": [i * width for i in range(len(counts))],
        "position_loss": per_position,
        "position_tokens": [int(c) for c in counts],
    }


def evaluate_run(run_dir: str | Path, *, seq_len: int | None = None,
                 num_batches: int | None = None, step: int | None = None) -> dict[str, Any]:
    """Held-out loss of a run's newest readable checkpoint, or of `step` (an error if that
    step is missing or unreadable), optionally at another context length. Read-only: no
    checkpoint file is moved or deleted."""
    for name, value in (("seq_len", seq_len), ("num_batches", num_batches)):
        if value is not None and value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value}")
    config, tokenizer = load_run(run_dir)
    session = build_session(config, tokenizer.vocab_size)
    restored = restore_run_state(run_dir, session, step)
    if seq_len is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, seq_len=seq_len))
        session = build_session(config, tokenizer.vocab_size, session.mesh)
    batches = iter(make_split_dataset(config, tokenizer, "eval"))
    result = evaluate(session, restored.state["params"], batches,
                      num_batches or config.train.eval_batches)
    return {"step": restored.step, "seq_len": config.data.seq_len, **result}
