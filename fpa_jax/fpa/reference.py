"""Dense FPA oracle: materialises the [B, H, T, T] bias. For tests and small T only.

    R_ts  = min_{s < u <= t} phi_u                      hard range minimum (forward value)
    S_ts  = -tau * log sum_{s < u <= t} exp(-phi_u / tau)   soft minimum (gradient only)
    b_ts  = beta * min(0, R_ts - psi_s)   (psi_t with query_level), b_tt = 0,
            -inf where s > t or s, t lie in different documents
    out_t = sum_s softmax_s(scale * <q_t, k_s> + b_ts) v_s

The straight-through estimator is `stop_gradient(R) + S - stop_gradient(S)`: its value is
exactly R and its derivative is the soft minimum's, so JAX's autodiff of this module is the reference for
every faster path's custom VJP. The dead-key indicator [R_ts < psi_s] comes from
`where(x < 0, x, 0)`, whose derivative is 0 at a tie.
"""

import jax
import jax.numpy as jnp
from jax import lax

from fpa_jax.fpa import checks
from fpa_jax.fpa.blocks import range_table
from mixer_core.soft_min import BIG


def pair_mask(segment_ids, length):
    """[B or 1, 1, T, T] bool: query t may see key s (causal, same document)."""
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]
    if segment_ids is None:
        return causal
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return causal & same


def straight_through_range_min(phi, tau):
    """phi [B, H, T] -> R [B, H, T(t), T(s)] valued min_{s<u<=t} phi_u, soft-min gradient.

    Entries with t <= s hold meaningless finite values; callers mask them.
    """
    hard = range_table(phi, jnp.minimum, BIG)
    soft = -tau * range_table(-phi / tau, jnp.logaddexp, -BIG)
    return lax.stop_gradient(hard) + (soft - lax.stop_gradient(soft))  # value: exactly hard


def fpa_bias(phi, psi, beta, *, tau=1.0, segment_ids=None, query_level=False):
    """Dense FPA bias [B, H, T, T] (float32, float64 under x64) with the straight-through gradient."""
    checks.require_rank("phi", phi, 3)
    checks.require_shape("psi", psi, phi.shape)
    checks.require_float("phi", phi)
    checks.require_float("psi", psi)
    checks.require_shape("beta", beta, (phi.shape[2],))
    checks.check_tau(tau)
    checks.check_segment_ids(segment_ids, phi.shape[0], phi.shape[1])
    dtype = jnp.promote_types(phi.dtype, jnp.float32)
    phi_bht = jnp.moveaxis(phi.astype(dtype), 1, 2)
    psi_bht = jnp.moveaxis(psi.astype(dtype), 1, 2)
    range_min = straight_through_range_min(phi_bht, tau)
    level = psi_bht[..., :, None] if query_level else psi_bht[..., None, :]
    gap = range_min - level
    strictly_past = jnp.tril(jnp.ones(range_min.shape[-2:], dtype=bool), k=-1)
    dip = jnp.where(strictly_past & (gap < 0), gap, 0.0)
    bias = beta.astype(dtype)[None, :, None, None] * dip
    return jnp.where(pair_mask(segment_ids, phi.shape[1]), bias, -jnp.inf)


def fpa_attention_reference(q, k, v, phi, psi, beta, *, scale=None, tau=1.0, segment_ids=None,
                            query_level=False, content=True):
    """Dense FPA attention: q, k, v [B, T, H, D] -> [B, T, H, D] (dtype of q)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = fpa_bias(phi, psi, beta, tau=tau, segment_ids=segment_ids, query_level=query_level)
    if content:
        scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=logits.dtype)
        logits = logits + scale * scores
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", weights, v.astype(weights.dtype))
    return out.astype(q.dtype)
