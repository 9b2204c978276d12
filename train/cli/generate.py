"""`python -m train generate RUN --prompt TEXT [--max-new-tokens N --temperature T --top-k K
--top-p P --seed S --batch B --evict-below X|none --step N]`.

Parser and handler only (imported when the command line is built, so nothing heavy at import);
generation itself is train/generate/. Loads the run's config, tokenizer and checkpoint (the
newest, or --step), prefills the prompt (B copies, each sampled on its own), streams row 0's
text to stdout as it is decoded (the other rows follow at the end; with B > 1 every sample
starts with a line `--- sample i`), then prints one line: tokens, tokens/s and the attention
caches' live keys and slots. Out-of-range values are argparse refusals naming the valid range
(exit 2). On stderr: the checkpoint line; a `warning:` line when the prompt plus
--max-new-tokens exceeds LONG_CONTEXT_FACTOR x the run's data.seq_len (untested lengths; it
names the attention caches' size at that length); a line before and after a prefill of
LONG_PREFILL_TOKENS or more prompt tokens. SIGTERM or Ctrl-C exits 130: nothing resumes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from train.cli import UserError
from train.cli.common import int_at_least
from train.core.mixers import MIXERS, layer_kinds
from train.generate.driver import Generator, planned_capacity
from train.generate.lm import Decoder
from train.generate.loading import load
from train.generate.sampling import SamplingConfig

DEFAULT_EVICT_BELOW = -10.0
LONG_CONTEXT_FACTOR = 4         # prompt + new tokens beyond this x data.seq_len: a warning
LONG_PREFILL_TOKENS = 512       # prompts this long get a line before and after their prefill


def _evict_below(text: str) -> float | None:
    """A threshold <= 0, or 'none': the FPA / FoX bias is <= 0 (0 at the newest key), so a
    threshold above 0 would evict every key."""
    expected = ("expected a number <= 0 or 'none' (the FPA/FoX bias is <= 0, so a threshold "
                "above 0 would evict every key)")
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
    if not value <= 0:          # NaN too
        raise argparse.ArgumentTypeError(f"{expected}, got {text}")
    return value


def _float_in(low: float, high: float, *, low_open: bool = False):
    """argparse type: a float in [low, high] ((low, high] with low_open; high = inf: any finite
    float above low), else a one-line refusal naming the range."""
    if high == float("inf"):
        expected = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        expected = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        above = low < value if low_open else low <= value
        if not (above and (value < high if high == float("inf") else value <= high)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value
    return parse


def add_generate_command(commands: Any) -> None:
    """Register `generate RUN --prompt TEXT [...]`."""
    text = "sample text from a run's checkpoint (prefill + cached decoding, streamed)"
    sub = commands.add_parser("generate", help=text, description=text)
    sub.add_argument("run_dir")
    sub.add_argument("--prompt", required=True, help="text to continue (at least one token)")
    sub.add_argument("--max-new-tokens", type=int_at_least(1), default=128,
                     help="tokens to sample, >= 1 (default: %(default)s)")
    sub.add_argument("--temperature", type=_float_in(0.0, float("inf")),
                     default=1.0, help=">= 0, 0: greedy (default: %(default)s)")
    sub.add_argument("--top-k", type=int_at_least(0), default=0,
                     help="keep the k likeliest tokens, 0: no top-k cut (default: %(default)s)")
    sub.add_argument("--top-p", type=_float_in(0.0, 1.0, low_open=True), default=1.0,
                     help="nucleus in (0, 1], 1: no nucleus cut (default: %(default)s)")
    sub.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    sub.add_argument("--batch", type=int_at_least(1), default=1,
                     help="samples of the same prompt, >= 1 (default: %(default)s)")
    sub.add_argument("--evict-below", type=_evict_below, default=DEFAULT_EVICT_BELOW,
                     help="evict FPA/FoX keys whose bias fell below this, a number <= 0; "
                          "'none' keeps every key (default: %(default)s)")
    sub.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    sub.set_defaults(handler=command_generate)


class _Streamer:
    """Prints row 0's text as tokens arrive (holding back an unfinished UTF-8 character)."""

    def __init__(self, tokenizer, stop_token):
        self.tokenizer, self.stop_token = tokenizer, stop_token
        self.ids: list[int] = []
        self.printed = 0
        self.done = False

    def __call__(self, tokens) -> None:
        if self.done:
            return
        token = int(tokens[0])
        if token == self.stop_token:
            self.done = True
            self.flush()
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):
            self._print(text)

    def _print(self, text: str) -> None:
        sys.stdout.write(text[self.printed:])
        sys.stdout.flush()
        self.printed = len(text)

    def flush(self) -> None:
        self._print(self.tokenizer.decode(self.ids))


def _long_context_warning(config, batch: int, prompt_tokens: int, new_tokens: int) -> str | None:
    """The `warning:` line for a generation far beyond the training length, else None. The
    cache size: keys and values of every layer with a key-value cache (`MixerSpec.kv_width`)
    at the power of two of slots that holds every token (train/generate/driver.py; eviction
    can keep it smaller)."""
    total, trained = prompt_tokens + new_tokens, config.data.seq_len
    if total <= LONG_CONTEXT_FACTOR * trained:
        return None
    specs = [MIXERS[kind] for kind in layer_kinds(config)]
    widths = [spec.kv_width(config) for spec in specs if not spec.recurrent]
    if widths:
        slots = planned_capacity(total, 0, headroom=0, fresh=True)
        size = sum(widths) * batch * slots * jnp.dtype(config.model.dtype).itemsize
        caches = (f"the attention caches grow to up to {slots} slots per head in {len(widths)} "
                  f"layer(s), about {size / 2**20:,.1f} MiB of keys and values for {batch} "
                  f"row(s) (less where eviction frees slots)")
    else:
        titles = " / ".join(dict.fromkeys(spec.title for spec in specs))
        caches = f"the {titles} state stays its fixed size"
    return (f"warning: prompt ({prompt_tokens} tokens) + --max-new-tokens {new_tokens} = "
            f"{total} tokens, more than {LONG_CONTEXT_FACTOR}x the length this model was "
            f"trained at (data.seq_len={trained}): quality there is untested; {caches}")


def _text(tokenizer, row, stop_token) -> str:
    row = list(row)
    return tokenizer.decode(row[:row.index(stop_token)] if stop_token in row else row)


def command_generate(args) -> int:
    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir}: run directory does not exist")
    if not args.prompt:
        raise UserError("--prompt: empty; give some text to continue")

    loaded = load(args.run_dir, args.step)
    config, tokenizer = loaded.config, loaded.tokenizer
    prompt = tokenizer.encode_array(args.prompt)
    if prompt.size == 0:
        raise UserError("--prompt: encodes to no tokens; give some text")
    try:
        decoder = Decoder(loaded.model, evict_below=args.evict_below)
    except ValueError as error:
        raise UserError(f"{args.run_dir}: {error}") from None
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    generator = Generator(decoder, loaded.params, sampling, tokenizer.vocab_size)
    stop_token = getattr(tokenizer, "eos_id", None)
    streamer = _Streamer(tokenizer, stop_token)
    print(f"step {loaded.step} of {args.run_dir} ({config.name}), evict_below="
          f"{args.evict_below}", file=sys.stderr, flush=True)
    warning = _long_context_warning(config, args.batch, prompt.size, args.max_new_tokens)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    long_prefill = prompt.size >= LONG_PREFILL_TOKENS
    if long_prefill:
        print(f"prefilling the {prompt.size}-token prompt ({args.batch} row(s))...",
              file=sys.stderr, flush=True)

    def prefilled(seconds: float) -> None:
        if long_prefill:
            print(f"prefilled in {seconds:.2f} s (compilation included); decoding "
                  f"{args.max_new_tokens} tokens", file=sys.stderr, flush=True)
        if args.batch > 1:
            sys.stdout.write("--- sample 0\n")
        sys.stdout.write(args.prompt)

    result = generator.generate(np.repeat(prompt[None], args.batch, axis=0), args.max_new_tokens,
                                seed=args.seed, on_tokens=streamer, stop_token=stop_token,
                                on_prefilled=prefilled)
    streamer.flush()
    sys.stdout.write("\n")
    for index, row in enumerate(result.tokens[1:], start=1):
        print(f"--- sample {index}\n{args.prompt}{_text(tokenizer, row, stop_token)}")
    caches = ", ".join(f"{live}/{slots}" for live, slots in zip(result.live_keys, result.capacities)
                       if slots is not None) or "none (recurrent state only)"
    print(f"{result.tokens.size} tokens ({args.batch} x {result.tokens.shape[1]}) after a "
          f"{result.prompt_length}-token prompt: {result.tokens_per_second:.1f} tokens/s "
          f"(prefill {result.prefill_seconds:.2f} s); attention cache live keys/slots per layer: "
          f"{caches}", flush=True)
    return 0
