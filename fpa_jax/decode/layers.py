"""Caches and one-token steps of the attention layers (FPAAttention, FoXAttention,
SoftmaxAttention), as pure functions of a layer instance (its fields) and its params.

    prefill(layer, params, x [B, T, D])   -> (y [B, T, D], cache)    y: the layer's own parallel
                                              forward (its op and kernels); cache: its keys,
                                              values and per-key bias state after token T-1
    step(layer, params, x_t [B, D], cache) -> (y_t [B, D], cache)    same math, one token

The step recomputes what the layer's __call__ computes for one position (fpa_jax/layers/):

    q, k, v = x_t W_query, x_t W_key, x_t W_value                     [B, H, head_dim]
    FPA      W_t = W_{t-1} + delta_t;  phi_t = W_t + g_t;  psi_t = W_t + h_t   (walk in the cache)
             -> fpa_jax/fpa/decoding.py (range minimum or dip sum, key or query levels)
    FoX      a_t = log_sigmoid(x_t W_f + b_f)        -> fpa_jax/decode/additive.py
    softmax  RoPE: q, k rotated at position t (= tokens cached so far); ALiBi: a_t = -slope_h;
             NoPE (and FPA with use_bias=False): no bias
    y_t = o_t W_out                                                   [B, D]

Eviction (`evict_below`, a float or None) applies where the bias never rises: FPA with key
levels (range minimum or dip sum) and FoX; `eviction(layer, evict_below)` says what a layer
uses (None elsewhere). One document per sequence: positions 0, 1, 2, ... as in generation.
cache = {"slots": SlotCache} (+ "walk" [B, H] float32 for FPA); slot arrays [B, S, H, ...].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fpa_jax.baselines.rope import alibi_slopes, apply_rope
from fpa_jax.decode import additive, slots
from fpa_jax.fpa import decoding as fpa_decoding
from fpa_jax.layers import common
from fpa_jax.layers.fox import FoXAttention
from fpa_jax.layers.fpa import FPAAttention
from fpa_jax.layers.softmax import SoftmaxAttention

SUPPORTED = (FPAAttention, FoXAttention, SoftmaxAttention)


def check_supported(layer) -> None:
    if not isinstance(layer, SUPPORTED):
        names = ", ".join(cls.__name__ for cls in SUPPORTED)
        raise ValueError(f"decoding: {type(layer).__name__} has no decoding cache "
                         f"(layers with one: {names}, GatedDeltaNet)")
    if getattr(layer, "rope_scaling", None) is not None:
        raise ValueError(f"decoding: {type(layer).__name__} with rope_scaling has no decoding "
                         f"step yet (rope_scaling=None has one)")


def is_fpa_bias(layer) -> bool:
    return isinstance(layer, FPAAttention) and layer.use_bias


def eviction(layer, evict_below):
    """The threshold `layer` evicts at: evict_below where its bias never rises, else None."""
    fpa_decoding.check_eviction(evict_below, query_level=False)
    monotone = isinstance(layer, FoXAttention) or (is_fpa_bias(layer) and not layer.query_level)
    return evict_below if monotone else None


# ---------------------------------------- projections (also used by dense studies of eviction)

def _heads(layer, params, name, x):
    """x [..., D] -> [..., H, head_dim] through kernel [D, H, head_dim] (DenseGeneral's math)."""
    kernel = params[name]["kernel"]
    return jnp.einsum("...d,dhk->...hk", x.astype(layer.dtype), kernel.astype(layer.dtype))


def _scalar_map(params, name, x):
    """x [..., D] -> float32 [..., H] = x W + c (common.per_head_scalar_map's math)."""
    p = params[name]
    return x.astype(jnp.float32) @ p["kernel"].astype(jnp.float32) + p["bias"].astype(jnp.float32)


def output(layer, params, o):
    """o [..., H, head_dim] -> [..., D] through the "out" kernel [H, head_dim, D]."""
    kernel = params["out"]["kernel"]
    return jnp.einsum("...hk,hkd->...d", o.astype(layer.dtype), kernel.astype(layer.dtype))


def fpa_scalars(layer, params, x):
    """(delta, g, h) float32 [..., H] of FPAAttention (zeros where a switch removes a map)."""
    delta = _scalar_map(params, "delta_proj", x)
    zeros = jnp.zeros_like(delta)
    g = zeros if layer.stack_form else _scalar_map(params, "field_proj", x)
    has_level = layer.key_level and not layer.stack_form
    return delta, g, (_scalar_map(params, "level_proj", x) if has_level else zeros)


def qkv(layer, params, x):
    """q, k, v [..., H, head_dim]; FPA with content=False has no q/k: zero-width arrays."""
    v = _heads(layer, params, "value", x)
    if is_fpa_bias(layer) and not layer.content:
        empty = jnp.zeros((*v.shape[:-1], 0), v.dtype)
        return empty, empty, v
    return _heads(layer, params, "query", x), _heads(layer, params, "key", x), v


def rope(layer, x, positions):
    """x [B, T, H, D] rotated at positions [B, T] when the layer uses RoPE, else x."""
    if isinstance(layer, SoftmaxAttention) and layer.position == "rope":
        return apply_rope(x, positions, base=layer.rope_base)
    return x


def additive_increments(layer, params, x):
    """FoX's log forget gates or ALiBi's -slope per token ([..., H] float32), None without."""
    if isinstance(layer, FoXAttention):
        return jax.nn.log_sigmoid(_scalar_map(params, "forget_proj", x))
    if isinstance(layer, SoftmaxAttention) and layer.position == "alibi":
        slopes = alibi_slopes(layer.num_heads)
        return jnp.broadcast_to(-slopes, (*x.shape[:-1], layer.num_heads))
    return None


# ------------------------------------------------------------------------------ the API

def prefill(layer, params, x, *, evict_below=-10.0):
    """x [B, T, D] -> (y [B, T, D] from the layer's parallel forward, cache of T slots)."""
    check_supported(layer)
    evict_below = eviction(layer, evict_below)
    y = layer.apply({"params": params}, x)
    _, k, v = qkv(layer, params, x)
    batch, length = x.shape[:2]
    k = rope(layer, k, jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)))
    if not is_fpa_bias(layer):
        increments = additive_increments(layer, params, x)
        return y, {"slots": additive.prefill_cache(k, v, increments, evict_below=evict_below)}
    delta, g, h = fpa_scalars(layer, params, x)
    walk = jnp.cumsum(delta, axis=1)
    beta = jax.nn.softplus(params["rho"].astype(jnp.float32))
    cache = fpa_decoding.prefill_cache(k, v, walk + g, walk + h, beta, evict_below=evict_below,
                                       query_level=layer.query_level, dip_sum=layer.dip_sum)
    return y, {"slots": cache, "walk": walk[:, -1]}


def step(layer, params, x_t, cache, *, evict_below=-10.0):
    """x_t [B, D], cache -> (y_t [B, D], cache) for one more token."""
    check_supported(layer)
    evict_below = eviction(layer, evict_below)
    q, k, v = qkv(layer, params, x_t)
    position = jnp.broadcast_to(cache["slots"].length, (x_t.shape[0], 1))
    q, k = (rope(layer, z[:, None], position)[:, 0] for z in (q, k))
    scale = common.attention_scale(layer.head_dim)
    if not is_fpa_bias(layer):
        out, cache_slots = additive.decode_step(
            cache["slots"], q, k, v, additive_increments(layer, params, x_t), scale=scale,
            evict_below=evict_below)
        return output(layer, params, out), {"slots": cache_slots}
    delta, g, h = fpa_scalars(layer, params, x_t)
    walk = cache["walk"] + delta
    beta = jax.nn.softplus(params["rho"].astype(jnp.float32))
    out, cache_slots = fpa_decoding.decode_step(
        cache["slots"], q, k, v, walk + g, walk + h, beta, scale=scale, evict_below=evict_below,
        query_level=layer.query_level, content=layer.content, dip_sum=layer.dip_sum)
    return output(layer, params, out), {"slots": cache_slots, "walk": walk}


def resize(cache, capacity: int):
    """The cache with `capacity` slots (live keys kept, compacted); outside jit."""
    return {**cache, "slots": slots.resize(cache["slots"], capacity)}
