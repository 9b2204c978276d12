"""The decoding of each layer's token mixer, from its kind's spec (train/core/mixers.py).

    decoding(config, layer_index, mixer) -> MixerDecoding with
      prefill(mixer, params, x [B, T, D], *, evict_below) -> (y [B, T, D], cache)
      step(mixer, params, x_t [B, D], cache, *, evict_below) -> (y_t [B, D], cache)

Attention layers: fpa_jax/decode/layers.py (slot caches, eviction). GatedDeltaNet: its own
`prefill` (chunked parallel form, final state and conv histories) and recurrent `step`.
"""

from __future__ import annotations

from fpa_jax.decode import slots
from train.core.config import Config
from train.core.mixers import MIXERS, MixerDecoding, layer_kinds


def decoding(config: Config, layer_index: int, mixer) -> MixerDecoding:
    """The prefill and step of layer `layer_index`'s `mixer`; ValueError up front for a kind
    without a decoding cache or a layer its kind cannot step."""
    kind = layer_kinds(config)[layer_index]
    found = MIXERS[kind].decoding
    if found is None:
        with_one = ", ".join(name for name, spec in MIXERS.items() if spec.decoding is not None)
        raise ValueError(f"decoding: {type(mixer).__name__} (kind {kind!r}) has no decoding "
                         f"cache (kinds with one: {with_one})")
    found.check(mixer)
    return found


def slot_cache(cache) -> slots.SlotCache | None:
    """The slot cache of an attention mixer's cache, None for GatedDeltaNet's."""
    return cache.get("slots")
