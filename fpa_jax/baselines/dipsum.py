"""Dip-sum FPA variant: the path MINIMUM of FPA replaced by a SUM of dips (duration-sensitive).

    b_ts     = beta_h * sum_{s < u <= t} min(0, phi_u - psi_s)       (b_tt = 0), float32
    logit_ts = scale * <q_t, k_s> + b_ts,   causal, within one segment
    out_t    = sum_s softmax_s(logit_t.) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; phi, psi [B, T, H] float (field and level, see
    fpa_jax.fields); beta [H] (> 0, checked when concrete); segment_ids [B, T] int
    -> out [B, T, H, Dv] in q's dtype.

Where FPA kills a key by the depth of the deepest dip of the field below the key's level, the
dip sum charges every step the field spends below it, so long shallow dips and short deep ones
can cost the same. Documents are contiguous, so the u of a same-document pair never leave it.

Gradients by plain autodiff.

Dense-only by design (the [B, H, T, T] bias is materialised): `REGISTRY` (op name
"dipsum_attention") has the single entry "reference", which is also its default order, so
implementation=None and "reference" are the only accepted values; the entry is
`fn(q, k, v, phi, psi, beta, segment_ids, *, scale) -> out` (docs/api.md, "Dispatch").
"""

import jax.numpy as jnp

from fpa_jax.baselines import flash_xla
from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import checks
from mixer_core.registry import Entry, Registry


def dip_sum_bias(phi, psi, beta):
    """b [B, H, T(t), T(s)] float32 from phi, psi [B, T, H] and beta [H]."""
    phi_bht = jnp.moveaxis(phi.astype(jnp.float32), 1, 2)
    psi_bht = jnp.moveaxis(psi.astype(jnp.float32), 1, 2)
    length = phi.shape[1]
    positions = jnp.arange(length)
    later = positions[:, None] > positions[None, :]  # [u, s]: u > s
    dips = jnp.where(later, jnp.minimum(0.0, phi_bht[..., :, None] - psi_bht[..., None, :]), 0.0)
    path_sum = jnp.cumsum(dips, axis=2)  # [B, H, t, s]: sum over s < u <= t
    return beta.astype(jnp.float32)[None, :, None, None] * path_sum


def _reference(q, k, v, phi, psi, beta, segment_ids, *, scale):
    out, _ = flash_xla.dense_attention(q, k, v, dip_sum_bias(phi, psi, beta), scale=scale,
                                       segment_ids=segment_ids)
    return out


REGISTRY = Registry("dipsum_attention", default_order=("reference",), entries=(
    Entry("reference", _reference),
))


def dipsum_attention(q, k, v, phi, psi, beta, *, scale=None, segment_ids=None,
                     implementation=None):
    """Dip-sum FPA attention (dense reference) -> out [B, T, H, Dv] (q's dtype)."""
    batch, length, heads, head_dim = flash_xla.check_qkv(q, k, v)
    flash_xla.check_per_token("phi", phi, batch, length, heads)
    flash_xla.check_per_token("psi", psi, batch, length, heads)
    checks.require_shape("beta", beta, (heads,))
    checks.require_float("beta", beta)
    checks.check_positive_beta(beta)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = flash_xla.resolve_scale(scale, head_dim)
    _, fn = REGISTRY.select(implementation, **attention_facts(q, v, segment_ids))
    return fn(q, k, v, phi, psi, beta, segment_ids, scale=scale)
