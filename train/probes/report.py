"""Probe outputs: a text table, JSON (everything), CSV (one row per method), PNG.

    table row per method:  successes / seeds, median final held-out accuracy, p-values of the
                           reference method vs this method (one-sided, reference better):
                           Fisher's exact test and the sign test paired by seed
    PNG: left, successes per method (bars); right, held-out accuracy curves (median over seeds,
         band = min..max) with the success threshold dashed
    per-seed PNG (plot_per_seed, `probe plot`): one panel per probe.json, the final held-out
         accuracy of every seed per method (a dot each; a seed's dots joined across methods,
         since the sign test pairs them), successes / seeds above each method, threshold dashed
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


def find_results(paths: list[str | Path]) -> list[Path]:
    """probe.json files: each path is one, or a folder searched for */probe.json (sorted).
    ValueError when a path does not exist or nothing is found."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            inside = sorted(path.glob("*/probe.json"))
            found += inside or ([path / "probe.json"] if (path / "probe.json").is_file() else [])
        elif path.is_file():
            found.append(path)
        else:
            raise ValueError(f"{path} does not exist")
    if not found:
        raise ValueError(f"no probe.json in {', '.join(map(str, paths)) or 'the given paths'}")
    return found


def load_result(path: Path) -> dict:
    """A probe.json as written by write_outputs; ValueError naming the file if it is not one."""
    try:
        result = json.loads(Path(path).read_text())
        for run in result["methods"].values():
            run["final_accuracy"], run["successes"], run["seeds"]
        result["threshold"], result["task"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not a probe result "
                         f"({type(error).__name__}: {error})") from None
    return result


def plot_per_seed(results: list[tuple[str, dict]], path: Path, columns: int = 4) -> Path:
    """One panel per (label, result): final held-out accuracy per seed and method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(1, min(columns, len(results)))
    rows = -(-len(results) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False)
    for axis in axes.flat[len(results):]:
        axis.set_visible(False)
    for axis, (label, result) in zip(axes.flat, results):
        methods = list(result["methods"])
        finals = [np.asarray(result["methods"][m]["final_accuracy"]) for m in methods]
        seeds = max(len(f) for f in finals)
        x = np.arange(len(methods))
        offsets = (np.arange(seeds) - (seeds - 1) / 2) * min(0.5 / max(seeds, 1), 0.04)
        for seed in range(seeds):
            ys = [f[seed] if seed < len(f) else np.nan for f in finals]
            axis.plot(x + offsets[seed], ys, color="tab:gray", alpha=0.25, linewidth=0.6)
        for i, (method, final) in enumerate(zip(methods, finals)):
            passed = final > result["threshold"]
            axis.scatter(i + offsets[:len(final)], final, s=10, zorder=3,
                         c=np.where(passed, "tab:blue", "tab:red"))
            run = result["methods"][method]
            axis.annotate(f"{run['successes']}/{run['seeds']}", (i, 0.99),
                          xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=7)
        axis.axhline(result["threshold"], linestyle="--", color="gray", linewidth=0.8)
        axis.set_xticks(x)
        axis.set_xticklabels(methods, rotation=30, ha="right", fontsize=7)
        axis.set_ylim(min(0.0, *(float(np.min(f)) for f in finals)), 1.13)
        axis.set_title(label, fontsize=8)
        axis.tick_params(axis="y", labelsize=7)
    axes[0, 0].set_ylabel("final held-out accuracy")
    fig.suptitle("per-seed final held-out accuracy (blue: above the task's threshold, dashed; "
                 "a seed's dots joined)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
