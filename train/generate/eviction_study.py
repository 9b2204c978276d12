"""The loss of evicting keys, measured densely: the model's forward with every attention
layer's keys masked the way a decoding cache would drop them (a study for small batches).

    full    every causal key of the same document
    evict   keys with b_ts >= evict_below, in the layers that evict (fpa_jax/decode/layers.py
            `eviction`): since the bias never rises, this is exactly the set a decoding cache
            still holds at t, so the logits equal decoding with eviction, token by token
    window  the last `window` keys (t - s < window) in every attention layer

per attention layer and head:  logits_ts = scale <q_t, k_s> + b_ts  where kept, -inf elsewhere
(one head at a time, [B, T, T] each; FPA's range minimum as a cumulative minimum over t).
GatedDeltaNet layers run their parallel forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fpa_jax.baselines.dipsum import dip_sum_bias
from fpa_jax.decode import layers as attention
from fpa_jax.fpa.blocks import BIG
from fpa_jax.fpa.reference import pair_mask
from fpa_jax.layers import common
from gdn_jax.layer import GatedDeltaNet


def _range_min_bias(phi, psi, beta, query_level):
    """One head's b [B, T(t), T(s)] = beta * min(0, min_{s<u<=t} phi_u - psi_s (psi_t)), 0 for
    s >= t; phi, psi [B, T]. A cumulative minimum over t (parallel on a GPU); pairs across
    documents hold meaningless values and are masked by the caller."""
    length = phi.shape[1]
    later = jnp.arange(length)[:, None] > jnp.arange(length)[None, :]    # [t, s]: t > s
    range_min = lax.cummin(jnp.where(later, phi[:, :, None], BIG), axis=1)
    level = psi[:, :, None] if query_level else psi[:, None, :]
    return beta * jnp.minimum(0.0, jnp.where(later, range_min - level, 0.0))


def _head_bias(layer, params, x, segment_ids):
    """Per-head bias builder of an attention layer: (inputs [H, ...], fn(inputs_h) -> [B, T, T])
    or None for a layer without a bias (softmax RoPE/NoPE)."""
    if attention.is_fpa_bias(layer):
        delta, g, h = attention.fpa_scalars(layer, params, x)
        walk = jnp.cumsum(delta, axis=1)
        beta = jax.nn.softplus(params["rho"].astype(jnp.float32))
        inputs = (jnp.moveaxis(walk + g, 2, 0), jnp.moveaxis(walk + h, 2, 0), beta)

        def build(phi, psi, beta):
            if layer.dip_sum:
                return dip_sum_bias(phi[..., None], psi[..., None], beta[None])[:, 0]
            return _range_min_bias(phi, psi, beta, layer.query_level)

        return inputs, build
    increments = attention.additive_increments(layer, params, x)
    if increments is None:
        return None
    total = jnp.moveaxis(jnp.cumsum(increments, axis=1), 2, 0)          # [H, B, T]
    return (total,), lambda c: c[:, :, None] - c[:, None, :]


def masked_attention(layer, params, x, segment_ids, mode, evict_below, window):
    """The layer's output with `mode` in {"full", "evict", "window"} applied to its keys, and
    (kept, causal) key counts summed over heads, [B, T] each (dense per head: a study)."""
    batch, length = x.shape[:2]
    q, k, v = attention.qkv(layer, params, x)
    positions = common.positions_within_segments(segment_ids, batch, length)
    q, k = attention.rope(layer, q, positions), attention.rope(layer, k, positions)
    valid = pair_mask(segment_ids, length)[:, 0]                         # [B, T, T]
    threshold = attention.eviction(layer, evict_below) if mode == "evict" else None
    distance = jnp.arange(length)[:, None] - jnp.arange(length)[None, :]
    builder = _head_bias(layer, params, x, segment_ids)
    scale = common.attention_scale(layer.head_dim)

    def one_head(inputs):
        q_h, k_h, v_h, bias_inputs = inputs
        bias = jnp.zeros(valid.shape) if builder is None else builder[1](*bias_inputs)
        keep = valid
        if threshold is not None:
            keep = keep & (bias >= threshold)
        if mode == "window":
            keep = keep & (distance < window)
        logits = bias + scale * jnp.einsum("btd,bsd->bts", q_h, k_h,
                                           preferred_element_type=jnp.float32)
        weights = jax.nn.softmax(jnp.where(keep, logits, -jnp.inf), axis=-1)
        out = jnp.einsum("bts,bsd->btd", weights, v_h.astype(jnp.float32)).astype(v_h.dtype)
        return out, keep.sum(-1), valid.sum(-1)

    heads_first = [jnp.moveaxis(z, 2, 0) for z in (q, k, v)]
    bias_inputs = () if builder is None else builder[0]
    out, kept, causal = jax.lax.map(one_head, (*heads_first, bias_inputs))
    return attention.output(layer, params, jnp.moveaxis(out, 0, 2)), (kept.sum(0), causal.sum(0))


def masked_logits(decoder, params, tokens, segment_ids, mode, evict_below, window):
    """(logits [B, T, V], (kept, causal) counts [B, T] of each evicting layer)."""

    def mixer_call(index, mixer, mixer_params, h):
        if isinstance(mixer, GatedDeltaNet):
            return mixer.apply({"params": mixer_params}, h, segment_ids=segment_ids), None
        y, counts = masked_attention(mixer, mixer_params, h, segment_ids, mode, evict_below,
                                     window)
        return y, counts if attention.eviction(mixer, evict_below) is not None else None

    logits, counts = decoder.run(params, tokens, mixer_call)
    return logits, [c for c in counts if c is not None]


def masked_loss(decoder, params, tokens, segment_ids, mode, evict_below, window):
    """(mean next-token loss in nats over same-document targets, counts as masked_logits)."""
    logits, counts = masked_logits(decoder, params, tokens, segment_ids, mode, evict_below,
                                   window)
    log_probs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)[..., 0]
    same = (segment_ids[:, 1:] == segment_ids[:, :-1]).astype(jnp.float32)
    return (nll * same).sum() / jnp.maximum(same.sum(), 1.0), counts
