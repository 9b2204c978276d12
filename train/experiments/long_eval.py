"""Long-context evaluation of a run: retrieval accuracy over lengths x depths, and per-position
held-out loss beyond the training length (`python -m train eval RUN --suite long`).

    retrieval   for every task k, depth d_i and length L_j: accuracy[k][i][j] = mean over
                `num_samples` samples (train/experiments/long_eval_tasks.py, teacher-forced exact match of
                the answer) of correct(sample); samples seeded by (seed, k, d_i, L_j); a cell whose
                needles and question alone exceed L_j is None
    position    held-out loss at context position_factor x train_seq_len, in `position_buckets`
                equal buckets of document position (train/core/evaluate.py on the eval split)

Output (out_dir): long_eval.json (the returned dict), long_eval_<task>.png (depth x length
heatmap per task) and long_eval_position_loss.png; the long-eval files of an earlier run there
are removed first, so the directory only ever holds one setting's results.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from train.core.evaluate import evaluate
from train.core.metrics import format_duration
from train.core.runs import load_run, restore_run_state
from train.core.session import build_session, make_split_dataset
from train.core.sharding import mesh_context
from train.data.pipeline import make_dataset
from train.experiments.long_eval_tasks import (DEFAULT_DEPTHS, TASKS, answer_correct, check_tasks,
                                               make_sample)

DEFAULT_LENGTH_FACTORS = (1, 2, 4, 8)
SCORING = ("teacher-forced exact match: every answer token is the argmax of the model's "
           "next-token logits (= greedy continuation equals the answer)")


def _check_arguments(lengths, depths, num_samples, seed, batch_size, position_factor,
                     position_buckets) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    for name, value in (("num_samples", num_samples), ("batch_size", batch_size),
                        ("position_factor", position_factor),
                        ("position_buckets", position_buckets)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 2
                          for n in lengths):
        raise ValueError(f"lengths: expected ints >= 2, got {list(lengths)}")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"depths: expected values in [0, 1], got {list(depths)}")


def haystack_tokens(config, tokenizer, min_tokens: int, seed: int) -> np.ndarray:
    """>= min_tokens ids of the run's held-out text (eval split rows, EOS removed)."""

    d = config.data
    rows = make_dataset(source=d.source, tokenizer=tokenizer, seq_len=max(min_tokens, 16),
                        batch_size=1, split="eval", seed=seed, shuffle=True,
                        heldout_fraction=d.heldout_fraction,
                        max_documents=d.max_documents or None, prefetch_buffer_size=0)
    iterator = iter(rows)
    pieces, total = [], 0
    try:
        while total < min_tokens:
            tokens = next(iterator)["tokens"][0]
            tokens = tokens[tokens != tokenizer.eos_id]
            pieces.append(tokens)
            total += tokens.size
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    return np.concatenate(pieces).astype(np.int32)


def retrieval_accuracy(predict, encode, haystack: np.ndarray, *, task: str,
                       lengths: Sequence[int], depths: Sequence[float], num_samples: int,
                       seed: int, batch_size: int = 8,
                       on_length: Callable[[int, list], None] | None = None,
                       ) -> list[list[float | None]]:
    """accuracy [depth][length] of `task`; predict(tokens int32 [B, L]) -> argmax ids [B, L].
    Length by length; on_length(length, [accuracy per depth]) after each."""
    task_index = TASKS.index(task)
    accuracy: list[list[float | None]] = [[None] * len(lengths) for _ in depths]
    for j, length in enumerate(lengths):
        for i, depth in enumerate(depths):  # a cell's samples depend on its own values only
            rng = np.random.default_rng([seed, task_index, round(depth * 10**6), length])
            samples = [make_sample(task, encode, haystack, length, depth, rng)
                       for _ in range(num_samples)]
            if any(s is None for s in samples):     # too short for the fixed text
                continue
            correct = 0
            for start in range(0, num_samples, batch_size):
                chunk = samples[start:start + batch_size]
                tokens = np.stack([s.tokens for s in chunk])
                if len(chunk) < batch_size:     # one shape per length: pad with copies
                    tokens = np.concatenate([tokens, np.repeat(tokens[-1:], batch_size
                                                               - len(chunk), axis=0)])
                predicted = np.asarray(predict(tokens))
                correct += sum(answer_correct(p, s) for p, s in zip(predicted, chunk))
            accuracy[i][j] = correct / num_samples
        if on_length is not None:
            on_length(length, [row[j] for row in accuracy])
    return accuracy


def evaluate_long(run_dir: str | Path, *, step: int | None = None,
                  lengths: Sequence[int] | None = None,
                  depths: Sequence[float] = DEFAULT_DEPTHS,
                  tasks: Sequence[str] = TASKS, num_samples: int = 20, seed: int = 0,
                  out_dir: str | Path | None = None, batch_size: int = 8,
                  position_factor: int = 4, position_buckets: int = 8,
                  position_batches: int | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Long-context suite of a run's newest (or `step`) checkpoint; see the module docstring.

    lengths: context lengths in tokens (default train_seq_len x 1, 2, 4, 8); depths: needle
    depths in [0, 1]; num_samples per cell; batch_size: sequences per forward pass;
    position_batches: eval batches for the per-position loss (default train.eval_batches);
    progress(line): called before the work and after every (task, length) and the loss.
    Returns {task: {"lengths", "depths", "accuracy" [depth][length] (None: too short),
    "samples"}, "position_loss": {...}, "step", "train_seq_len", "scoring", "seed"} and, with
    out_dir, writes long_eval.json and the PNGs there.
    """

    tasks = check_tasks(tasks)
    config, tokenizer = load_run(run_dir)
    train_seq_len = config.data.seq_len
    lengths = tuple(lengths or (f * train_seq_len for f in DEFAULT_LENGTH_FACTORS))
    depths = tuple(float(d) for d in depths)
    _check_arguments(lengths, depths, num_samples, seed, batch_size, position_factor,
                     position_buckets)
    session = build_session(config, tokenizer.vocab_size)
    restored = restore_run_state(run_dir, session, step)
    params = restored.state["params"]
    model = session.model

    @jax.jit
    def argmax_ids(params, tokens):
        logits = model.apply({"params": params}, tokens, jnp.ones_like(tokens))
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def predict(tokens):
        with mesh_context(session.mesh):
            return jax.device_get(argmax_ids(params, jnp.asarray(tokens)))

    report = progress or (lambda line: None)
    started, done, total = time.perf_counter(), [0], len(tasks) * len(lengths)
    report(f"long eval of {run_dir} at step {restored.step}: {len(tasks)} task(s) x "
           f"{len(lengths)} length(s) x {len(depths)} depth(s) x {num_samples} sample(s)")

    def length_done(task, length, accuracies):
        done[0] += 1
        scored = [a for a in accuracies if a is not None]
        score = (f"accuracy {np.mean(scored):.2f} (mean over {len(scored)} depth(s))" if scored
                 else "too short for the needles (-)")
        report(f"long eval {done[0]}/{total}: {task} at {length} tokens: {score} | "
               f"{format_duration(time.perf_counter() - started)}")

    haystack = haystack_tokens(config, tokenizer, 2 * max(lengths), seed)
    result: dict[str, Any] = {}
    for task in tasks:
        accuracy = retrieval_accuracy(
            predict, tokenizer.encode, haystack, task=task, lengths=lengths, depths=depths,
            num_samples=num_samples, seed=seed, batch_size=batch_size,
            on_length=lambda length, accuracies, task=task: length_done(task, length,
                                                                        accuracies))
        result[task] = {"lengths": list(lengths), "depths": list(depths),
                        "accuracy": accuracy, "samples": num_samples}

    long_config = dataclasses.replace(
        config, data=dataclasses.replace(config.data, seq_len=position_factor * train_seq_len),
        train=dataclasses.replace(config.train, position_buckets=position_buckets))
    long_session = build_session(long_config, tokenizer.vocab_size, session.mesh)
    batches = iter(make_split_dataset(long_config, tokenizer, "eval"))
    num_batches = position_batches or config.train.eval_batches
    report(f"long eval: per-position held-out loss at {long_config.data.seq_len} tokens "
           f"({num_batches} batch(es))...")
    losses = evaluate(long_session, params, batches, num_batches)
    result["position_loss"] = {"seq_len": long_config.data.seq_len, **losses}
    report(f"long eval: loss {losses['loss']:.4f} at {long_config.data.seq_len} tokens | "
           f"{format_duration(time.perf_counter() - started)}")
    result.update(step=restored.step, train_seq_len=train_seq_len, scoring=SCORING, seed=seed)
    if out_dir is not None:
        write_outputs(result, out_dir)
    return result


def task_names(result: dict[str, Any]) -> list[str]:
    return [t for t in TASKS if t in result]


def earlier_outputs(out_dir: str | Path) -> list[Path]:
    """The long-eval files already in out_dir: long_eval.json and long_eval_*.png."""
    out = Path(out_dir)
    return sorted(p for p in [out / "long_eval.json", *out.glob("long_eval_*.png")]
                  if p.is_file())


def write_outputs(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """long_eval.json, long_eval_<task>.png per task and long_eval_position_loss.png, after
    removing the earlier_outputs there (so no heatmap of another run's tasks stays behind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in earlier_outputs(out):
        stale.unlink()
    paths = [out / "long_eval.json"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    for task in task_names(result):
        cell = result[task]
        grid = np.array([[np.nan if a is None else a for a in row] for row in cell["accuracy"]],
                        dtype=float)
        figure, axis = plt.subplots(figsize=(max(4.8, 1.2 + 0.9 * len(cell["lengths"])),
                                             max(2.8, 1.4 + 0.5 * len(cell["depths"]))))
        image = axis.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            axis.text(j, i, "-" if np.isnan(value) else f"{value:.2f}", ha="center",
                      va="center", color="white" if value <= 0.6 else "black", fontsize=8)
        axis.set_xticks(range(len(cell["lengths"])), [str(n) for n in cell["lengths"]])
        axis.set_yticks(range(len(cell["depths"])), [f"{d:g}" for d in cell["depths"]])
        axis.set_xlabel(f"context length (tokens; trained at {result['train_seq_len']})")
        axis.set_ylabel("needle depth")
        axis.set_title(f"{task}: accuracy (step {result['step']}, {cell['samples']} samples)",
                       fontsize=9)
        figure.colorbar(image, ax=axis)
        figure.tight_layout()
        paths.append(out / f"long_eval_{task}.png")
        figure.savefig(paths[-1], dpi=100)
        plt.close(figure)
    losses = result["position_loss"]
    figure, axis = plt.subplots(figsize=(6, 3.6))
    axis.plot(losses["position_bucket_start"],
              [np.nan if v is None else v for v in losses["position_loss"]], "o-")
    axis.axvline(result["train_seq_len"], color="gray", linestyle="--",
                 label="training length")
    axis.set_xlabel("document position (bucket start)")
    axis.set_ylabel("held-out loss (nats / token)")
    axis.set_title(f"per-position loss at {losses['seq_len']} tokens (step {result['step']})",
                   fontsize=9)
    axis.legend()
    figure.tight_layout()
    paths.append(out / "long_eval_position_loss.png")
    figure.savefig(paths[-1], dpi=100)
    plt.close(figure)
    return paths


def format_table(result: dict[str, Any]) -> str:
    """One block per task (rows: depths, columns: lengths) and the per-position loss."""
    lines = [f"step {result['step']}, trained at {result['train_seq_len']} tokens; "
             f"accuracy = {SCORING}"]
    for task in task_names(result):
        cell = result[task]
        lines.append(f"{task} ({cell['samples']} samples per cell)")
        lines.append("  depth \\ length " + "".join(f"{n:>8d}" for n in cell["lengths"]))
        for depth, row in zip(cell["depths"], cell["accuracy"]):
            lines.append(f"  {depth:>14g} " + "".join(
                f"{'-':>8}" if a is None else f"{a:>8.2f}" for a in row))
    losses = result["position_loss"]
    lines.append(f"per-position held-out loss at {losses['seq_len']} tokens "
                 f"(mean {losses['loss']:.4f})")
    lines += [f"  positions {start}+: {'n/a' if loss is None else f'{loss:.4f}'}"
              for start, loss in zip(losses["position_bucket_start"], losses["position_loss"])]
    return "\n".join(lines)
