"""The language model (train/core/model.py) as prefill + one-token decode step with per-layer caches.

    prefill(params, tokens [B, T])    -> (logits float32 [B, T, V], caches)
    step(params, tokens_t [B], caches) -> (logits float32 [B, V], caches)

Both run the model's blocks with its own submodules' math, layer by layer:

    x = E[tokens];  per layer l:  x += mixer_l(RMSNorm(x));  x += SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) E^T (tied) or RMSNorm(x) W_out

where mixer_l is the layer's parallel forward in prefill (filling its cache) and its one-token
step in `step` (its kind's decoding, train/generate/mixers.py). caches: a tuple, one cache
per layer. Both functions are pure (jit them; `evict_below` is fixed per Decoder, so shapes
stay static). One document per row: positions 0, 1, 2, ... from the first prompt token.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from train.core.model import LanguageModel, SwiGLU, build_mixer, dtype_of, rms_norm
from train.generate import mixers


class Decoder:
    """Prefill and decode step of `model` (a LanguageModel); evict_below: float or None."""

    def __init__(self, model: LanguageModel, evict_below: float | None = -10.0):
        self.model = model
        self.evict_below = evict_below
        config = model.config
        self.mixers = [build_mixer(config, index, name=None)
                       for index in range(config.model.num_layers)]
        self.decodings = [mixers.decoding(config, index, mixer)
                          for index, mixer in enumerate(self.mixers)]
        m = config.model
        self._dtype, self._param_dtype = dtype_of(m.dtype), dtype_of(m.param_dtype)
        self._norm = rms_norm(m.norm_eps, self._dtype, self._param_dtype, name=None)
        self._mlp = SwiGLU(config.mlp_dim(), m.init_std, self._dtype, self._param_dtype)
        self._embed = nn.Embed(model.vocab_size, m.d_model, dtype=self._dtype,
                               param_dtype=self._param_dtype)

    def _embed_tokens(self, params, tokens):
        return self._embed.apply({"params": params["embed"]}, tokens)

    def _logits(self, params, x):
        x = self._norm.apply({"params": params["final_norm"]}, x)
        if self.model.config.model.tie_embeddings:
            logits = self._embed.apply({"params": params["embed"]}, x, method="attend")
        else:
            kernel = params["lm_head"]["kernel"]
            logits = jnp.dot(x.astype(self._dtype), kernel.astype(self._dtype))
        return logits.astype(jnp.float32)

    def _mlp_residual(self, block, x):
        h = self._norm.apply({"params": block["mlp_norm"]}, x)
        return x + self._mlp.apply({"params": block["mlp"]}, h).astype(x.dtype)

    def run(self, params: Any, tokens: jax.Array, mixer_call):
        """The blocks around each layer's mixer_call(index, mixer, mixer_params, h) -> (y, extra)
        on tokens [B, T] or [B]; returns (logits float32 [..., V], tuple of the extras)."""
        params = nn.meta.unbox(params)
        x = self._embed_tokens(params, tokens)
        extras = []
        for index, mixer in enumerate(self.mixers):
            block = params[f"layers_{index}"]
            h = self._norm.apply({"params": block["mixer_norm"]}, x)
            h, extra = mixer_call(index, mixer, block["mixer"], h)
            x = self._mlp_residual(block, x + h.astype(x.dtype))
            extras.append(extra)
        return self._logits(params, x), tuple(extras)

    def prefill(self, params: Any, tokens: jax.Array):
        """tokens [B, T] int -> (logits [B, T, V] float32, caches)."""
        return self.run(params, tokens, lambda index, mixer, p, h: self.decodings[
            index].prefill(mixer, p, h, evict_below=self.evict_below))

    def step(self, params: Any, tokens_t: jax.Array, caches: tuple):
        """tokens_t [B] int -> (logits [B, V] float32, caches)."""
        return self.run(params, tokens_t, lambda index, mixer, p, h: self.decodings[index].step(
            mixer, p, h, caches[index], evict_below=self.evict_below))
