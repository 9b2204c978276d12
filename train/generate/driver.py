"""The Python side of generation: prefill, then one jitted decode step per token, the slot
caches resized between steps so their size follows the live keys.

    prefill (jit, one compile per prompt length) -> logits of the last prompt token, caches
                   (then cut to the power of two that holds their live keys)
    per new token: sample (inside the step), read back (token, live keys per layer, overflow)
    before a step: a layer whose live keys + 1 exceed its slots grows to the next power of two;
                   one whose slots are >= 4x that power shrinks to twice it (both outside jit,
                   so the step recompiles once per new shape); more than max_capacity slots:
                   CacheFullError
    after a step:  the overflow flag (a write that found no free slot) -> CacheFullError;
                   it cannot happen when the growth rule above ran, so it marks a bug

Timing: decode_seconds covers the steps whose shapes had run before (no compile), so
tokens/s = batch * those steps / decode_seconds is the steady decoding rate; with no such
step (very short generations) it is all new tokens over the whole wall time instead.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fpa_jax.decode import slots
from train.generate import mixers
from train.generate.lm import Decoder
from train.generate.sampling import SamplingConfig, sample

MIN_SLOTS = 16


class CacheFullError(RuntimeError):
    """A layer's live keys need more slots than allowed, or a write found no free slot."""


def _power_of_two(n: int) -> int:
    return max(MIN_SLOTS, 1 << max(n - 1, 0).bit_length())


def planned_capacity(live: int, capacity: int, headroom: int = 1, fresh: bool = False) -> int:
    """Slots for `live` keys plus `headroom` writes: grow to the next power of two when they
    do not fit; shrink to twice that power when the cache is 4x or more of it; exactly that
    power for a `fresh` cache (just prefilled: one slot per prompt token)."""
    fitting = _power_of_two(live + headroom)
    if fresh or live + headroom > capacity:
        return fitting
    return 2 * fitting if 4 * fitting <= capacity else capacity


@dataclasses.dataclass
class Generation:
    tokens: np.ndarray            # [B, N] new tokens
    prompt_length: int
    prefill_seconds: float        # prefill incl. its compile
    decode_seconds: float         # the steps that did not compile
    timed_steps: int
    wall_seconds: float           # prefill and every step
    capacities: list              # per layer: slots per (row, head), None for GatedDeltaNet
    live_keys: list               # per layer: most live keys of any (row, head), None for GDN

    @property
    def tokens_per_second(self) -> float:
        if not self.timed_steps:
            return self.tokens.size / self.wall_seconds
        return self.tokens.shape[0] * self.timed_steps / self.decode_seconds


class Generator:
    """Samples from `decoder` with `params` (jitted prefill and step, resized caches)."""

    def __init__(self, decoder: Decoder, params: Any, sampling: SamplingConfig,
                 vocab_size: int, max_capacity: int | None = None):
        self.decoder, self.params, self.sampling = decoder, params, sampling
        self.vocab_size, self.max_capacity = vocab_size, max_capacity
        self._prefill = jax.jit(decoder.prefill)
        self._sample = jax.jit(lambda logits, key: sample(logits, key, sampling, vocab_size))
        self._step = jax.jit(self._step_and_sample, donate_argnums=(2,))
        self._seen_shapes = set()

    def _step_and_sample(self, params, tokens_t, caches, key):
        logits, caches = self.decoder.step(params, tokens_t, caches)
        return sample(logits, key, self.sampling, self.vocab_size), caches, self._stats(caches)

    @staticmethod
    def _stats(caches):
        """(most live keys per attention layer [L_attn], any overflow)."""
        caches = [mixers.slot_cache(c) for c in caches]
        caches = [c for c in caches if c is not None]
        if not caches:
            return jnp.zeros((0,), jnp.int32), jnp.zeros((), bool)
        live = jnp.stack([slots.live_counts(c).max() for c in caches])
        return live, jnp.stack([c.overflow for c in caches]).any()

    def fit(self, caches: tuple, live: np.ndarray, headroom: int = 1,
            fresh: bool = False) -> tuple:
        """Caches resized (outside jit) to planned_capacity for `headroom` more writes."""
        fitted, attention_index = [], 0
        for index, cache in enumerate(caches):
            slot_cache = mixers.slot_cache(cache)
            if slot_cache is None:
                fitted.append(cache)
                continue
            layer_live = int(live[attention_index])
            attention_index += 1
            capacity = planned_capacity(layer_live, slot_cache.capacity, headroom, fresh)
            if self.max_capacity is not None and capacity > self.max_capacity:
                if layer_live + headroom > self.max_capacity:
                    raise CacheFullError(
                        f"layer {index}: {layer_live} live keys (+{headroom} to write) do not "
                        f"fit in max_capacity={self.max_capacity} slots; allow more slots or "
                        f"evict more keys (evict_below)")
                capacity = self.max_capacity
            fitted.append(cache if capacity == slot_cache.capacity
                          else {**cache, "slots": slots.resize(slot_cache, capacity)})
        return tuple(fitted)

    def prefill(self, prompt: np.ndarray, key: jax.Array):
        """prompt [B, T] int -> (first new tokens [B] on the host, caches fitted to their live
        keys, live keys per attention layer)."""
        prompt = np.asarray(prompt)
        if prompt.ndim != 2 or prompt.shape[1] < 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise ValueError(f"prompt: expected integer ids [batch, length >= 1], got "
                             f"{prompt.dtype} {prompt.shape}")
        logits, caches = self._prefill(self.params, jnp.asarray(prompt, jnp.int32))
        token = self._sample(logits[:, -1], jax.random.fold_in(key, 0))
        token, (live, _) = jax.device_get((token, self._stats(caches)))  # host: one input type
        return token, self.fit(caches, live, fresh=True), live

    def step(self, token: jax.Array, caches: tuple, live: np.ndarray, key: jax.Array):
        """One token through every layer (caches resized first when needed) -> (next tokens
        on the host [B], caches, live keys per attention layer, whether the step compiled)."""
        caches = self.fit(caches, live)
        shapes = tuple(x.shape for x in jax.tree.leaves(caches))
        compiled = shapes not in self._seen_shapes
        self._seen_shapes.add(shapes)
        token, caches, stats = self._step(self.params, token, caches, key)
        token, (live, overflow) = jax.device_get((token, stats))
        if overflow:
            raise CacheFullError(f"a decode step found no free cache slot (live keys per "
                                 f"attention layer: {list(live)})")
        return token, caches, live, compiled

    def generate(self, prompt: np.ndarray, max_new_tokens: int, seed: int = 0,
                 on_tokens: Callable[[np.ndarray], None] | None = None,
                 stop_token: int | None = None,
                 on_prefilled: Callable[[float], None] | None = None) -> Generation:
        """prompt [B, T] int (T >= 1) -> Generation with up to max_new_tokens new tokens per
        row (fewer once every row has produced `stop_token`). on_prefilled(seconds) is called
        once the prompt is prefilled, before on_tokens sees the first new tokens."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens}")
        key = jax.random.PRNGKey(seed)
        first = time.perf_counter()
        token, caches, live = self.prefill(prompt, key)
        new = [np.asarray(token)]
        prefill_seconds = time.perf_counter() - first
        if on_prefilled:
            on_prefilled(prefill_seconds)
        if on_tokens:
            on_tokens(new[-1])
        decode_seconds, timed_steps = 0.0, 0
        stopped = new[-1] == stop_token
        for index in range(1, max_new_tokens):
            if stopped.all():
                break
            start = time.perf_counter()
            token, caches, live, compiled = self.step(token, caches, live,
                                                      jax.random.fold_in(key, index))
            if not compiled:
                decode_seconds += time.perf_counter() - start
                timed_steps += 1
            new.append(token)
            stopped |= token == stop_token
            if on_tokens:
                on_tokens(token)
        capacities, live_keys, attention_index = [], [], 0
        for cache in caches:
            slot_cache = mixers.slot_cache(cache)
            capacities.append(None if slot_cache is None else slot_cache.capacity)
            live_keys.append(None if slot_cache is None else int(live[attention_index]))
            attention_index += slot_cache is not None
        return Generation(tokens=np.stack(new, axis=1), prompt_length=np.shape(prompt)[1],
                          prefill_seconds=prefill_seconds, decode_seconds=decode_seconds,
                          timed_steps=timed_steps, wall_seconds=time.perf_counter() - first,
                          capacities=capacities, live_keys=live_keys)
