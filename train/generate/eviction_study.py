"""The loss of evicting keys: the model's forward with every attention layer's keys masked the
way a decoding cache would drop them (a study for small batches, up to long contexts).

    full    every causal key of the same document
    evict   keys with b_ts >= evict_below, in the layers that evict (fpa_jax/decode/layers.py
            `eviction`): since the bias never rises, this is exactly the set a decoding cache
            still holds at t, so the logits equal decoding with eviction, token by token
    window  the last `window` keys (t - s < window) in every attention layer

per attention layer and head:  logits_ts = scale <q_t, k_s> + b_ts  where kept, -inf elsewhere,
one head at a time and one block of Bq = min(block, T) queries t0 <= t < t0 + Bq at a time
(lax.scan), so the largest arrays are [B, Bq, T]: O(T * block) memory, never [B, T, T].

    FPA range minimum   R_ts = min_{s<u<=t} phi_u = min(E_s, P_t)          for s < t0
                        E_s  = min_{s<u<t0} phi_u   [B, T], carried from block to block
                               (the previous block's last row of R)
                        P_t  = min_{t0<=u<=t} phi_u [B, Bq], the block's prefix minimum
                        t0 <= s < t: a [Bq, Bq] cumulative minimum inside the block
                        b_ts = beta min(0, R_ts - psi_s)   (psi_t with query levels), b_tt = 0
    FPA dip sum         b_ts = beta (D_s + sum_{t0<=u<=t, u>s} min(0, phi_u - psi_s))
                        D_s  = sum_{s<u<t0} min(0, phi_u - psi_s)  [B, T], carried
    FoX, ALiBi          b_ts = c_t - c_s,  c = cumsum of the per-token increments
    others              b_ts = 0

T is padded to a multiple of Bq at the end; padded keys follow every real query, so the causal
mask hides them, and padded query rows are dropped. Pairs across documents hold meaningless
bias values and are masked. Recurrent layers (GatedDeltaNet: `MixerSpec.recurrent`, no
per-token keys) run their parallel forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fpa_jax.decode import layers as attention
from fpa_jax.fpa.decoding import dip_sums_through_block
from fpa_jax.fpa.checks import require_positive_int
from fpa_jax.layers import common
from mixer_core.padding import padded_length
from mixer_core.soft_min import BIG
from train.core.mixers import layer_spec

DEFAULT_BLOCK = 128
MODES = ("full", "evict", "window")


def _range_min_blocks(phi, psi, beta, query_level, block):
    """(E_0 [B, T], step(E, t0) -> (E', b [B, Bq, T])) of FPA's range-minimum bias, one head;
    phi, psi [B, T] (T a multiple of block), beta []."""
    keys = jnp.arange(phi.shape[1])
    later = jnp.arange(block)[:, None] > jnp.arange(block)[None, :]           # [t, s]: t > s

    def step(earlier_min, t0):
        phi_q = lax.dynamic_slice_in_dim(phi, t0, block, axis=1)              # [B, Bq]
        across = jnp.minimum(earlier_min[:, None, :], lax.cummin(phi_q, axis=1)[:, :, None])
        inside = lax.cummin(jnp.where(later, phi_q[:, :, None], BIG), axis=1)  # [B, Bq, Bq]
        range_min = lax.dynamic_update_slice_in_dim(across, inside, t0, axis=2)
        queries = t0 + jnp.arange(block)
        past = keys[None, :] < queries[:, None]                               # [Bq, T]: s < t
        if query_level:
            level = lax.dynamic_slice_in_dim(psi, t0, block, axis=1)[:, :, None]
        else:
            level = psi[:, None, :]
        bias = beta * jnp.minimum(0.0, jnp.where(past, range_min - level, 0.0))
        # E_s of the next block (read only for its s < t0): the last query's range minimum
        return range_min[:, -1], bias

    return jnp.full(phi.shape, BIG, jnp.float32), step


def _dip_sum_blocks(phi, psi, beta, block):
    """(D_0 [B, T], step(D, t0) -> (D', b [B, Bq, T])) of FPA's dip-sum bias, one head."""

    def step(dip_total, t0):
        phi_q = lax.dynamic_slice_in_dim(phi, t0, block, axis=1)              # [B, Bq] (u)
        sums = dip_sums_through_block(dip_total, phi_q, t0, psi)              # [B, Bq(t), T]
        return sums[:, -1], beta * sums

    return jnp.zeros(phi.shape, jnp.float32), step


def _additive_blocks(total, block):
    """(None, step(None, t0) -> (None, b [B, Bq, T] = c_t - c_s)) from c = total [B, T]."""

    def step(carry, t0):
        return carry, lax.dynamic_slice_in_dim(total, t0, block, axis=1)[:, :, None] \
            - total[:, None, :]

    return None, step


def _head_bias(layer, params, x, padding, block):
    """Per-head bias of an attention layer: (inputs [H, ...], blocks(*inputs_h) -> (carry,
    step)), or None for a layer without a bias (softmax RoPE/NoPE). Per-token arrays are padded
    by `padding` positions at the end."""
    pad = lambda z: jnp.pad(z, ((0, 0), (0, padding), (0, 0)))               # noqa: E731
    if attention.is_fpa_bias(layer):
        delta, g, h = attention.fpa_scalars(layer, params, x)
        walk = jnp.cumsum(delta, axis=1)
        beta = jax.nn.softplus(params["rho"].astype(jnp.float32))
        inputs = (jnp.moveaxis(pad(walk + g), 2, 0), jnp.moveaxis(pad(walk + h), 2, 0), beta)

        def blocks(phi, psi, beta):
            if layer.dip_sum:
                return _dip_sum_blocks(phi, psi, beta, block)
            return _range_min_blocks(phi, psi, beta, layer.query_level, block)

        return inputs, blocks
    increments = attention.additive_increments(layer, params, x)
    if increments is None:
        return None
    total = jnp.moveaxis(pad(jnp.cumsum(increments, axis=1)), 2, 0)          # [H, B, T]
    return (total,), lambda c: _additive_blocks(c, block)


def _check(mode, window, block):
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    require_positive_int("block", block)
    if mode == "window":
        require_positive_int("window", window)


def masked_attention(layer, params, x, segment_ids, mode, evict_below, window, *,
                     block=DEFAULT_BLOCK):
    """The layer's output with `mode` in {"full", "evict", "window"} applied to its keys, and
    (kept, causal) key counts summed over heads, [B, T] each; blocks of `block` queries."""
    _check(mode, window, block)
    batch, length = x.shape[:2]
    block = min(block, length)
    padded = padded_length(length, block)
    padding = padded - length
    q, k, v = attention.qkv(layer, params, x)
    positions = common.positions_within_segments(segment_ids, batch, length)
    q, k = attention.rope(layer, q, positions), attention.rope(layer, k, positions)
    documents = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids
    documents = jnp.pad(documents, ((0, 0), (0, padding)), constant_values=-1)
    threshold = attention.eviction(layer, evict_below) if mode == "evict" else None
    builder = _head_bias(layer, params, x, padding, block)
    scale = common.attention_scale(layer.head_dim)
    keys = jnp.arange(padded)

    def one_head(inputs):
        q_h, k_h, v_h, bias_inputs = inputs                                   # [B, T, ...]
        carry, bias_step = (None, None) if builder is None else builder[1](*bias_inputs)

        def one_block(carry, t0):
            queries = t0 + jnp.arange(block)
            if bias_step is None:
                bias = jnp.zeros((batch, block, padded), jnp.float32)
            else:
                carry, bias = bias_step(carry, t0)
            same = lax.dynamic_slice_in_dim(documents, t0, block, axis=1)[:, :, None] \
                == documents[:, None, :]
            valid = same & (keys[None, :] <= queries[:, None])               # [B, Bq, T]
            keep = valid
            if threshold is not None:
                keep = keep & (bias >= threshold)
            if mode == "window":
                keep = keep & (queries[:, None] - keys[None, :] < window)
            q_block = lax.dynamic_slice_in_dim(q_h, t0, block, axis=1)
            logits = bias + scale * jnp.einsum("btd,bsd->bts", q_block, k_h,
                                               preferred_element_type=jnp.float32)
            weights = jax.nn.softmax(jnp.where(keep, logits, -jnp.inf), axis=-1)
            out = jnp.einsum("bts,bsd->btd", weights, v_h.astype(jnp.float32))
            return carry, (out.astype(v_h.dtype), keep.sum(-1), valid.sum(-1))

        _, blocks = lax.scan(one_block, carry, jnp.arange(0, padded, block))
        # [n, B, Bq, ...] -> [B, T, ...] without the padded query rows
        return [jnp.moveaxis(z, 0, 1).reshape(batch, padded, *z.shape[3:])[:, :length]
                for z in blocks]

    heads_first = [jnp.moveaxis(jnp.pad(z, ((0, 0), (0, padding), (0, 0), (0, 0))), 2, 0)
                   for z in (q, k, v)]
    bias_inputs = () if builder is None else builder[0]
    out, kept, causal = lax.map(one_head, (*heads_first, bias_inputs))
    return attention.output(layer, params, jnp.moveaxis(out, 0, 2)), (kept.sum(0), causal.sum(0))


def masked_logits(decoder, params, tokens, segment_ids, mode, evict_below, window, *,
                  block=DEFAULT_BLOCK):
    """(logits [B, T, V], (kept, causal) counts [B, T] of each evicting layer)."""
    config = decoder.model.config

    def mixer_call(index, mixer, mixer_params, h):
        if layer_spec(config, index).recurrent:         # no keys to mask: its parallel forward
            return mixer.apply({"params": mixer_params}, h, segment_ids=segment_ids), None
        y, counts = masked_attention(mixer, mixer_params, h, segment_ids, mode, evict_below,
                                     window, block=block)
        return y, counts if attention.eviction(mixer, evict_below) is not None else None

    logits, counts = decoder.run(params, tokens, mixer_call)
    return logits, [c for c in counts if c is not None]


def masked_loss(decoder, params, tokens, segment_ids, mode, evict_below, window, *,
                block=DEFAULT_BLOCK):
    """(mean next-token loss in nats over same-document targets, counts as masked_logits);
    segment_ids None: one document per row."""
    if segment_ids is None:
        segment_ids = jnp.ones_like(tokens)
    logits, counts = masked_logits(decoder, params, tokens, segment_ids, mode, evict_below,
                                   window, block=block)
    log_probs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)[..., 0]
    same = (segment_ids[:, 1:] == segment_ids[:, :-1]).astype(jnp.float32)
    return (nll * same).sum() / jnp.maximum(same.sum(), 1.0), counts
