"""DCP-style attention (Dynamic Context Pruning, Anagnostidis et al., 2023): layer-shared masks.

Each later token u votes, with probability sigmoid(mask_logits_us), to KEEP an earlier key s;
a key stays visible to query t only if every token after it up to t kept it:

    I_ts     = prod_{s < u <= t} sigmoid(mask_logits_us)          (I_tt = 1, empty product)
    M_ts     = log I_ts = sum_{s < u <= t} log_sigmoid(mask_logits_us)      float32, <= 0
    logit_ts = scale * <q_t, k_s> + M_ts      for every head (one mask per layer)
    out_t    = causal, same-document softmax_s(logit_t.) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; mask_logits [B, T(u), T(s)] float (entries with s >= u
    are ignored); segment_ids [B, T] int -> out [B, T, H, Dv] in q's dtype.

Why the cumulative form rather than a per-pair mask log sigmoid(mask_logits_ts): it is DCP's
own rule (a dropped token stays dropped, which is what lets DCP evict it from the cache), and
it makes DCP a layer-shared path-accumulated bias, directly comparable with FoX (per-head path
sum) and FPA (per-head path minimum). DCP's sparse alpha-sigmoid is replaced by the plain
sigmoid (alpha = 1), which keeps the gradient dense; the caller builds mask_logits (DCP: from
low-dimensional interaction queries and keys plus a per-layer offset).

Dense-only by design (M is a [B, T, T] float32 tensor: small T): `REGISTRY` (op name
"dcp_attention") has the single entry "reference", which is also its default order, so
implementation=None and "reference" are the only accepted values; the entry is
`fn(q, k, v, mask_logits, segment_ids, *, scale) -> out` (docs/api.md, "Dispatch").
"""

import jax
import jax.numpy as jnp

from fpa_jax.baselines import flash_xla
from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import checks
from mixer_core.registry import Entry, Registry


def keep_log_mask(mask_logits):
    """M [B, T(t), T(s)] float32 = sum_{s < u <= t} log_sigmoid(mask_logits_us)."""
    length = mask_logits.shape[1]
    positions = jnp.arange(length)
    later = positions[:, None] > positions[None, :]  # [u, s]: u > s
    log_keep = jnp.where(later, jax.nn.log_sigmoid(mask_logits.astype(jnp.float32)), 0.0)
    return jnp.cumsum(log_keep, axis=1)


def _reference(q, k, v, mask_logits, segment_ids, *, scale):
    out, _ = flash_xla.dense_attention(q, k, v, keep_log_mask(mask_logits)[:, None], scale=scale,
                                       segment_ids=segment_ids)
    return out


REGISTRY = Registry("dcp_attention", default_order=("reference",), entries=(
    Entry("reference", _reference),
))


def dcp_attention(q, k, v, mask_logits, *, scale=None, segment_ids=None, implementation=None):
    """DCP-style attention (dense reference) -> out [B, T, H, Dv] (q's dtype)."""
    batch, length, _, head_dim = flash_xla.check_qkv(q, k, v)
    checks.require_shape("mask_logits", mask_logits, (batch, length, length))
    checks.require_float("mask_logits", mask_logits)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = flash_xla.resolve_scale(scale, head_dim)
    _, fn = REGISTRY.select(implementation, **attention_facts(q, v, segment_ids))
    return fn(q, k, v, mask_logits, segment_ids, scale=scale)
