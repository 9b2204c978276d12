"""SpectralShift demonstration: pretrain short, extend 4x five ways, measure what changed.

    python benchmarks/spectralshift_demo.py --size cpu  [--out results/spectralshift_cpu]
    python benchmarks/spectralshift_demo.py --size h200 --models gdn [--out DIR]   (then hybrid)
    python benchmarks/spectralshift_demo.py --size h200_prose --models gdn --variants plain ss_k0.5
        (the language-model comparison's GDN on the prose corpus, 2048 -> 8192; one H200 call
        per set of variants: benchmarks/gpu/spectralshift_one.sh)

For each model (a GDN, and a GDN + softmax-attention hybrid whose attention takes ABF when
extending) the script pretrains at L_short, then continues at L_target = 4 L_short from that
checkpoint, same tokens (same data seed, steps and tokens per step) for every variant:

    plain       cpt.reparameterize=false cpt.scale_lr=false       continued pretraining only
    ss_k0.5     SpectralShift, s = (1/4) ** 0.5 = 0.5             (the method)
    reparam     W_alpha <- mu + s (W_alpha - mu) only              (k = 0.5)
    lr_scale    alpha learning rate x s only                       (k = 0.5)
    ss_k1       SpectralShift with k = 1, s = 0.25

and reports per variant (the reference as "before"): M_slow, H_slow and mean E_write of the
needle key at distances ell = L - 1 - p from L_short / 8 up to the target, L_target - 1 - p
(train/experiments/spectra.py; the needle's last token at p = L_short / 2; the same inputs for
every run), held-out loss at L_short (general ability), at L_target and (sizes with "beyond")
at 2 L_target, and needle retrieval at L_target from train.experiments.long_eval.evaluate_long
when that module exists (else "n/a"). Writes results.json, table.md, slow_band_<model>.png
(every variant) and spectra_<model>/ (reference vs ss_k0.5: train/experiments/spectra.py's
report) under --out. A later command with other --models adds its rows to the same table, and
one with other --variants of a model adds those variants' rows (`merge_rows`: this command's
reference replaces the earlier one, unless --reference-from-results keeps it and measures
the variants only); results.json and table.md are rewritten after every variant, so a run
stopped by a time limit keeps what it measured. The runs go to --runs
(re-running resumes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

SIZES = {
    # CPU, a few minutes on 2 cores: byte-level stdlib text, 64 -> 256
    "cpu": dict(short=64, batch=8, pretrain_steps=300, cpt_steps=60, d_model=64, layers=2,
                heads=4, head_dim=16, lr=3e-3, cpt_lr=1e-3, eval_batches=8, samples=4,
                retrieval_samples=8),
    # the machinery only (tests): a few steps
    "smoke": dict(short=48, batch=8, pretrain_steps=4, cpt_steps=2, d_model=32, layers=2,
                  heads=2, head_dim=16, lr=3e-3, cpt_lr=1e-3, eval_batches=1, samples=1,
                  retrieval_samples=2),
    # one H200: 1024 -> 4096, width 256, 4 layers; meant as one command per model (--models
    # gdn, then --models hybrid), each estimated (not measured) at under 10 minutes
    "h200": dict(short=1024, batch=32, pretrain_steps=1200, cpt_steps=300, d_model=256,
                 layers=4, heads=4, head_dim=64, lr=2e-3, cpt_lr=6e-4, eval_batches=16,
                 samples=8, retrieval_samples=32),
    # one H200, GDN only: the lm_compare --size h200 GDN (configs/lmc_h200_gdn.yaml: 12 x 768
    # on data/prose) pretrained at 2048 for 300 steps of 32 x 2048 (19.7M tokens), then 100
    # steps of 8 x 8192 per variant; on one H200 the reference's pretraining and measures take
    # 385 s, so later calls keep its row (--reference-from-results) and continue one another
    # (--skip-measured; benchmarks/gpu/spectralshift_one.sh)
    "h200_prose": dict(short=2048, batch=32, pretrain_steps=300, cpt_steps=100, lr=1e-3,
                       cpt_lr=3e-4, eval_batches=4, samples=8, retrieval_samples=16,
                       presets={"G": "lmc_h200_gdn"}, beyond=True),
}
MODELS = {"gdn": "G", "hybrid": "GA"}
VARIANTS = {
    "plain": ["cpt.reparameterize=false", "cpt.scale_lr=false"],
    "ss_k0.5": [],
    "reparam": ["cpt.scale_lr=false"],
    "lr_scale": ["cpt.reparameterize=false"],
    "ss_k1": ["cpt.k=1.0"],
}
VARIANT_S = {"plain": 1.0, "ss_k0.5": 0.5, "reparam": 0.5, "lr_scale": 0.5, "ss_k1": 0.25}


def base_preset(size: dict, pattern: str) -> str:
    """The preset a size builds on: its own for the pattern, else tiny_gdn (shape overridden)."""
    presets = size.get("presets")
    if presets is None:
        return "tiny_gdn"
    if pattern not in presets:
        raise SystemExit(f"error: --models: this size has only "
                         f"{[m for m, p in MODELS.items() if p in presets]}")
    return presets[pattern]


def model_overrides(size: dict, pattern: str) -> list[str]:
    logging = ["train.log_every=20", "train.tensorboard=false",
               f"train.eval_batches={size['eval_batches']}"]
    if size.get("presets"):   # shape and data from the preset
        return logging
    overrides = [f"model.pattern={pattern}", f"model.num_layers={size['layers']}",
                 f"model.d_model={size['d_model']}", f"gdn.num_heads={size['heads']}",
                 f"gdn.head_dim={size['head_dim']}", "data.source=stdlib", "data.tokenizer=byte",
                 *logging]
    if "A" in pattern:
        overrides += ["attention.kind=softmax", "attention.position=rope",
                      f"attention.num_heads={size['heads']}",
                      f"attention.head_dim={size['head_dim']}"]
    return overrides


def pretrain(size: dict, pattern: str, run_dir: Path):
    from train.core.fit import fit
    from train.core.presets import load_config

    config = load_config(base_preset(size, pattern), model_overrides(size, pattern) + [
        f"data.seq_len={size['short']}", f"data.batch_size={size['batch']}",
        f"train.steps={size['pretrain_steps']}", f"optim.lr={size['lr']}",
        f"optim.warmup_steps={min(30, size['pretrain_steps'] // 4)}", "train.eval_every=0",
        "train.checkpoint_every=0"])
    return fit(config, run_dir)


def extension_config(size: dict, pattern: str, reference: Path, variant: str):
    """The cpt config of one variant: 4x the context, a quarter of the batch (same tokens)."""
    from train.core.presets import load_config

    return load_config(base_preset(size, pattern), model_overrides(size, pattern) + [
        f"data.seq_len={4 * size['short']}", f"data.batch_size={size['batch'] // 4}",
        f"train.steps={size['cpt_steps']}", f"optim.lr={size['cpt_lr']}", "optim.schedule=constant",
        "optim.warmup_steps=10", "optim.freeze_gdn_decay=true", "train.eval_every=0",
        "train.checkpoint_every=0", f"cpt.reference={reference}",
        f"cpt.positions={'abf' if 'A' in pattern else 'keep'}", *VARIANTS[variant]])


def extend(size: dict, pattern: str, reference: Path, variant: str, run_dir: Path):
    from train.experiments.cpt import continued_pretraining

    return continued_pretraining(extension_config(size, pattern, reference, variant), run_dir)


def retrieval(run_dir: Path, target: int, samples: int) -> dict | str:
    """Mean accuracy over depths at the target length per task (None cells, where the task
    does not fit the length, left out), from train.experiments.long_eval."""
    try:
        from train.experiments.long_eval import evaluate_long
        from train.experiments.long_eval_tasks import TASKS
    except ImportError:
        return "n/a (train.experiments.long_eval not available)"
    result = evaluate_long(run_dir, lengths=[target], depths=(0.1, 0.5, 0.9),
                           num_samples=samples, seed=0, position_factor=2,
                           position_batches=1)
    accuracy = {}
    for task in TASKS:
        cells = [row[0] for row in result[task]["accuracy"] if row[0] is not None]
        if cells:
            accuracy[task] = float(np.mean(cells))
    return accuracy


def measure(run_dir: Path, size: dict, tokens, position: int) -> dict:
    from train.core.evaluate import evaluate_run
    from train.experiments.spectra import spectra

    target = 4 * size["short"]
    lengths = [position + 1 + d for d in (size["short"] // 8, size["short"] // 4)] + [
        size["short"], 2 * size["short"], target]
    summary, first, tokens = spectra(run_dir, lengths=lengths, tokens=tokens,
                                     needle_position=position, num_samples=size["samples"])
    few = max(1, size["eval_batches"] // 4)
    return {
        "summary": summary, "first": first, "tokens": tokens,
        "loss_short": evaluate_run(run_dir, seq_len=size["short"],
                                   num_batches=size["eval_batches"])["loss"],
        "loss_target": evaluate_run(run_dir, seq_len=target, num_batches=few)["loss"],
        "loss_beyond": (evaluate_run(run_dir, seq_len=2 * target, batch_size=1,
                                     num_batches=few)["loss"] if size.get("beyond") else None),
        "retrieval": retrieval(run_dir, target, size["retrieval_samples"]),
    }


def _cell(value, fmt="{:.3f}") -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.2f}" for k, v in value.items()) or "n/a"
    return value if isinstance(value, str) else fmt.format(value)


def write_table(records: dict, out: Path, seconds: float) -> str:
    """table.md from the records (results.json): one row per model and variant."""
    size, position = records["settings"], records["needle_position"]
    short, target = size["short"], 4 * size["short"]
    distances = next(iter(records["models"].values()))[0]["summary"]["distances"]
    ells = "/".join(str(d) for d in distances)
    beyond = any(row.get("loss_beyond") is not None
                 for rows in records["models"].values() for row in rows)
    header = ["model", "variant", "s", f"M_slow @ ell {ells}", f"H_slow @ ell {ells}",
              f"E_write @ ell {ells}", f"loss@{short}", f"loss@{target}",
              *([f"loss@{2 * target}"] if beyond else []), f"retrieval@{target}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, rows in records["models"].items():
        for row in rows:
            summary = row["summary"]
            cells = [model, row["variant"], f"{row['s']:g}",
                     " / ".join(f"{v:.1f}" for v in summary["m_slow"]),
                     " / ".join(f"{v:.1f}" for v in summary["h_slow"])
                     + f" of {summary['layer_heads']}",
                     " / ".join(f"{v:.3f}" for v in summary["e_write_mean"]),
                     _cell(row["loss_short"]), _cell(row["loss_target"]),
                     *([_cell(row.get("loss_beyond") or "-")] if beyond else []),
                     _cell(row["retrieval"])]
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    (out / "table.md").write_text(
        f"SpectralShift demo, size {records['size']}: pretrain at {short}, extend to {target} "
        f"(`python benchmarks/spectralshift_demo.py --size {records['size']}`), {seconds:.0f} s.\n"
        f"Slow-band widths and E_write at distances ell from the needle (its last token at "
        f"{position}; ell = {distances[-1]} is the target length), means over "
        f"{size['samples']} needle sequences; retrieval: train.experiments.long_eval, mean over "
        f"depths.\n\n"
        + text + "\n")
    return text


def merge_rows(rows: list[dict], earlier: list[dict]) -> list[dict]:
    """One model's table rows: this command's (without the per-run inputs "first" and
    "tokens") and the earlier command's rows of variants this command did not run, the
    reference first, then the variants in VARIANTS order."""
    kept = [{k: v for k, v in row.items() if k not in ("first", "tokens")} for row in rows]
    ran = {row["variant"] for row in kept}
    order = ["reference", *VARIANTS]
    return sorted(kept + [row for row in earlier if row["variant"] not in ran],
                  key=lambda row: order.index(row["variant"]))


def variants_to_run(variants: list[str], earlier: list[dict], skip_measured: bool) -> list[str]:
    """The variants this command trains and measures: all, or (--skip-measured) those without
    a row among the earlier command's rows of the model."""
    measured = {row["variant"] for row in earlier} if skip_measured else set()
    for name in sorted(measured & set(variants), key=variants.index):
        print(f"{name}: measured before, skipped", flush=True)
    return [name for name in variants if name not in measured]


def plot_variants(rows: list[dict], model: str, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 3.4), constrained_layout=True)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3)
    for row in rows:
        s = row["summary"]
        for axis, key, title in zip(axes, ("m_slow", "h_slow", "e_write_mean"),
                                    ("M_slow", "H_slow", "E_write (needle key)")):
            axis.plot(s["distances"], s[key], marker="o", label=row["variant"])
            axis.set_xscale("log", base=2)
            axis.set_xlabel("distance (tokens)")
            axis.set_title(f"{model}: {title}")
    axes[0].legend(fontsize="x-small")
    figure.savefig(path, format="png", dpi=100)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--out", help="tables and PNGs (default: results/spectralshift_<size>)")
    parser.add_argument("--runs", help="run directories (default: runs/spectralshift_<size>)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--needle-position", type=int, default=None,
                        help="needle's last token (default: L_short / 2)")
    parser.add_argument("--reference-from-results", action="store_true",
                        help="keep the reference row of --out's results.json instead of "
                             "measuring the pretrained model again (the pretraining repeats "
                             "with the same seed and batches; only the variants are measured)")
    parser.add_argument("--skip-measured", action="store_true",
                        help="variants that already have a row in --out's results.json are "
                             "neither trained nor measured again (re-running a call that a "
                             "time limit stopped continues it)")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    out = Path(args.out or f"results/spectralshift_{args.size}")
    runs = Path(args.runs or f"runs/spectralshift_{args.size}")
    out.mkdir(parents=True, exist_ok=True)
    position = args.needle_position or size["short"] // 2
    started = time.time()
    records = {"size": args.size, "settings": size, "needle_position": position, "models": {}}
    earlier = out / "results.json"
    if earlier.is_file():       # models measured by an earlier command (--models ...) stay
        previous = json.loads(earlier.read_text())
        if (previous["size"], previous["needle_position"]) == (args.size, position):
            records["models"] = previous["models"]

    def save(model, rows):
        """Merge `model`'s rows with results.json's earlier ones; write the files."""
        records["models"][model] = merge_rows(rows, earlier_rows.get(model, []))
        (out / "results.json").write_text(json.dumps(records, indent=1, default=str) + "\n")
        plot_variants(records["models"][model], model, out / f"slow_band_{model}.png")
        return write_table(records, out, time.time() - started)

    earlier_rows = dict(records["models"])
    for model in args.models:   # an error line before any training if the size lacks a model
        base_preset(size, MODELS[model])
        if args.reference_from_results and not any(
                row["variant"] == "reference" for row in earlier_rows.get(model, [])):
            raise SystemExit(f"error: --reference-from-results: {earlier} has no reference "
                             f"row of {model} at size {args.size}, needle position {position}")

    import jax

    # every variant compiles the same programs: keep them on disk (and across re-runs)
    jax.config.update("jax_compilation_cache_dir", str(runs / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    from train.experiments.spectra import write_report

    for model in args.models:
        pattern = MODELS[model]
        reference = runs / model / "reference"
        pretrain(size, pattern, reference)
        print(f"[{time.time() - started:.0f}s] {model} reference pretrained", flush=True)
        if args.reference_from_results:
            from train.experiments.spectra import needle_tokens

            before = {"tokens": needle_tokens(reference, 4 * size["short"], size["samples"],
                                              position)}
            rows = []
        else:
            before = measure(reference, size, None, position)
            rows = [{"variant": "reference", "s": 1.0, **before}]
            text = save(model, rows)
            print(f"[{time.time() - started:.0f}s] {model} reference measured", flush=True)
        for name in variants_to_run(args.variants, earlier_rows.get(model, []),
                                    args.skip_measured):
            extend(size, pattern, reference, name, runs / model / name)
            after = measure(runs / model / name, size, before["tokens"], position)
            rows.append({"variant": name, "s": VARIANT_S[name], **after})
            text = save(model, rows)
            print(f"[{time.time() - started:.0f}s] {model} {name} measured", flush=True)
        text = save(model, rows)
        after = next((r for r in rows if r["variant"] == "ss_k0.5"), rows[-1] if rows else {})
        measured = [r for r in (before, after) if "first" in r]
        if not measured:
            continue
        write_report([r["summary"] for r in measured], [r["first"] for r in measured],
                     out / f"spectra_{model}")
    print(text)
    print(f"written: {out}/table.md, results.json, slow_band_*.png, spectra_*/ "
          f"({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
