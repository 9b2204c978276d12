"""Where a preset's train-step compile time goes: trace, lower and XLA compile, timed apart.

    python benchmarks/compile_profile.py fpa_125m softmax_rope_125m [--context 2048]
        [--batch-size 8] [--layers N] [--cprofile fpa_125m] [--out DIR]
        [--field-passes kernels|by_level|all_levels] [--scan-layers]

For each preset (random tokens, as `python -m train bench`): seconds spent tracing the jitted
train step to a jaxpr, lowering it to StableHLO (Pallas / Mosaic GPU kernels are lowered to
their MLIR here, in Python), and compiling it (XLA passes, the kernels' own compile and ptxas);
the number of custom calls in the lowered module by target. `--cprofile NAME` runs trace +
lower of that preset under cProfile and writes the 40 costliest functions (cumulative) to
DIR/compile_cprofile_NAME.txt. `--scan-layers` sets model.scan_layers (the blocks as one
lax.scan over the pattern's repeats). Prints a table last and writes DIR/compile_profile.json.
"""

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import fpa_backward_options  # noqa: E402

import jax  # noqa: E402

from train.core.presets import load_config  # noqa: E402
from train.core.session import build_session, to_global  # noqa: E402
from train.core.sharding import mesh_context  # noqa: E402
from train.tools.bench import random_batch  # noqa: E402


def custom_calls(text):
    """{target: count} of the custom calls in a StableHLO module's text."""
    return dict(collections.Counter(re.findall(r"stablehlo\.custom_call @([\w.]+)", text)))


def profile_preset(name, context, batch_size, layers, cprofile_out=None, scan_layers=False):
    overrides = [f"data.seq_len={context}", f"data.batch_size={batch_size}",
                 f"model.scan_layers={str(scan_layers).lower()}"]
    if layers:
        overrides.append(f"model.num_layers={layers}")
    config = load_config(name, overrides)
    vocab = config.model.vocab_size or 256
    session = build_session(config, vocab)
    local = random_batch(config, vocab)
    result = {"preset": name, "context": context, "batch_size": batch_size,
              "layers": config.model.num_layers, "scan_layers": scan_layers}
    with mesh_context(session.mesh):
        batch = to_global(session, local)
        state = session.init_state()
        profiler = cProfile.Profile() if cprofile_out else None
        if profiler:
            profiler.enable()
        started = time.time()
        traced = session.train_step.trace(state, batch)
        result["trace_s"] = time.time() - started
        started = time.time()
        lowered = traced.lower()
        result["lower_s"] = time.time() - started
        if profiler:
            profiler.disable()
            buffer = io.StringIO()
            pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(40)
            with open(cprofile_out, "w") as f:
                f.write(buffer.getvalue())
        text = lowered.as_text()
        result["custom_calls"] = custom_calls(text)
        result["hlo_chars"] = len(text)
        started = time.time()
        compiled = lowered.compile()
        result["compile_s"] = time.time() - started
        started = time.time()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        result["first_step_s"] = time.time() - started
    result["total_s"] = result["trace_s"] + result["lower_s"] + result["compile_s"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layers", type=int, default=0, help="override model.num_layers")
    parser.add_argument("--cprofile", default="", help="preset to run under cProfile")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--scan-layers", action="store_true", help="set model.scan_layers")
    fpa_backward_options.add(parser)
    args = parser.parse_args()
    fpa_backward_options.apply(args)
    results = []
    for name in args.presets:
        out = (os.path.join(args.out, f"compile_cprofile_{name}.txt")
               if name == args.cprofile else None)
        result = profile_preset(name, args.context, args.batch_size, args.layers, out,
                                args.scan_layers)
        print(json.dumps(result), flush=True)
        results.append(result)
    with open(os.path.join(args.out, "compile_profile.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{'preset':22s} {'layers':>6s} {'scan':>5s} {'trace s':>8s} {'lower s':>8s} {'compile s':>9s} "
          f"{'total s':>8s}  custom calls")
    for r in results:
        calls = ", ".join(f"{k} {c}" for k, c in r["custom_calls"].items())
        print(f"{r['preset']:22s} {r['layers']:6d} {str(r['scan_layers']):>5s} {r['trace_s']:8.1f} {r['lower_s']:8.1f} "
              f"{r['compile_s']:9.1f} {r['total_s']:8.1f}  {calls}")


if __name__ == "__main__":
    main()
