"""Public FPA attention entry point: argument checks and the implementation switch.

    out_t = sum_{s <= t} softmax_s(scale * <q_t, k_s> + b_ts) v_s,
    b_ts  = beta * min(0, min_{s<u<=t} phi_u - psi_s)                  (FPA.md)

implementation: None (best available: the blocked XLA path until the Pallas kernel lands),
"reference" (dense T x T oracle), "xla" (blocked, O(T * block) memory), "pallas" (GPU kernel).
"""

import jax
import jax.numpy as jnp

from fpa_jax.fpa import checks
from fpa_jax.fpa.reference import fpa_attention_reference
from fpa_jax.fpa.xla import BlockedConfig, choose_block_size, fpa_blocked

IMPLEMENTATIONS = (None, "reference", "xla", "pallas")
DEFAULT_BLOCK_SIZE = 64


def _check_inputs(q, k, v, phi, psi, beta, segment_ids, tau):
    for name, x in (("q", q), ("k", k), ("v", v)):
        checks.require_rank(name, x, 4)
        checks.require_float(name, x)
    checks.require_shape("k", k, q.shape)
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v: expected shape {q.shape[:3]} + (Dv,), got {v.shape}")
    batch, length, heads, _ = q.shape
    for name, x in (("phi", phi), ("psi", psi)):
        checks.require_shape(name, x, (batch, length, heads))
        checks.require_float(name, x)
    checks.require_shape("beta", beta, (heads,))
    checks.require_float("beta", beta)
    checks.check_positive_beta(beta)
    checks.check_segment_ids(segment_ids, batch, length)
    checks.check_tau(tau)


def fpa_attention(q, k, v, phi, psi, beta, *, scale=None, tau=1.0, segment_ids=None,
                  implementation=None, query_level=False, content=True, block_size=None):
    """FPA attention. q, k, v [B, T, H, D]; phi, psi [B, T, H]; beta [H] > 0 -> [B, T, H, D].

    segment_ids [B, T] (int) packs documents: no attention and no walk across a boundary.
    The gradient w.r.t. phi is the straight-through soft minimum with temperature tau.
    """
    _check_inputs(q, k, v, phi, psi, beta, segment_ids, tau)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: expected one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "pallas":
        raise NotImplementedError(
            "fpa_attention: implementation='pallas' is not available yet (the Pallas Mosaic GPU "
            "kernel has not landed); use implementation='xla' or None")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    if implementation == "reference":
        return fpa_attention_reference(q, k, v, phi, psi, beta, scale=scale, tau=tau,
                                       segment_ids=segment_ids, query_level=query_level,
                                       content=content)
    if block_size is not None and (block_size <= 0 or block_size % 8):
        raise ValueError(f"block_size: expected a positive multiple of 8, got {block_size}")
    block = choose_block_size(q.shape[1], block_size or DEFAULT_BLOCK_SIZE)
    config = BlockedConfig(scale=scale, tau=float(tau), block_size=block,
                           query_level=bool(query_level), content=bool(content))
    return fpa_blocked(q, k, v, phi, psi, beta, segment_ids, config)
