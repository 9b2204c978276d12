"""Per layer and head: the share of a one-document row's keys still alive after prefill.

    python benchmarks/eviction_heads.py MODEL [MODEL ...] [--contexts 2048 8192]
        [--evict-below -10]

MODEL as in bench_decode.py (a run directory or a preset name). For each context T the first
held-out row of T tokens is prefilled (`Decoder.prefill`, the parallel forward) with eviction
at --evict-below; per attention layer the line lists alive keys / T for every head. The row
must be one document (else the share would mix documents): a row that is not is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))           # bench_decode's Source
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))        # the repository

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench_decode import Source  # noqa: E402
from train.generate import mixers  # noqa: E402
from train.generate.lm import Decoder  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--evict-below", type=float, default=-10.0)
    args = parser.parse_args(argv)
    for spec in args.models:
        source = Source(spec, [], 0)
        for length in args.contexts:
            tokens, segments = source.batch(length, 1, 0)
            if not bool((segments[0] == segments[0, 0]).all()):
                print(f"error: the first held-out row of {length} tokens of {spec} holds more "
                      f"than one document", file=sys.stderr)
                return 2
            decoder = Decoder(source.model, evict_below=args.evict_below)
            _, caches = jax.jit(decoder.prefill)(source.params, tokens)
            for index, cache in enumerate(caches):
                slot_cache = mixers.slot_cache(cache)
                if slot_cache is None:
                    continue
                alive = np.asarray(slot_cache.alive).sum(axis=1)[0] / length
                print(spec, length, f"layer {index}", "live share per head",
                      " ".join(f"{100 * a:.1f}%" for a in alive), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
