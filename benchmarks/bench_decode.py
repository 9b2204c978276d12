"""Decoding: what eviction keeps and costs, and decode ms/token over the context length.

    python benchmarks/bench_decode.py --out DIR [--models M ...] [--contexts 2048 4096 ...]
        [--set key=value ...] [--evict-below -10] [--loss-batch 1] [--decode-steps 32]
        [--skip-eviction] [--skip-decode] [--seed 0]

M: a run directory (its newest checkpoint; loss on its held-out split at each context) or a
preset name (configs/, random init, uniformly random tokens, with the --set overrides, e.g.
tiny sizes on a CPU). Default: fpa_125m fox_125m softmax_rope_125m gdn_125m.

1. Eviction (models whose attention is FPA or FoX), per context T, on loss-batch rows of T
   tokens, every layer's attention computed per head and query block with a key mask
   (train/generate/eviction_study.py, O(T * block) memory):
       full      every causal key of the same document
       evict     keys with b_ts >= evict_below (exactly what the decoding cache keeps: the bias
                 never rises, so a key is gone at t iff b_ts fell below the threshold)
       window    the last W keys, W = the mean number of keys `evict` keeps per query
   kept_final = live keys at the last position / its causal keys (mean over layers, heads,
   rows): the cache's share of the context. d_loss = loss(mask) - loss(full), nats/token.
2. Decode ms/token at batch 1 (every model): prefill a random T-token prompt, size the caches
   to their live keys plus the steps to come, then the median wall time of decode-steps
   jitted one-token steps (each ended by reading the token back), after 3 warm-up steps.
   slots: the largest attention cache (slots per row and head); max live: the most live keys
   of any head, averaged over the attention layers (GDN: no slots).

Prints two tables and writes DIR/decode_bench.json (+ DIR/decode_bench.txt).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

from fpa_jax.decode import slots  # noqa: E402
from train.core.mixers import layer_kinds  # noqa: E402
from train.generate import mixers  # noqa: E402
from train.generate.driver import Generator  # noqa: E402
from train.generate.eviction_study import masked_loss  # noqa: E402
from train.generate.lm import Decoder  # noqa: E402
from train.generate.sampling import SamplingConfig  # noqa: E402

DEFAULT_MODELS = ("fpa_125m", "fox_125m", "softmax_rope_125m", "gdn_125m")
WARMUP_STEPS = 3


# ------------------------------------------------------------------------------ models

class Source:
    """A model, its params and where its evaluation tokens come from."""

    def __init__(self, spec: str, overrides: list[str], seed: int):
        from train.core.model import build_model
        from train.core.presets import load_config

        self.name = spec
        if (Path(spec) / "config.json").is_file():
            from train.generate.loading import load

            loaded = load(spec)
            self.config, self.tokenizer = loaded.config, loaded.tokenizer
            self.model, self.params = loaded.model, loaded.params
            self.vocab = loaded.tokenizer.vocab_size
            return
        self.config, self.tokenizer = load_config(spec, overrides), None
        self.vocab = self.config.model.vocab_size or 257
        self.model = build_model(self.config, self.vocab)
        dummy = jnp.zeros((1, 8), jnp.int32)
        init = jax.jit(lambda key: nn.meta.unbox(self.model.init(key, dummy, dummy)["params"]))
        self.params = init(jax.random.PRNGKey(seed))

    def batch(self, length: int, rows: int, seed: int) -> tuple[jax.Array, jax.Array]:
        """(tokens, segment_ids) [rows, length]: held-out rows of a run, random tokens else."""
        if self.tokenizer is None:
            tokens = jax.random.randint(jax.random.PRNGKey(seed), (rows, length), 0, self.vocab)
            return tokens, jnp.ones_like(tokens)
        import dataclasses

        from train.core.session import make_split_dataset

        config = dataclasses.replace(self.config, data=dataclasses.replace(
            self.config.data, seq_len=length, batch_size=rows))
        batch = next(iter(make_split_dataset(config, self.tokenizer, "eval")))
        return jnp.asarray(batch["tokens"]), jnp.asarray(batch["segment_ids"])


# ------------------------------------------------------------------------------ eviction

def eviction_rows(source: Source, contexts, evict_below, rows, seed):
    decoder = Decoder(source.model, evict_below=evict_below)
    heads = source.config.attention.num_heads
    run = jax.jit(lambda p, t, s, mode, window: masked_loss(decoder, p, t, s, mode, evict_below,
                                                            window), static_argnums=(3, 4))
    results = []
    for length in contexts:
        tokens, segment_ids = source.batch(length, rows, seed)
        full, _ = run(source.params, tokens, segment_ids, "full", 0)
        evict, counts = run(source.params, tokens, segment_ids, "evict", 0)
        if not counts:
            continue
        kept = np.stack([np.asarray(c[0]) for c in counts])              # [L, B, T] (sum of H)
        causal = np.stack([np.asarray(c[1]) for c in counts])
        mean_kept = float(kept.mean() / heads)
        window = max(1, round(mean_kept))
        windowed, _ = run(source.params, tokens, segment_ids, "window", window)
        results.append({
            "model": source.name, "kind": source.config.attention.kind, "context": length,
            "kept_final": float((kept[:, :, -1] / causal[:, :, -1]).mean()),
            "mean_kept_keys": mean_kept, "loss_full": float(full),
            "d_loss_evict": float(evict - full), "window": window,
            "d_loss_window": float(windowed - full)})
        print(_eviction_line(results[-1]), flush=True)
    return results


# ------------------------------------------------------------------------------ decoding

def _exact_fit(caches, headroom):
    """Every slot cache resized to its live keys + headroom slots (no resize while timing)."""
    fitted = []
    for cache in caches:
        slot_cache = mixers.slot_cache(cache)
        if slot_cache is None:
            fitted.append(cache)
            continue
        live = int(slots.live_counts(slot_cache).max())
        fitted.append({**cache, "slots": slots.resize(slot_cache, live + headroom)})
    return tuple(fitted)


def decode_rows(source: Source, contexts, evict_below, steps, seed):
    generator = Generator(Decoder(source.model, evict_below=evict_below), source.params,
                          SamplingConfig(temperature=0.0), source.vocab)
    key = jax.random.PRNGKey(seed)
    results = []
    for length in contexts:
        prompt = np.asarray(jax.random.randint(jax.random.fold_in(key, length), (1, length), 0,
                                               source.vocab))
        start = time.perf_counter()
        token, caches, live = generator.prefill(prompt, key)
        prefill_seconds = time.perf_counter() - start
        caches = _exact_fit(caches, steps + WARMUP_STEPS + 1)
        times = []
        for index in range(WARMUP_STEPS + steps):
            start = time.perf_counter()
            token, caches, live, _ = generator.step(token, caches, live, key)
            if index >= WARMUP_STEPS:
                times.append(time.perf_counter() - start)
        capacities = [mixers.slot_cache(c).capacity for c in caches
                      if mixers.slot_cache(c) is not None]
        results.append({
            "model": source.name, "kind": _kind(source.config), "context": length,
            "ms_per_token": 1e3 * statistics.median(times),
            "prefill_s": prefill_seconds,
            "slots": max(capacities) if capacities else 0,
            "max_live_keys": float(np.mean(live)) if len(live) else 0.0})
        print(_decode_line(results[-1]), flush=True)
    return results


def _kind(config) -> str:
    return "+".join(sorted(set(layer_kinds(config))))


# ------------------------------------------------------------------------------ tables

def _eviction_line(r) -> str:
    return (f"{r['model']:<22} {r['context']:>6} {100 * r['kept_final']:>9.1f}% "
            f"{r['mean_kept_keys']:>10.1f} {r['d_loss_evict']:>+12.5f} {r['window']:>7} "
            f"{r['d_loss_window']:>+12.5f}")


def _decode_line(r) -> str:
    return (f"{r['model']:<22} {r['kind']:<10} {r['context']:>6} {r['ms_per_token']:>9.3f} "
            f"{r['slots']:>7} {r['max_live_keys']:>10.1f} {r['prefill_s']:>9.2f}")


EVICTION_HEADER = (f"{'model':<22} {'ctx':>6} {'kept@end':>10} {'mean keys':>10} "
                   f"{'dloss evict':>12} {'window':>7} {'dloss window':>12}")
DECODE_HEADER = (f"{'model':<22} {'mixer':<10} {'ctx':>6} {'ms/token':>9} {'slots':>7} "
                 f"{'max live':>10} {'prefill s':>9}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        help="run directories or preset names")
    parser.add_argument("--contexts", nargs="+", type=int, default=[2048, 4096, 8192, 16384])
    parser.add_argument("--set", nargs="*", default=[], metavar="key=value",
                        help="overrides for preset models (e.g. tiny sizes on a CPU)")
    parser.add_argument("--evict-below", type=float, default=-10.0)
    parser.add_argument("--loss-batch", type=int, default=1, help="rows per context (eviction)")
    parser.add_argument("--decode-steps", type=int, default=32, help="timed steps per context")
    parser.add_argument("--skip-eviction", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.contexts) < 2 or args.decode_steps < 1 or args.loss_batch < 1:
        parser.error("--contexts must be >= 2, --decode-steps and --loss-batch >= 1")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    devices = jax.devices()
    header = (f"device {devices[0].device_kind} ({devices[0].platform}), evict_below "
              f"{args.evict_below}, contexts {args.contexts}, overrides {args.set}")
    print(header, flush=True)
    eviction, decode = [], []
    sources = [Source(spec, args.set, args.seed) for spec in args.models]
    if not args.skip_eviction:
        print(EVICTION_HEADER, flush=True)
        for source in sources:
            if source.config.attention.kind in ("fpa", "fox") and "attention" in \
                    source.config.layer_sections():
                eviction += eviction_rows(source, args.contexts, args.evict_below,
                                          args.loss_batch, args.seed)
    if not args.skip_decode:
        print(DECODE_HEADER, flush=True)
        for source in sources:
            decode += decode_rows(source, args.contexts, args.evict_below, args.decode_steps,
                                  args.seed)
    text = "\n".join([header, "", EVICTION_HEADER, *map(_eviction_line, eviction), "",
                      DECODE_HEADER, *map(_decode_line, decode)])
    (out / "decode_bench.txt").write_text(text + "\n")
    (out / "decode_bench.json").write_text(json.dumps(
        {"header": header, "args": vars(args), "eviction": eviction, "decode": decode},
        indent=1) + "\n")
    print(f"written {out / 'decode_bench.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
