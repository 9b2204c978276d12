"""Decoder-only language model: embeddings, pre-norm blocks, final norm, (tied) output head.

    tokens, segment_ids [B, T] int32
    x_0     = E[tokens]                                          [B, T, D]      E [V, D]
    per layer l (mixer_l from the tiled pattern: A = attention variant, G = GatedDeltaNet):
      x    <- x + mixer_l(RMSNorm(x), segment_ids=segment_ids, positions=positions)
      x    <- x + W_down (silu(RMSNorm(x) W_gate) * (RMSNorm(x) W_up))     W_gate, W_up [D, F]
              (or, with model.moe_experts > 0, a top-k mixture of such FFNs: train/core/moe.py)
    logits  = RMSNorm(x) E^T  (tied)  or  RMSNorm(x) W_out       float32 [B, T, V]

RMSNorm(x) = x / sqrt(mean(x^2) + eps) * scale. positions restart at 0 at every document start.
Parameter logical axes: E ("vocab", "embed"); W_gate/W_up ("embed", "mlp"); W_down ("mlp",
"embed"); W_out ("embed", "vocab"); norm scales ("embed",); mixers name their own.
Activations are constrained to ("batch", "length", "embed") between blocks and logits to
("batch", "length", "vocab"); the rules table in train/core/sharding.py maps these to the mesh.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fpa_jax import layers
from train.core.config import Config
from train.core.mixers import layer_spec
from train.core.moe import AUX_COLLECTION, MoEFeedForward
from train.core.sharding import activation_rules

ACTIVATION_AXES = ("batch", "length", "embed")
LOGIT_AXES = ("batch", "length", "vocab")


def constrain(x: jax.Array, logical_axes: tuple[str, ...]) -> jax.Array:
    """Sharding constraint by logical axis names (a no-op outside a mesh context).

    The rules are passed explicitly rather than installed globally: with global rules, Flax
    re-applies each param's logical constraint inside its shape check, which breaks
    DenseGeneral kernels (initialised flat, then reshaped). With a "context" mesh axis the
    rules split "length" over it (`activation_rules`).
    """
    return nn.with_logical_constraint(x, logical_axes, rules=activation_rules())


def dtype_of(name: str) -> Any:
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def positions_within_documents(segment_ids: jax.Array) -> jax.Array:
    """[B, T] int32 positions 0, 1, 2, ... restarting wherever segment_ids changes."""
    return layers.positions_within_segments(segment_ids, *segment_ids.shape)


def build_mixer(config: Config, layer_index: int, name: str | None) -> nn.Module:
    """The sequence mixer of layer `layer_index`, built by its kind's spec (train/core/mixers.py).

    Every mixer is called as mixer(x, *, segment_ids, positions) and names the op it calls
    (`op_name`), whose registry checks its `implementation`.
    """
    return layer_spec(config, layer_index).build(
        config, layer_index, name=name, dtype=dtype_of(config.model.dtype),
        param_dtype=dtype_of(config.model.param_dtype))


def rms_norm(eps: float, dtype: Any, param_dtype: Any, name: str) -> nn.RMSNorm:
    """Flax's RMSNorm (float32 statistics) with its scale on the logical axis "embed"."""
    return nn.RMSNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))


class SwiGLU(nn.Module):
    hidden_dim: int
    init_std: float
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        def dense(features, axes, name, std):
            return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                            kernel_init=nn.with_logical_partitioning(
                                nn.initializers.normal(std), axes), name=name)

        gate = dense(self.hidden_dim, ("embed", "mlp"), "gate", self.init_std)(x)
        up = dense(self.hidden_dim, ("embed", "mlp"), "up", self.init_std)(x)
        hidden = constrain(nn.silu(gate) * up, ("batch", "length", "mlp"))
        return dense(x.shape[-1], ("mlp", "embed"), "down", self.init_std)(hidden)


class Block(nn.Module):
    config: Config
    layer_index: int

    @nn.compact
    def __call__(self, x, segment_ids, positions):
        m = self.config.model
        dtype, param_dtype = dtype_of(m.dtype), dtype_of(m.param_dtype)
        mixer = build_mixer(self.config, self.layer_index, name="mixer")
        h = rms_norm(m.norm_eps, dtype, param_dtype, name="mixer_norm")(x)
        h = mixer(h, segment_ids=segment_ids, positions=positions)
        x = constrain(x + h.astype(x.dtype), ACTIVATION_AXES)
        h = rms_norm(m.norm_eps, dtype, param_dtype, name="mlp_norm")(x)
        if m.moe_experts:
            h = MoEFeedForward(m.moe_experts, m.moe_top_k,
                               m.moe_expert_dim or self.config.mlp_dim(), m.moe_capacity_factor,
                               m.moe_aux_loss_coef, m.init_std, dtype, param_dtype, name="moe")(h)
        else:
            h = SwiGLU(self.config.mlp_dim(), m.init_std, dtype, param_dtype, name="mlp")(h)
        return constrain(x + h.astype(x.dtype), ACTIVATION_AXES)


class LanguageModel(nn.Module):
    """tokens, segment_ids [B, T] -> float32 logits [B, T, vocab_size] (vocab_size resolved)."""

    config: Config
    vocab_size: int

    @nn.compact
    def __call__(self, tokens: jax.Array, segment_ids: jax.Array) -> jax.Array:
        if tokens.ndim != 2 or segment_ids.shape != tokens.shape:
            raise ValueError(f"LanguageModel: tokens and segment_ids must both be [B, T], got "
                             f"{tokens.shape} and {segment_ids.shape}")
        if not (jnp.issubdtype(tokens.dtype, jnp.integer)
                and jnp.issubdtype(segment_ids.dtype, jnp.integer)):
            raise TypeError(f"LanguageModel: tokens and segment_ids must be integer, got "
                            f"{tokens.dtype} and {segment_ids.dtype}")
        m = self.config.model
        dtype, param_dtype = dtype_of(m.dtype), dtype_of(m.param_dtype)
        embedding = nn.Embed(self.vocab_size, m.d_model, dtype=dtype, param_dtype=param_dtype,
                             embedding_init=nn.with_logical_partitioning(
                                 nn.initializers.normal(m.init_std), ("vocab", "embed")),
                             name="embed")
        x = constrain(embedding(tokens), ACTIVATION_AXES)
        positions = positions_within_documents(segment_ids)
        block_class = nn.remat(Block) if m.remat else Block
        if m.scan_layers and not self.is_initializing():
            x = self._scanned_blocks(x, segment_ids, positions)
        else:
            for index in range(m.num_layers):
                x = block_class(self.config, index, name=f"layers_{index}")(x, segment_ids,
                                                                            positions)
        x = rms_norm(m.norm_eps, dtype, param_dtype, name="final_norm")(x)
        if m.tie_embeddings:
            logits = embedding.attend(x)
        else:
            logits = nn.Dense(self.vocab_size, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                              kernel_init=nn.with_logical_partitioning(
                                  nn.initializers.normal(m.init_std), ("embed", "vocab")),
                              name="lm_head")(x)
        return constrain(logits.astype(jnp.float32), LOGIT_AXES)


    def _scanned_blocks(self, x, segment_ids, positions):
        """The blocks as one `lax.scan` over the pattern's repeats (model.scan_layers): each
        step applies one period of the pattern (len(model.pattern) blocks) with that repeat's
        parameters, stacked from the usual per-layer tree `layers_{i}`, so XLA compiles one
        period's program however deep the model is. The same function as the loop (no
        attention.no_bias_layers: every repeat must build the same blocks); MoE layers' sown
        auxiliary terms are summed over the repeats and sown once."""
        m = self.config.model
        period = len(m.pattern)
        blocks = [Block(self.config, j) for j in range(period)]
        params = self.variables["params"]
        stacked = [jax.tree.map(lambda *leaves: jnp.stack(leaves),
                                *(params[f"layers_{r * period + j}"]
                                  for r in range(m.num_layers // period)))
                   for j in range(period)]

        def one_period(carry, period_params):
            x, aux = carry
            for block, block_params in zip(blocks, period_params):
                x, state = block.apply({"params": block_params}, x, segment_ids, positions,
                                       mutable=[AUX_COLLECTION])
                aux = aux + sum(jax.tree.leaves(state.get(AUX_COLLECTION, {})), jnp.float32(0))
            return (x, aux), None

        step = jax.checkpoint(one_period) if m.remat else one_period
        aux = jnp.zeros(segment_ids.shape, jnp.float32)
        (x, aux), _ = jax.lax.scan(step, (x, aux), stacked)
        if m.moe_experts:
            self.sow(AUX_COLLECTION, "load_balancing", aux)
        return x


def resolve_vocab_size(config: Config, tokenizer_vocab_size: int) -> int:
    """The model's vocabulary: model.vocab_size or the tokenizer's, padded to vocab_multiple."""
    size = config.model.vocab_size or tokenizer_vocab_size
    if size < tokenizer_vocab_size:
        raise ValueError(f"model.vocab_size={size} is smaller than the tokenizer's vocabulary "
                         f"({tokenizer_vocab_size})")
    multiple = config.model.vocab_multiple
    return -(-size // multiple) * multiple


def build_model(config: Config, tokenizer_vocab_size: int) -> LanguageModel:
    return LanguageModel(config, resolve_vocab_size(config, tokenizer_vocab_size))


def count_params(params: Any) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))
