"""`python -m train export RUN [--format fla|fpa-torch] --out DIR [--dtype bf16|float32] [--step N]
[--force]`.

Parser and handler only (imported when the command line is built, so nothing heavy here);
the export itself is train/tools/export.py.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any


def add_export_command(commands: Any) -> None:
    """Register `export RUN [--format fla|fpa-torch] --out DIR [--dtype bf16|float32]
    [--step N] [--force]`."""
    text = "export a run's checkpoint as safetensors + config.json (flash-linear-attention layout)"
    sub = commands.add_parser("export", help=text, description=text)
    sub.add_argument("run_dir")
    sub.add_argument("--format", default="fla", choices=("fla", "fpa-torch"),
                     help="layout of the export (default: %(default)s); fpa-torch (FPA models): "
                          "adds a PyTorch model for transformers' "
                          "AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)")
    sub.add_argument("--out", required=True,
                     help="output directory: a new or empty one (a non-empty one is refused "
                          "unless --force)")
    sub.add_argument("--dtype", default="float32", choices=("float32", "bf16", "bfloat16"),
                     help="dtype of the stored weights (default: %(default)s)")
    sub.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    sub.add_argument("--force", action="store_true",
                     help="export into a non-empty --out: replace the export's files there "
                          "(model.safetensors, config.json, generation_config.json, README.md, "
                          "configuration_fpa.py, modeling_fpa.py, tokenizer/) and keep the "
                          "others")
    sub.set_defaults(handler=command_export)


def command_export(args) -> int:
    # deferred: keeps orbax, optax and grain (the trainer) out of `--help`
    from train.tools.export import CONFIG_FILE, ExportError, export_run

    try:
        out_dir, step = export_run(args.run_dir, args.out, format=args.format, dtype=args.dtype,
                                   step=args.step, force=args.force)
    except (ExportError, OSError) as error:   # incl. FileNotFoundError, a full disk
        # a user mistake: one line, exit code 1 (train/cli/entry.py); -v adds the traceback
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    model_type = json.loads((out_dir / CONFIG_FILE).read_text())["model_type"]
    print(f"exported step {step} of {args.run_dir} as {model_type} ({args.dtype}) to {out_dir}")
    return 0
