"""Check the memory estimate (train/core/memory.py) against the allocator on a real device.

    python -m benchmarks.memory_check --out DIR [--presets tiny_fpa,gdn_125m] [--seq-lens 512,2048]
                                 [--batch-sizes 8,32] [--vocab 32768] [--oom-batch 4096]
                                 [--case-timeout 900]
    (or python benchmarks/memory_check.py ...; from the repository root, or anywhere)

For every (preset, seq_len, batch_size) a fresh subprocess builds the session, estimates, and
then runs one train step on random tokens (one document per row) and reads the allocator's
peak_bytes_in_use: the estimate is meant to err low, so `estimate / peak` should stay below 1
(a ratio above 1 means `fit` could refuse a step that fits). A case whose estimate exceeds the
device memory is reported "refused" without running. `--oom-batch B` adds one case per preset
whose batch B is run with the refusal switched off, to see XLA's out-of-memory error mapped to
the one-line DeviceMemoryError (status "oom"; "ran" if it fit after all).

Prints a table and writes DIR/memory_check.json. On CPU the allocator reports nothing: the
peak and ratio columns read n/a (a quick way to try the script).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere


def _one_case(preset: str, seq_len: int, batch_size: int, vocab: int, enforce: bool) -> dict:
    # deferred: the parent process only starts one subprocess per case and reads its
    # output; jax and the trainer load in the subprocess
    import jax
    import jax.numpy as jnp
    import numpy as np

    from train.core.memory import (DeviceMemoryError, check_fits, device_memory_bytes,
                                   estimate_train_memory, out_of_memory_error)
    from train.core.model import resolve_vocab_size
    from train.core.presets import load_config
    from train.core.session import build_session, to_global
    from train.core.sharding import mesh_context

    config = load_config(preset, [f"data.seq_len={seq_len}", f"data.batch_size={batch_size}"])
    session = build_session(config, vocab)
    estimate = estimate_train_memory(config, session.abstract_state, vocab, session.mesh.shape)
    limit = device_memory_bytes()
    result = {"preset": preset, "seq_len": seq_len, "batch_size": batch_size,
              "estimate_bytes": estimate.total_bytes, "state_bytes": estimate.state_bytes,
              "gradient_bytes": estimate.gradient_bytes,
              "activation_bytes": estimate.activation_bytes, "limit_bytes": limit,
              "peak_bytes": None, "status": "ran", "message": ""}
    if enforce:
        try:
            check_fits(config, estimate, limit)
        except DeviceMemoryError as error:
            return {**result, "status": "refused", "message": str(error)}
    rows = batch_size // jax.process_count()
    tokens = np.random.default_rng(0).integers(
        0, resolve_vocab_size(config, vocab), (rows, seq_len + 1)).astype(np.int32)
    batch = to_global(session, {"tokens": tokens, "segment_ids": np.ones_like(tokens)})
    started = time.time()
    try:
        with mesh_context(session.mesh):
            state = session.init_state()
            state, metrics = session.train_step(state, batch)
            jax.block_until_ready(metrics)
    except Exception as error:
        mapped = out_of_memory_error(error, config)
        if mapped is None:
            raise
        return {**result, "status": "oom", "message": str(mapped)}
    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return {**result, "peak_bytes": int(peak) if peak else None,
            "seconds": time.time() - started, "loss": float(jnp.asarray(metrics["loss"]))}


def _run_subprocess(preset, seq_len, batch_size, vocab, enforce, timeout) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--one",
               json.dumps([preset, seq_len, batch_size, vocab, enforce])]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        tail = " ".join(str(expired.stderr or "").strip().splitlines()[-3:])
        return {"preset": preset, "seq_len": seq_len, "batch_size": batch_size,
                "status": f"timed out after {timeout} s", "message": tail[-300:],
                "estimate_bytes": None, "peak_bytes": None}
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = " ".join((completed.stderr or "").strip().splitlines()[-3:])
    return {"preset": preset, "seq_len": seq_len, "batch_size": batch_size,
            "status": f"failed (rc {completed.returncode})", "message": tail[-300:],
            "estimate_bytes": None, "peak_bytes": None}


def _size(value) -> str:
    # deferred: keeps jax out of the parent process (see _one_case)
    from train.core.memory import format_bytes

    return "n/a" if value is None else format_bytes(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="directory for memory_check.json")
    parser.add_argument("--presets", default="tiny_fpa,tiny_gdn")
    parser.add_argument("--seq-lens", default="256")
    parser.add_argument("--batch-sizes", default="4")
    parser.add_argument("--vocab", type=int, default=257, help="tokenizer vocabulary size")
    parser.add_argument("--oom-batch", type=int, default=0,
                        help="also run this batch per preset (at the first seq len) unrefused")
    parser.add_argument("--case-timeout", type=float, default=900,
                        help="seconds one case may take (its subprocess is then killed)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(_one_case(*json.loads(args.one))), flush=True)
        return 0
    if not args.out:
        parser.error("--out is required")
    seq_lens = [int(x) for x in args.seq_lens.split(",")]
    cases = [(p, t, b, True) for p in args.presets.split(",") for t in seq_lens
             for b in (int(x) for x in args.batch_sizes.split(","))]
    if args.oom_batch:
        cases += [(p, seq_lens[0], args.oom_batch, False) for p in args.presets.split(",")]
    results = []
    header = (f"{'preset':<18} {'T':>6} {'B':>5} {'estimate':>11} {'peak':>11} {'ratio':>6}  "
              f"status")
    print(header)
    for preset, seq_len, batch_size, enforce in cases:
        result = _run_subprocess(preset, seq_len, batch_size, args.vocab, enforce,
                                 args.case_timeout)
        results.append(result)
        estimate, peak = result.get("estimate_bytes"), result.get("peak_bytes")
        ratio = f"{estimate / peak:.2f}" if estimate and peak else "n/a"
        print(f"{preset:<18} {seq_len:>6} {batch_size:>5} {_size(estimate):>11} {_size(peak):>11} "
              f"{ratio:>6}  {result['status']}"
              + (f": {result['message'][:150]}" if result.get("message") else ""), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory_check.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"written {out / 'memory_check.json'}")
    too_high = [r for r in results if r.get("estimate_bytes") and r.get("peak_bytes")
                and r["estimate_bytes"] > r["peak_bytes"]]
    return 1 if too_high else 0


if __name__ == "__main__":
    sys.exit(main())
