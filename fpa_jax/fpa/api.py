"""Public FPA attention entry point: argument checks, then dispatch through `REGISTRY`.

    out_t = sum_{s <= t} softmax_s(scale * <q_t, k_s> + b_ts) v_s,
    b_ts  = beta * min(0, min_{s<u<=t} phi_u - psi_s)                  (docs/fpa.md)

Implementations (`REGISTRY`, op name "fpa_attention"; default order ("pallas", "xla")):
  "reference"  dense T x T oracle (fpa_jax.fpa.reference); never chosen by default
  "xla"        blocked, O(T * block) memory (fpa_jax.fpa.xla); runs everywhere
  "pallas"     the Mosaic GPU kernels (`mixer_kernels.mosaic_gpu.attention.register`), imported here
implementation=None takes the first entry of the default order that supports the inputs.

An entry is `fn(q, k, v, phi, psi, beta, segment_ids, *, scale, tau, query_level, content,
block_size) -> out [B, T, H, Dv]` (q's dtype), called with validated arrays: scale and tau are
Python floats, block_size is None (the entry's default) or a positive multiple of 8. Its
`supports(**facts)` reads `fpa_jax.dispatch.attention_facts` plus query_level, content,
block_size and tau (see docs/api.md, "Dispatch").
"""

from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import checks
from fpa_jax.fpa.reference import fpa_attention_reference
from fpa_jax.fpa.tiles import BlockedConfig, choose_block_size
from fpa_jax.fpa.xla import fpa_blocked
from mixer_kernels.mosaic_gpu.attention import register as pallas_backend
from mixer_core.registry import Entry, Registry

DEFAULT_BLOCK_SIZE = 64


def _check_inputs(q, k, v, phi, psi, beta, segment_ids, tau, block_size):
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
    if block_size is not None and (block_size <= 0 or block_size % 8):
        raise ValueError(f"block_size: expected a positive multiple of 8, got {block_size}")


def _reference(q, k, v, phi, psi, beta, segment_ids, *, scale, tau, query_level, content,
               block_size):
    del block_size  # dense
    return fpa_attention_reference(q, k, v, phi, psi, beta, scale=scale, tau=tau,
                                   segment_ids=segment_ids, query_level=query_level,
                                   content=content)


def _xla(q, k, v, phi, psi, beta, segment_ids, *, scale, tau, query_level, content, block_size):
    block = choose_block_size(q.shape[1], block_size or DEFAULT_BLOCK_SIZE)
    config = BlockedConfig(scale=scale, tau=tau, block_size=block, query_level=query_level,
                           content=content)
    return fpa_blocked(q, k, v, phi, psi, beta, segment_ids, config)


REGISTRY = Registry("fpa_attention", default_order=("pallas", "xla"), entries=(
    Entry("reference", _reference),
    Entry("xla", _xla),
    Entry("pallas", pallas_backend.fpa_pallas, supports=pallas_backend.pallas_supports),
))


def fpa_attention(q, k, v, phi, psi, beta, *, scale=None, tau=1.0, segment_ids=None,
                  implementation=None, query_level=False, content=True, block_size=None):
    """FPA attention. q, k, v [B, T, H, D]; phi, psi [B, T, H]; beta [H] > 0 -> [B, T, H, D].

    segment_ids [B, T] (int) packs documents: no attention and no walk across a boundary.
    The gradient w.r.t. phi is the straight-through soft minimum with temperature tau.
    implementation: None (fastest that supports the inputs) or a name in `REGISTRY`.
    """
    _check_inputs(q, k, v, phi, psi, beta, segment_ids, tau, block_size)
    config = dict(tau=float(tau), query_level=bool(query_level), content=bool(content),
                  block_size=block_size)
    _, fn = REGISTRY.select(implementation, **attention_facts(q, v, segment_ids, **config))
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    return fn(q, k, v, phi, psi, beta, segment_ids, scale=scale, **config)
