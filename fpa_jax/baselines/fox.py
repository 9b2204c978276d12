"""Forgetting Transformer (FoX) attention: softmax attention with a cumulative forget-gate bias.

    c_t      = sum_{u <= t} log_forget_u                      float32 cumulative sum over T
    b_ts     = sum_{s < u <= t} log_forget_u = c_t - c_s      (b_tt = 0)
    logit_ts = scale * <q_t, k_s> + b_ts,   causal, within one segment
    out_t    = sum_s softmax_s(logit_t.) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; log_forget [B, T, H] float (log f_t, normally <= 0);
    segment_ids [B, T] int -> out [B, T, H, Dv] in q's dtype.

The bias is separable, so the blocked path is flash_xla with row_bias = col_bias = c; its
custom VJP returns d row_bias and d col_bias and autodiff carries them back through the
cumulative sum to log_forget (exact). Documents are contiguous, so every u in (s, t] of a
same-document pair lies in that document: one cumsum over the whole packed row is correct.

log_forget <= 0 is not enforced: any finite float works (a positive entry simply raises older
keys' weights). The bias is a difference of float32 prefix sums, so its absolute error grows
with |c_t| (about 1e-7 |c_t|); for a walk of -50 per step over 16K tokens that is ~0.1 nats on
keys whose weight is exp(-50) or less anyway.

Implementations (`REGISTRY`, op name "fox_attention"; default order ("pallas", "xla")):
"reference" = dense [B, H, T, T] bias (never chosen by default), "xla" = blocked flash path,
"pallas" = registered by the Pallas kernel module when it is imported. An entry is
`fn(q, k, v, log_forget, segment_ids, *, scale, block_size) -> out` (q's dtype) on validated
arrays; `supports` reads `fpa_jax.dispatch.attention_facts` plus block_size (docs/api.md).
"""

import jax.numpy as jnp

from fpa_jax.baselines import flash_xla
from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import checks
from mixer_kernels.mosaic_gpu.attention import register as pallas_backend
from mixer_core.registry import Entry, Registry


def _cumulative(log_forget):
    """c [B, T, H] float32 = cumsum of log_forget over T."""
    return jnp.cumsum(log_forget.astype(jnp.float32), axis=1)


def _reference(q, k, v, log_forget, segment_ids, *, scale, block_size):
    del block_size  # dense
    c_bht = jnp.moveaxis(_cumulative(log_forget), 1, 2)
    bias = c_bht[..., :, None] - c_bht[..., None, :]  # [B, H, T(t), T(s)]
    out, _ = flash_xla.dense_attention(q, k, v, bias, scale=scale, segment_ids=segment_ids)
    return out


def _xla(q, k, v, log_forget, segment_ids, *, scale, block_size):
    cumulative = _cumulative(log_forget)
    out, _ = flash_xla.flash_attention(q, k, v, row_bias=cumulative, col_bias=cumulative,
                                       scale=scale, segment_ids=segment_ids,
                                       block_size=block_size)
    return out


REGISTRY = Registry("fox_attention", default_order=("pallas", "xla"), entries=(
    Entry("reference", _reference),
    Entry("xla", _xla),
    Entry("pallas", pallas_backend.fox_pallas, supports=pallas_backend.pallas_supports),
))


def fox_attention(q, k, v, log_forget, *, scale=None, segment_ids=None, implementation=None,
                  block_size=None):
    """FoX attention -> out [B, T, H, Dv] (q's dtype). block_size: key block of "xla" (128)."""
    batch, length, heads, head_dim = flash_xla.check_qkv(q, k, v)
    flash_xla.check_per_token("log_forget", log_forget, batch, length, heads)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = flash_xla.resolve_scale(scale, head_dim)
    flash_xla.check_block_size("block_size", block_size)
    _, fn = REGISTRY.select(implementation,
                            **attention_facts(q, v, segment_ids, block_size=block_size))
    return fn(q, k, v, log_forget, segment_ids, scale=scale, block_size=block_size)
