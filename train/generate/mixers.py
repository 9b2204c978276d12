"""Prefill and one-token step of any token mixer of the language model (attention or GDN).

    prefill(mixer, params, x [B, T, D], evict_below) -> (y [B, T, D], cache)
    step(mixer, params, x_t [B, D], cache, evict_below) -> (y_t [B, D], cache)

Attention layers: fpa_jax/decode/layers.py (slot caches, eviction). GatedDeltaNet: the cache
of `GatedDeltaNet.init_cache` (conv histories [B, conv_size - 1, C], state [B, HV, K, V]),
filled by the chunked parallel form with its final state, then stepped by the layer's own
recurrent `step`:

    q, k, v = conv(x W_q), conv(x W_k), conv(x W_v);  o, S_T = gated_delta_rule(..., S_0 = 0)
    conv history = the last conv_size - 1 pre-convolution inputs (zeros before t = 0)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fpa_jax.decode import layers as attention_decoding
from fpa_jax.decode import slots
from gdn_jax.layer import GatedDeltaNet
from gdn_jax.ops.api import gated_delta_rule
from gdn_jax.ops.short_conv import l2_normalize


def _history(inputs: jax.Array, size: int) -> jax.Array:
    """The last `size` rows of inputs [B, T, C] along T, zero-padded in front when T < size."""
    padded = jnp.pad(inputs, ((0, 0), (max(size - inputs.shape[1], 0), 0), (0, 0)))
    return padded[:, padded.shape[1] - size:]


def _gdn_prefill(layer: GatedDeltaNet, x: jax.Array):
    """Bound GatedDeltaNet: its parallel forward on x [B, T, D] plus the decoding cache."""
    x = x.astype(layer.dtype)
    projected = {"q_conv": layer.q_proj(x), "k_conv": layer.k_proj(x), "v_conv": layer.v_proj(x)}
    q = l2_normalize(layer._split_heads(layer.q_conv(projected["q_conv"]), layer.num_heads,
                                        layer.head_dim))
    k = l2_normalize(layer._split_heads(layer.k_conv(projected["k_conv"]), layer.num_heads,
                                        layer.head_dim))
    v = layer._split_heads(layer.v_conv(projected["v_conv"]), layer.value_heads,
                           layer.value_head_dim)
    z = layer._split_heads(layer.z_proj(x), layer.value_heads, layer.value_head_dim)
    g, beta = layer._gates(x)
    o, state = gated_delta_rule(q, k, v, g, beta, chunk_size=layer.chunk_size,
                                output_final_state=True, implementation=layer.implementation)
    cache = layer.init_cache(x.shape[0])
    cache = {name: _history(value, layer.conv_size - 1).astype(cache[name].dtype)
             for name, value in projected.items()} | {"state": state}
    return layer._readout(o, z, x.shape[-1]), cache


def prefill(mixer, params, x, *, evict_below):
    if isinstance(mixer, GatedDeltaNet):
        return mixer.apply({"params": params}, x, method=_gdn_prefill)
    return attention_decoding.prefill(mixer, params, x, evict_below=evict_below)


def step(mixer, params, x_t, cache, *, evict_below):
    if isinstance(mixer, GatedDeltaNet):
        return mixer.apply({"params": params}, x_t, cache, method="step")
    return attention_decoding.step(mixer, params, x_t, cache, evict_below=evict_below)


def check_supported(mixer) -> None:
    if not isinstance(mixer, GatedDeltaNet):
        attention_decoding.check_supported(mixer)


def slot_cache(cache) -> slots.SlotCache | None:
    """The slot cache of an attention mixer's cache, None for GatedDeltaNet's."""
    return cache.get("slots")
