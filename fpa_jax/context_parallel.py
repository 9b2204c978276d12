"""Ring attention for FPA and FoX: the time axis split over a mesh axis inside `shard_map`.

Device i of n (along `axis_name`) holds queries and keys of tokens [i L, (i + 1) L). Its keys
travel around the ring with `ppermute`; at step r device i holds the keys of device j = i - r
and adds that block to an online softmax (per-row log-sum-exp merge, float32 statistics):

    r = 0      diagonal block: causal within the device
    r >= 1     off-diagonal block (j < i): every pair is causal; blocks with j > i (wrapped
               around the ring) are masked out

FPA's bias on an off-diagonal block uses the blocked form of docs/fpa.md with the device as
the block: for s in J = device j and t in I = device i,

    R_ts = min(A_s, G, C_t)        A_s = min_{s < u < end of J} phi_u   (exclusive suffix)
                                   G   = min of phi over the devices strictly between j and i
                                   C_t = min_{start of I <= u <= t} phi_u (inclusive prefix)
    b_ts = beta * min(0, R_ts - psi_s)           (psi_t with query_level)

The key block carries min(A_s, G) as one vector: it leaves device j holding A_s, and every
device it passes through folds its own field minimum into it before forwarding it — the
running gap minimum travels with the keys. The straight-through gradient (docs/fpa.md) needs the
soft minimum S_ts = -tau log sum_{s<u<=t} exp(-phi_u / tau) of the same range; it splits the same
way (log-masses add), so the key block also carries log sum exp(-phi / tau) over (s, end of J]
plus the gap, the query side holds the prefix log-mass, and

    R_ts (value) + S_ts - stop_gradient(S_ts)      (gradient of the soft minimum)

is differentiated by JAX: the gradient of `shard_map`ped ring attention equals the unsplit
reference's autodiff. FoX: b_ts = c_t - c_s with c the global cumulative sum of log_forget
(`context_parallel_cumsum`: local cumsum plus the totals of earlier devices), carried with the
keys. The diagonal block needs the 2-D range minimum: per query row a masked reverse cumulative
minimum (and log-sum-exp) over the device's keys.

phi and psi must be the GLOBAL fields (the walk summed from token 0 of device 0):
`context_parallel_fields` computes them from delta, g, h.

Per device (B batch, H heads, L = T / n local tokens, D = head dim, n_q = block_size):
  compute   n ring steps of an L x L block each (only i + 1 of them unmasked: causal load
            imbalance, as in plain ring attention; no zig-zag reordering here)
  memory    forward: the local q, k, v, two key blocks in flight and one query sub-block tile
            [B, H, n_q, L] (tiles are recomputed in the backward by `jax.checkpoint`); the
            backward of autodiff keeps every received key block, i.e. O(B T H (D + Dv))
            per device (keys and values of the whole sequence) plus O(B L H Dv) per step for
            the partial outputs
  traffic   n - 1 sends of the key block, B L H (D + Dv) values plus B L H (3 for FPA: level
            (not with query_level), suffix min, suffix log-mass; 1 for FoX) float32 and B L segment ids
Shapes (local): q, k [B, L, H, D]; v [B, L, H, Dv]; phi, psi, log_forget [B, L, H];
beta [H] > 0; segment_ids [B, L] int -> out [B, L, H, Dv] in q's dtype.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from fpa_jax.baselines import flash_xla
from fpa_jax.fpa import checks
from mixer_core.padding import pad_time, padded_length
from mixer_core.shard import bound_axis_size
from mixer_core.soft_min import BIG

RING_BLOCK = 64         # query rows per tile (block_size) unless the caller sets it
MASKED_LOGIT = -1e30   # finite, so fully masked rows (wrapped blocks) stay NaN-free; their merge
                       # weight exp(MASKED_LOGIT - lse) is exactly 0


def context_parallel_cumsum(x, *, axis_name):
    """Inclusive cumulative sum over the global time axis: x [B, L, ...] -> float32 [B, L, ...]."""
    size = bound_axis_size(axis_name)
    local = jnp.cumsum(x.astype(jnp.float32), axis=1)
    totals = lax.all_gather(local[:, -1], axis_name)                      # [n, B, ...]
    earlier = jnp.arange(size) < lax.axis_index(axis_name)
    before = jnp.sum(jnp.where(earlier.reshape((size,) + (1,) * (totals.ndim - 1)), totals, 0.0),
                     axis=0)
    return local + before[:, None]


def context_parallel_fields(delta, g, h, *, axis_name):
    """FPA fields of the whole sequence: W = global cumsum(delta), phi = W + g, psi = W + h."""
    walk = context_parallel_cumsum(delta, axis_name=axis_name)
    return walk + g.astype(jnp.float32), walk + h.astype(jnp.float32)


def _cumulative(combine, x, axis, reverse=False):
    """Inclusive cumulative `combine` (jnp.minimum or jnp.logaddexp) along `axis`.

    An associative scan; under `jax.checkpoint`, so that autodiff keeps only its input: the
    scan's internals include empty slices, and empty residuals entering a `shard_map` backward
    crash XLA's Shardy pass (jax 0.11.2, e.g. 5 tokens per device).
    """
    scan = lambda x: lax.associative_scan(combine, x, reverse=reverse, axis=axis)
    return jax.checkpoint(scan)(x)


def _exclusive_reverse(combine, x, neutral):
    """out[..., s] = combination of x[..., u] over u > s along the last axis (neutral if none)."""
    inclusive = _cumulative(combine, x, x.ndim - 1, reverse=True)
    return jnp.concatenate([inclusive[..., 1:], jnp.full_like(inclusive[..., :1], neutral)], -1)


def _heads_last(x):
    """[B, L, H] -> [B, H, L]."""
    return jnp.moveaxis(x, 1, 2)


def _straight_through(hard, soft):
    return lax.stop_gradient(hard) + (soft - lax.stop_gradient(soft))


def _fpa_bias(query, keys, rows, diagonal, bias_config):
    """FPA bias [B, H, n_q, L] of a query sub-block against a key block."""
    tau, beta, query_level = bias_config
    if diagonal:   # masked reverse cumulative min / log-sum-exp per query row over own keys
        upto = jnp.arange(keys["v"].shape[1])[None, :] <= rows[:, None]           # [n_q, L]
        phi = _heads_last(keys["phi"])[:, :, None, :]                              # [B, H, 1, L]
        hard = _exclusive_reverse(jnp.minimum, jnp.where(upto, phi, BIG), BIG)
        log_mass = _exclusive_reverse(jnp.logaddexp, jnp.where(upto, -phi / tau, -BIG), -BIG)
    else:
        key_min = _heads_last(keys["suffix_min"])[:, :, None, :]
        query_min = _heads_last(query["prefix_min"])[..., None]
        hard = jnp.minimum(key_min, query_min)
        log_mass = jnp.logaddexp(_heads_last(keys["suffix_log_mass"])[:, :, None, :],
                                 _heads_last(query["prefix_log_mass"])[..., None])
    range_min = _straight_through(hard, -tau * log_mass)
    level = (_heads_last(query["psi"])[..., None] if query_level
             else _heads_last(keys["psi"])[:, :, None, :])
    gap = range_min - level
    dead = gap < 0
    if diagonal:
        dead = dead & (jnp.arange(keys["v"].shape[1])[None, :] < rows[:, None])
    return beta[None, :, None, None] * jnp.where(dead, gap, 0.0)


def _fox_bias(query, keys, rows, diagonal, bias_config):
    del rows, diagonal, bias_config
    return (_heads_last(query["cumulative"])[..., None]
            - _heads_last(keys["cumulative"])[:, :, None, :])


def _block_attention(query, keys, rows, valid, *, diagonal, scale, content, bias_fn,
                     bias_config):
    """One query sub-block against one key block -> (out [B, n_q, H, Dv] f32, lse [B, n_q, H])."""
    logits = bias_fn(query, keys, rows, diagonal, bias_config)
    if content:
        scores = jnp.einsum("bthd,bshd->bhts", query["q"], keys["k"],
                            preferred_element_type=jnp.float32)
        logits = logits + scale * scores
    mask = jnp.broadcast_to(valid, (1, 1, 1, 1))
    if diagonal:
        mask = mask & (jnp.arange(keys["v"].shape[1])[None, :] <= rows[:, None])
    if query["segment"] is not None:
        mask = mask & (query["segment"][:, None, :, None] == keys["segment"][:, None, None, :])
    logits = jnp.where(mask, logits, MASKED_LOGIT)
    # the shift cancels in out and lse, so it is not differentiated: reduce_max's JVP divides by
    # the count of entries equal to the max, found by recomparing recomputed logits, and XLA
    # CPU at --xla_backend_optimization_level=0 rounds the copies of a fusion differently (a
    # count of 0: inf dq, dk)
    row_max = lax.stop_gradient(logits.max(-1, keepdims=True))
    probs = jnp.exp(logits - row_max)
    row_sum = probs.sum(-1)
    out = jnp.einsum("bhts,bshd->bthd", probs, keys["v"].astype(jnp.float32))
    out = out / jnp.moveaxis(row_sum, 1, 2)[..., None]
    return out, jnp.moveaxis(row_max[..., 0] + jnp.log(row_sum), 1, 2)


def _ring_step(query, keys, valid, *, diagonal, block_size, **options):
    """All local queries against one key block, a query sub-block at a time."""
    length = query["q"].shape[1]
    sub = min(block_size, length)
    padded = padded_length(length, sub)
    count = padded // sub

    def split(x):   # [B, L, ...] -> [count, B, sub, ...]
        if x is None:
            return None
        x = pad_time(x, padded)
        return jnp.moveaxis(x.reshape(x.shape[0], count, sub, *x.shape[2:]), 1, 0)

    sub_blocks = {name: split(x) for name, x in query.items()}
    rows = jnp.arange(padded).reshape(count, sub)
    run = jax.checkpoint(functools.partial(_block_attention, diagonal=diagonal, **options),
                         prevent_cse=False)
    out, lse = lax.map(lambda xs: run(xs[0], keys, xs[1], valid), (sub_blocks, rows))
    merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], padded, *x.shape[3:])[:, :length]
    return merge(out), merge(lse)


def _merge(accumulated, part):
    (out_a, lse_a), (out_b, lse_b) = accumulated, part
    lse = jnp.logaddexp(lse_a, lse_b)
    return (out_a * jnp.exp(lse_a - lse)[..., None] + out_b * jnp.exp(lse_b - lse)[..., None],
            lse)


def _ring(query, keys, diagonal_extras, fold_gap, *, axis_name, size, out_dtype, **options):
    """Online softmax over the n key blocks passed around the ring.

    keys: the block that travels; diagonal_extras: what only the diagonal step reads.
    """
    index = lax.axis_index(axis_name)
    result = _ring_step(query, {**keys, **diagonal_extras}, True, diagonal=True, **options)
    cyclic = [(i, (i + 1) % size) for i in range(size)]
    for step in range(1, size):
        if step >= 2:   # the block being forwarded came from another device: extend its gap
            keys = fold_gap(keys)
        keys = {name: None if x is None else lax.ppermute(x, axis_name, cyclic)
                for name, x in keys.items()}
        part = _ring_step(query, keys, index >= step, diagonal=False, **options)
        result = _merge(result, part)
    return result[0].astype(out_dtype)


def _check_common(q, k, v, segment_ids, block_size):
    batch, length, _, _ = flash_xla.check_qkv(q, k, v)
    checks.check_segment_ids(segment_ids, batch, length)
    checks.require_positive_int("block_size", block_size)


def ring_fpa_attention(q, k, v, phi, psi, beta, *, axis_name, scale=None, tau=1.0,
                       segment_ids=None, query_level=False, content=True, block_size=RING_BLOCK):
    """FPA attention with T split over mesh axis `axis_name` (call inside `shard_map`).

    Same result and gradients as `fpa_jax.fpa_attention` on the whole sequence. Arguments are
    this device's slice of time (device i holds the i-th of n equal slices); phi, psi are the
    global fields (see `context_parallel_fields`); beta [H] is replicated. block_size: query
    rows per tile. Math, memory and traffic: module docstring.
    """
    size = bound_axis_size(axis_name)
    _check_common(q, k, v, segment_ids, block_size)
    for name, x in (("phi", phi), ("psi", psi)):
        flash_xla.check_per_token(name, x, *q.shape[:3])
    checks.require_shape("beta", beta, q.shape[2:3])
    checks.check_positive_beta(beta)
    checks.check_tau(tau)
    phi, psi = phi.astype(jnp.float32), psi.astype(jnp.float32)
    log_weights = -phi / tau
    query = {"q": q, "segment": segment_ids, "psi": psi,
             "prefix_min": _cumulative(jnp.minimum, phi, 1),
             "prefix_log_mass": _cumulative(jnp.logaddexp, log_weights, 1)}
    keys = {"k": k if content else None,          # no content: no key vectors travel
            "v": v, "segment": segment_ids, "psi": None if query_level else psi,
            "suffix_min": _exclusive_reverse(jnp.minimum, _heads_last(phi), BIG),
            "suffix_log_mass": _exclusive_reverse(jnp.logaddexp, _heads_last(log_weights),
                                                  -BIG)}
    keys["suffix_min"] = jnp.moveaxis(keys["suffix_min"], 2, 1)
    keys["suffix_log_mass"] = jnp.moveaxis(keys["suffix_log_mass"], 2, 1)
    own_min = phi.min(axis=1, keepdims=True)                               # [B, 1, H]
    own_log_mass = jax.nn.logsumexp(log_weights, axis=1, keepdims=True)

    def fold_gap(keys):
        return {**keys, "suffix_min": jnp.minimum(keys["suffix_min"], own_min),
                "suffix_log_mass": jnp.logaddexp(keys["suffix_log_mass"], own_log_mass)}

    scale = flash_xla.resolve_scale(scale, q.shape[-1])
    return _ring(query, keys, {"phi": phi}, fold_gap, axis_name=axis_name, size=size,
                 out_dtype=q.dtype, block_size=block_size, scale=scale, content=bool(content),
                 bias_fn=_fpa_bias,
                 bias_config=(float(tau), beta.astype(jnp.float32), bool(query_level)))


def ring_fox_attention(q, k, v, log_forget, *, axis_name, scale=None, segment_ids=None,
                       block_size=RING_BLOCK):
    """FoX attention with T split over mesh axis `axis_name` (call inside `shard_map`).

    Same result and gradients as `fpa_jax.fox_attention` on the whole sequence; log_forget
    [B, L, H] is this device's slice (its global cumulative sum is taken here).
    """
    size = bound_axis_size(axis_name)
    _check_common(q, k, v, segment_ids, block_size)
    flash_xla.check_per_token("log_forget", log_forget, *q.shape[:3])
    cumulative = context_parallel_cumsum(log_forget, axis_name=axis_name)
    query = {"q": q, "segment": segment_ids, "cumulative": cumulative}
    keys = {"k": k, "v": v, "segment": segment_ids, "cumulative": cumulative}
    scale = flash_xla.resolve_scale(scale, q.shape[-1])
    return _ring(query, keys, {}, lambda keys: keys, axis_name=axis_name, size=size,
                 out_dtype=q.dtype, block_size=block_size, scale=scale, content=True,
                 bias_fn=_fox_bias, bias_config=None)
