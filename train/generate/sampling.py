"""Next-token sampling from logits [B, V]: temperature, top-k, top-p (nucleus), greedy.

    ids >= vocab_size (the model's padded vocabulary) never win
    temperature 0         argmax (greedy, deterministic)
    otherwise             z = logits / temperature
      top_k = K > 0       keep the K largest z (ties at the K-th value kept)
      top_p = P < 1       keep the smallest set of largest z whose probability reaches P
                          (the most likely token always kept)
      token ~ softmax(z over the kept ids)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_k: int = 0          # 0: no top-k cut
    top_p: float = 1.0      # 1: no nucleus cut

    def __post_init__(self):
        if not (self.temperature >= 0 and self.temperature != float("inf")):
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k: expected an int >= 0, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p}")


def sample(logits: jax.Array, key: jax.Array, config: SamplingConfig,
           vocab_size: int) -> jax.Array:
    """logits [B, V] -> token ids [B] int32 (config is static under jit)."""
    valid = jnp.arange(logits.shape[-1]) < vocab_size
    logits = jnp.where(valid, logits.astype(jnp.float32), -jnp.inf)
    if config.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    z = logits / config.temperature
    if config.top_k or config.top_p < 1.0:
        ordered = jnp.sort(z, axis=-1)[:, ::-1]                        # descending
        cutoff = jnp.full(z.shape[:1], -jnp.inf)
        if config.top_k:
            cutoff = ordered[:, min(config.top_k, z.shape[-1]) - 1]
        if config.top_p < 1.0:
            probabilities = jax.nn.softmax(ordered, axis=-1)
            before = jnp.cumsum(probabilities, axis=-1) - probabilities  # mass of larger ones
            kept = jnp.where(before < config.top_p, ordered, jnp.inf)
            cutoff = jnp.maximum(cutoff, kept.min(axis=-1))
        z = jnp.where(z >= cutoff[:, None], z, -jnp.inf)
    return jax.random.categorical(key, z, axis=-1).astype(jnp.int32)
