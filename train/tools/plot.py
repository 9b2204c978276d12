"""PNG plots of a run from its metrics.jsonl.

    loss.png           train loss per step (and its running mean over `smooth` steps), eval loss
                       at each evaluation, learning rate on a second axis
    position_loss.png  mean eval loss per document-position bucket, one line per evaluation
                       (the latest drawn darkest)
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from train.core.metrics import MetricsFileError, read_metrics


def _running_mean(values: np.ndarray, window: int) -> np.ndarray:
    window = max(1, min(window, len(values)))
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    head = cumulative[1:window] / np.arange(1, window)
    tail = (cumulative[window:] - cumulative[:-window]) / window
    return np.concatenate([head, tail])


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None,
             smooth: int = 20) -> list[Path]:
    """Write loss.png (and position_loss.png when there are evaluations); return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    if not train and not evals:
        raise MetricsFileError(f"{run_dir}: metrics.jsonl has no train or eval records to plot")
    written = []

    figure, axis = plt.subplots(figsize=(7, 4.2))
    if train:
        steps = np.array([r["step"] for r in train])
        loss = np.array([r["loss"] for r in train])
        axis.plot(steps, loss, color="tab:blue", alpha=0.3, linewidth=0.8, label="train")
        axis.plot(steps, _running_mean(loss, smooth), color="tab:blue",
                  label=f"train (mean of {min(smooth, len(loss))})")
        if "lr" in train[0]:
            lr_axis = axis.twinx()
            lr_axis.plot(steps, [r["lr"] for r in train], color="tab:gray", linestyle=":",
                         linewidth=1)
            lr_axis.set_ylabel("learning rate", color="tab:gray")
    if evals:
        axis.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-",
                  color="tab:orange", label="eval")
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats / token)")
    axis.set_title(Path(run_dir).name)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right")
    figure.tight_layout()
    path = out / "loss.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    written.append(path)

    positioned = [r for r in evals if r.get("position_loss")]
    if positioned:
        figure, axis = plt.subplots(figsize=(7, 4.2))
        colors = plt.cm.viridis(np.linspace(0.85, 0.0, len(positioned)))
        for color, record in zip(colors, positioned):
            starts = record["position_bucket_start"]
            losses = [np.nan if v is None else v for v in record["position_loss"]]
            axis.plot(starts, losses, "o-", color=color, label=f"step {record['step']}")
        axis.set_xlabel("position in document (bucket start)")
        axis.set_ylabel("eval loss (nats / token)")
        axis.set_title(f"{Path(run_dir).name}: loss by position")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize="small")
        figure.tight_layout()
        path = out / "position_loss.png"
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)
    return written
