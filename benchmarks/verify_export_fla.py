"""Load this project's exports into flash-linear-attention's model classes and compare logits.

    python benchmarks/verify_export_fla.py --out DIR [--wheels .whl,.whlhf] [--models fox,softmax,...]
        [--work WORK]   (exports and logits go to WORK, default /tmp/verify_export_fla)

Two processes, as JAX and PyTorch fight over GPU memory:
1. JAX (this process): for each model (FoX, softmax + RoPE, GDN, GDN + softmax hybrid) a
   small LanguageModel with its own initialisation, exported with `train.export.export_params`
   (float32) into WORK/<model>/, and its float32 logits on fixed tokens saved beside it.
2. PyTorch (a subprocess, `--torch-side`): `AutoModelForCausalLM.from_pretrained(WORK/<model>)`
   after `import fla` (which registers fla's configs with transformers), logits on the same
   tokens in float32 and in bfloat16, relative L2 error against the JAX logits.
A table is printed last; DIR/verify_export_fla.json holds every number. The image lacks
transformers (fla's models need it): pass folders of wheels with --wheels (e.g. .whl,.whlhf:
fla, and transformers with its dependencies), installed into
/tmp/hf_site for the PyTorch side only. It also lacks the `flash_attn` package that fla's
softmax `Attention` layer calls; where it is missing, the PyTorch side installs a stand-in whose
`flash_attn_func` is PyTorch's causal SDPA (same math; said in the output).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VOCAB = 512
BASE = ["model.d_model=256", "model.num_layers=2", "attention.num_heads=4",
        "attention.head_dim=64", "gdn.num_heads=2", "gdn.head_dim=64", f"model.vocab_size={VOCAB}",
        "model.vocab_multiple=1", "model.dtype=float32"]
MODELS = {
    "fox": ["attention.kind=fox"],
    "softmax": ["attention.kind=softmax", "attention.position=rope",
                "model.tie_embeddings=false"],
    "gdn": ["model.pattern=G", "gdn.num_v_heads=4"],
    "gdn_softmax_hybrid": ["model.pattern=GA", "attention.kind=softmax",
                           "attention.position=rope", "gdn.num_v_heads=4"],
}
BATCH, LENGTH = 2, 256


def jax_side(out: Path, names: list[str]) -> None:
    import jax
    import numpy as np

    from train import export
    from train.config import load_config
    from train.model import LanguageModel

    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    np.save(out / "tokens.npy", tokens)
    for name in names:
        config = load_config(None, BASE + MODELS[name])
        model = LanguageModel(config, VOCAB)
        params = jax.jit(model.init)(jax.random.PRNGKey(1), tokens, np.ones_like(tokens))
        params = jax.tree.map(lambda p: p.unbox() if hasattr(p, "unbox") else p,
                              params["params"], is_leaf=lambda p: hasattr(p, "unbox"))
        # The initialisation leaves some vectors at exactly 0/1 (norm scales, biases): move
        # them so a transposed or swapped tensor cannot hide.
        leaves, tree = jax.tree.flatten(params)
        rng = np.random.default_rng(2)
        leaves = [np.asarray(x) + np.float32(0.05) * rng.standard_normal(x.shape, np.float32)
                  for x in leaves]
        params = jax.tree.unflatten(tree, leaves)
        export.export_params(params, config, VOCAB, out / name)
        logits = jax.jit(model.apply)({"params": params}, tokens, np.ones_like(tokens))
        np.save(out / name / "jax_logits.npy", np.asarray(logits, np.float32))
        print(f"jax: exported {name}", flush=True)


FLASH_ATTN_STAND_IN = '''"""Stand-in for flash_attn (verification only): causal SDPA in flash_attn's layout."""
import torch
import torch.nn.functional as F


def flash_attn_func(q, k, v, causal=True, window_size=(-1, -1), **kwargs):
    if not causal or tuple(window_size) != (-1, -1):
        raise NotImplementedError("stand-in: causal attention without a window only")
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))        # [B, H, T, D]
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def flash_attn_varlen_func(*args, **kwargs):
    raise NotImplementedError("stand-in: no variable-length attention")
'''


def install_flash_attn_stand_in(out: Path) -> bool:
    """Make `import flash_attn` work when the image lacks it; True when the stand-in is used."""
    try:
        import flash_attn  # noqa: F401
        return False
    except ImportError:
        folder = Path("/tmp/flash_attn_stand_in/flash_attn")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text(FLASH_ATTN_STAND_IN)
        sys.path.insert(0, str(folder.parent))
        return True


def torch_side(out: Path, names: list[str]) -> None:
    import numpy as np
    import torch

    if install_flash_attn_stand_in(out):
        print("torch: flash_attn missing -> stand-in flash_attn_func = causal SDPA", flush=True)
    import fla  # noqa: F401  (registers fla's model classes with transformers)
    from transformers import AutoModelForCausalLM

    tokens = torch.from_numpy(np.load(out / "tokens.npy")).long().cuda()
    results = {}
    for name in names:
        expected = np.load(out / name / "jax_logits.npy").astype(np.float64)
        row = {}
        for dtype in ("float32", "bfloat16"):
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    out / name, torch_dtype=getattr(torch, dtype)).cuda().eval()
                with torch.no_grad():
                    logits = model(input_ids=tokens).logits.float().cpu().numpy()
                err = np.linalg.norm(logits - expected) / np.linalg.norm(expected)
                row[dtype] = {"rel_l2": float(err), "class": type(model).__name__}
            except Exception as error:  # report and go on with the other models
                row[dtype] = {"error": f"{type(error).__name__}: {error}"[:400]}
        results[name] = row
        print(f"torch: {name} {row}", flush=True)
    (out / "torch_results.json").write_text(json.dumps(results, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--wheels", default=None,
                        help="comma-separated folders of wheels installed (--no-deps) for the "
                             "torch side, e.g. .whl,.whlhf")
    parser.add_argument("--work", default="/tmp/verify_export_fla")
    parser.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    names = args.models.split(",")
    if args.torch_side:
        torch_side(work, names)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    jax_side(work, names)
    env = dict(os.environ)
    if args.wheels:
        site = "/tmp/hf_site"
        wheels = sorted(str(w) for folder in args.wheels.split(",")
                        for w in Path(folder).glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--target", site, *wheels], check=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), site) if p)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-side", "--out",
                    str(out), "--work", str(work), "--models", args.models], env=env, check=False)
    results_file = work / "torch_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    lines = ["| model | fla class | rel. L2 float32 | rel. L2 bf16 |", "|---|---|---|---|"]
    for name in names:
        row = results.get(name, {})
        cells = [(row.get(d, {}).get("rel_l2") and f"{row[d]['rel_l2']:.2e}")
                 or row.get(d, {}).get("error", "not run") for d in ("float32", "bfloat16")]
        cls = next((row[d]["class"] for d in row if "class" in row[d]), "-")
        lines.append(f"| {name} | {cls} | {cells[0]} | {cells[1]} |")
    table = "\n".join(lines)
    (out / "verify_export_fla.json").write_text(json.dumps(
        {"batch": BATCH, "length": LENGTH, "base": BASE, "models": MODELS,
         "results": results}, indent=1))
    (out / "verify_export_fla.md").write_text(table + "\n")
    print(table)
    return 0 if results and all("rel_l2" in r.get("float32", {}) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
