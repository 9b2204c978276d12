"""Probe outputs: a text table, JSON (everything), CSV (one row per method), PNG.

    table row per method:  successes / seeds, median final held-out accuracy, p-values of the
                           reference method vs this method (one-sided, reference better):
                           Fisher's exact test and the sign test paired by seed
    PNG: left, successes per method (bars); right, held-out accuracy curves (median over seeds,
         band = min..max) with the success threshold dashed
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np


def table_rows(result: dict) -> list[dict]:
    rows = []
    for method, run in result["methods"].items():
        p = result["fisher"].get(method)
        sign = result.get("sign_test", {}).get(method)
        rows.append({"task": result["task"], "method": method, "successes": run["successes"],
                     "seeds": run["seeds"], "median_accuracy": float(np.median(run["final_accuracy"])),
                     "fisher_p_vs_reference": "" if p is None else p,
                     "sign_p_vs_reference": "" if sign is None else sign,
                     "seconds": round(run["seconds"], 2)})
    return rows


def format_table(result: dict) -> str:
    lines = [f"task {result['task']}  sizes {result['sizes']}  threshold {result['threshold']}  "
             f"(p one-sided, {result['reference']} better: Fisher; sign test paired by seed)",
             f"{'method':<20} {'successes':>10} {'median acc':>11} {'p Fisher':>10} "
             f"{'p sign':>10} {'seconds':>9}"]
    text = lambda p: "-" if p == "" else f"{p:.3g}"
    for row in table_rows(result):
        lines.append(f"{row['method']:<20} {row['successes']:>4d} / {row['seeds']:<3d} "
                     f"{row['median_accuracy']:>11.3f} {text(row['fisher_p_vs_reference']):>10} "
                     f"{text(row['sign_p_vs_reference']):>10} {row['seconds']:>9.1f}")
    return "\n".join(lines)


def write_outputs(result: dict, out_dir: Path) -> dict[str, Path]:
    """Writes probe.json, probe.csv and probe.png into out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "probe.json", "csv": out_dir / "probe.csv",
             "png": out_dir / "probe.png"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    rows = table_rows(result)
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _plot(result, paths["png"])
    return paths


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(result["methods"])
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(11, 4))
    successes = [result["methods"][m]["successes"] for m in methods]
    bars.bar(methods, successes, color="tab:blue")
    bars.set_ylim(0, max(r["seeds"] for r in result["methods"].values()))
    bars.set_ylabel("successful seeds")
    bars.set_title(f"{result['task']}: successes (acc > {result['threshold']})")
    bars.tick_params(axis="x", rotation=45)
    steps = result["steps_axis"]
    for method in methods:
        acc = np.asarray(result["methods"][method]["accuracy_curves"])
        line, = curves.plot(steps, np.median(acc, axis=0), label=method)
        curves.fill_between(steps, acc.min(axis=0), acc.max(axis=0), alpha=0.15,
                            color=line.get_color())
    curves.axhline(result["threshold"], linestyle="--", color="gray")
    curves.set_xlabel("step")
    curves.set_ylabel("held-out accuracy")
    curves.set_title("median over seeds (band: min..max)")
    curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
