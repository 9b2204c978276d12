"""Selective Attention (Leviathan et al., 2024): a layer-shared, cumulative soft mask.

One head's causal logits (the caller passes them, usually head 0's scaled q.k logits) say how
strongly token u "selects" (masks away) an earlier token s for every later query:

    S_us     = relu(selection_logits_us)   for s < u, same document, s not a document start
             = 0                           otherwise (the diagonal: a token never masks itself;
                                            the first token of each document plays the BOS
                                            role and is never masked)
    F_ts     = sum_{s < u < t} S_us         accumulated over queries, shifted by one so a token's
                                            selection acts only on strictly later queries
    logit_ts = scale * <q_t, k_s> - F_ts    for every head (the mask is shared by the layer)
    out_t    = causal, same-document softmax_s(logit_t.) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; selection_logits [B, T(u), T(s)] float (entries with
    s >= u are ignored); segment_ids [B, T] int -> out [B, T, H, Dv] in q's dtype.

Gradients reach selection_logits through the relu by plain autodiff.

Dense-only by design (F is a [B, T, T] float32 tensor: small T, probes and tests): `REGISTRY`
(op name "selective_attention") has the single entry "reference", which is also its default
order, so implementation=None and "reference" are the only accepted values; the entry is
`fn(q, k, v, selection_logits, segment_ids, *, scale) -> out` (docs/api.md, "Dispatch").
"""

import jax
import jax.numpy as jnp

from fpa_jax.baselines import flash_xla
from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import checks
from fpa_jax.fpa.fields import document_starts
from mixer_core.registry import Entry, Registry


def _document_starts(segment_ids, batch, length):
    """[B, T] bool: position 0 and every position whose segment id differs from its left."""
    if segment_ids is None:
        return jnp.broadcast_to(jnp.arange(length) == 0, (batch, length))
    return document_starts(segment_ids)


def selection_penalty(selection_logits, segment_ids=None):
    """F [B, T(t), T(s)] float32 from selection_logits [B, T, T] (see the module docstring)."""
    batch, length, _ = selection_logits.shape
    positions = jnp.arange(length)
    earlier = positions[None, :] < positions[:, None]  # [u, s]: s < u
    selectable = earlier[None] & ~_document_starts(segment_ids, batch, length)[:, None, :]
    if segment_ids is not None:
        selectable = selectable & (segment_ids[:, :, None] == segment_ids[:, None, :])
    selected = jnp.where(selectable, jax.nn.relu(selection_logits.astype(jnp.float32)), 0.0)
    through_u = jnp.cumsum(selected, axis=1)  # [B, t, s]: sum over s < u <= t
    return jnp.pad(through_u[:, :-1], ((0, 0), (1, 0), (0, 0)))  # shift: u < t


def _reference(q, k, v, selection_logits, segment_ids, *, scale):
    penalty = selection_penalty(selection_logits, segment_ids)
    out, _ = flash_xla.dense_attention(q, k, v, -penalty[:, None], scale=scale,
                                       segment_ids=segment_ids)
    return out


REGISTRY = Registry("selective_attention", default_order=("reference",), entries=(
    Entry("reference", _reference),
))


def selective_attention(q, k, v, selection_logits, *, scale=None, segment_ids=None,
                        implementation=None):
    """Selective Attention (dense reference) -> out [B, T, H, Dv] (q's dtype)."""
    batch, length, _, head_dim = flash_xla.check_qkv(q, k, v)
    checks.require_shape("selection_logits", selection_logits, (batch, length, length))
    checks.require_float("selection_logits", selection_logits)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = flash_xla.resolve_scale(scale, head_dim)
    _, fn = REGISTRY.select(implementation, **attention_facts(q, v, segment_ids))
    return fn(q, k, v, selection_logits, segment_ids, scale=scale)
