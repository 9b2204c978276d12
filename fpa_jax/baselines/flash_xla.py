"""Causal softmax attention with an additive bias: the core every baseline calls.

    logit_ts = scale * <q_t, k_s> + bias_ts
    valid_ts = (s <= t) and (segment_ids_t == segment_ids_s)
    lse_t    = log sum_{s valid} exp(logit_ts)                                 float32
    out_t    = sum_{s valid} exp(logit_ts - lse_t) v_s

    q, k [B, T, H, D]; v [B, T, H, Dv]; segment_ids [B, T] int (equal id = same document)
    out [B, T, H, Dv] (dtype of q); lse [B, T, H] float32 (-inf for a row with no valid key)

Two paths:

* `dense_attention(q, k, v, bias)`: materialises the [B, H, T, T] logits; any bias. Oracle
  for tests and the dense-only baselines (Selective Attention, DCP, dip sum).
* `flash_attention(q, k, v, row_bias=, col_bias=)`: blocked, for a SEPARABLE bias

      bias_ts = row_bias_t - col_bias_s            row_bias, col_bias [B, T, H] float32

  (FoX: row = col = cumsum(log f); ALiBi: row = -slope * t, col = -slope * s). Online softmax
  over key blocks with float32 running max / sum, so no T x T tensor exists and memory is
  O(T * block) for any T and any bias drift (a bias of -1e4 is as stable as 0).

Schedule of the blocked path (pure XLA, static shapes). The padded sequence is cut into key
blocks of `block_size` and query chunks of `query_chunk_size` rows (a multiple of the block).
Each query chunk is one `lax.scan` over the key blocks that end at or before the chunk's last
row, so key blocks entirely in a chunk's future are never visited; only tiles on the chunk's
diagonal are partly masked. With chunks of c blocks out of n, the tiles computed are about
n^2 (1 + c/n) / 2 against the causal minimum n^2 / 2. Smaller chunks waste less arithmetic but
run more, smaller scan steps (and one more Python-unrolled scan each, so compile time grows
with their number), which costs a GPU more than the masked tiles save. Default: a quarter of
the sequence (at most 4 scans). Measured on an H200, bf16, forward+backward, (B, T, H, D) =
(4, 4096, 12, 64), block 128, chunks of T/32 .. T: 27.7, 17.7, 14.6, 13.6 (T/4), 14.7, 17.9 ms;
at (1, 16384, 12, 64) T/4 beat chunks of 1024 and 2048 rows (54 ms vs 67 and 57). Block 256 was
15-25% faster than 128 there; cuDNN without a bias about 9x faster than either. A variant with
one compiled body (lax.map over chunks, fori_loop with a per-chunk dynamic trip count, so only
causal blocks are visited) was 20% slower at T/4 chunks and 1.5x slower at one-block chunks:
a dynamic-length loop costs each iteration more on the GPU than a fixed-length scan.

Backward (jax.custom_vjp, flash style, tiles recomputed from q, k, v and the saved lse):

    P_ts   = exp(logit_ts - lse_t)            dP_ts = <dout_t, v_s>
    Delta_t = <dout_t, out_t> - dlse_t         dS_ts = P_ts (dP_ts - Delta_t)
    dq_t = scale sum_s dS_ts k_s     dk_s = scale sum_t dS_ts q_t     dv_s = sum_t P_ts dout_t
    d row_bias_t = sum_s dS_ts                 d col_bias_s = -sum_t dS_ts

Each query chunk's scan carries its dq and d row_bias and emits (dk, dv, d col_bias) per key
block; those are summed over chunks. bf16/fp16 inputs feed the matmuls in their own dtype with
float32 accumulation; softmax statistics, P and dS are float32.

Both bias gradients sum the same float32 dS, and Delta uses the float32 out (kept as the
residual: 4 bytes per output element instead of 2 for bf16). FoX's d log_forget_u is a
reverse cumulative sum of d row_bias + d col_bias, i.e. sum dS over pairs s < u <= t, small
against the row and column sums it is the difference of. Taking d row_bias = dlse_t (true
since sum_s P_ts = 1) while d col_bias sums a dS whose Delta came from the bf16-rounded out
left a per-row error that no longer cancels in that sum: relative error 2.2e-2 instead of
2.3e-3 at (B, T, H, D) = (2, 1000, 4, 64) (tests/fpa_jax/baselines/test_flash_xla_bf16_gradients.py).

Input checks shared by the baselines (shapes, dtypes, scale, block size) live here too; every
failure names the argument. Choosing an implementation is each op's `REGISTRY` (fox.py,
softmax.py, ...).
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from fpa_jax.fpa import checks
from fpa_jax.fpa.reference import pair_mask
from mixer_core.padding import pad_segment_ids, padded_length

DEFAULT_BLOCK_SIZE = 128
_DEFAULT_QUERY_CHUNKS = 4


# --------------------------------------------------------------------------- input checks


def check_qkv(q, k, v):
    """q, k [B, T, H, D]; v [B, T, H, Dv]; one floating dtype. Returns (B, T, H, D)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        checks.require_rank(name, x, 4)
        checks.require_float(name, x)
    checks.require_shape("k", k, q.shape)
    if tuple(v.shape[:3]) != tuple(q.shape[:3]):
        raise ValueError(
            f"v: expected leading dims (B, T, H) = {tuple(q.shape[:3])} like q, "
            f"got shape {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return tuple(q.shape)


def check_per_token(name, x, batch, length, heads):
    """A float [B, T, H] per-token, per-head scalar."""
    checks.require_shape(name, x, (batch, length, heads))
    checks.require_float(name, x)


def resolve_scale(scale, head_dim):
    """None -> head_dim ** -0.5; else a finite Python number (kept static)."""
    if scale is None:
        return head_dim ** -0.5
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: expected None or a finite Python float, got {scale!r}")
    return float(scale)


def check_block_size(name, size):
    """None or a positive int."""
    if size is not None:
        checks.require_positive_int(name, size)


# --------------------------------------------------------------------------- dense oracle


def dense_attention(q, k, v, bias=None, *, scale=None, segment_ids=None):
    """Dense masked causal softmax attention (reference). Returns (out, lse).

    q, k [B, T, H, D]; v [B, T, H, Dv]; bias None or broadcastable to [B, H, T(t), T(s)]
    (added in float32). out [B, T, H, Dv] in q's dtype, lse [B, T, H] float32.
    Materialises T x T: tests and small T only.
    """
    batch, length, heads, head_dim = check_qkv(q, k, v)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = resolve_scale(scale, head_dim)
    logits = scale * jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
    if bias is not None:
        checks.require_float("bias", bias)
        try:
            jnp.broadcast_shapes(jnp.shape(bias), logits.shape)
        except ValueError:
            raise ValueError(f"bias: expected a shape broadcastable to [B, H, T, T] = "
                             f"{logits.shape}, got {jnp.shape(bias)}") from None
        logits = logits + jnp.asarray(bias, jnp.float32)
    valid = pair_mask(segment_ids, length)
    logits = jnp.where(valid, logits, -jnp.inf)
    row_max = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    weights = jnp.exp(logits - row_max)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    has_key = total > 0
    safe_total = jnp.where(has_key, total, 1.0)
    probs = weights / safe_total
    out = jnp.einsum("bhts,bshd->bthd", probs, v.astype(jnp.float32))
    lse = jnp.where(has_key, row_max + jnp.log(safe_total), -jnp.inf)[..., 0]
    return out.astype(q.dtype), jnp.swapaxes(lse, 1, 2)


# --------------------------------------------------------------------------- blocked path


def _default_query_chunk(num_blocks, block_k):
    """Rows per query chunk: a quarter of the sequence rounded up to whole blocks."""
    return -(-num_blocks // _DEFAULT_QUERY_CHUNKS) * block_k


def _query_chunks(layout):
    """Static (first row, rows, key blocks to visit) of each query chunk."""
    return [(start, min(layout.chunk_rows, layout.padded_length - start),
             min(start + layout.chunk_rows, layout.padded_length) // layout.block_k)
            for start in range(0, layout.padded_length, layout.chunk_rows)]


def _key_blocks(x, num_blocks, block_k):
    """[B, H, n * bk, ...] or [B, n * bk] -> [n, B, H, bk, ...] or [n, B, bk]."""
    time_axis = min(x.ndim - 1, 2)
    x = x.reshape(x.shape[:time_axis] + (num_blocks, block_k) + x.shape[time_axis + 1:])
    return jnp.moveaxis(x, time_axis, 0)


def _join_key_blocks(x):
    """[n, B, H, bk, ...] -> [B, H, n * bk, ...]."""
    x = jnp.moveaxis(x, 0, 2)
    return x.reshape(x.shape[:2] + (x.shape[2] * x.shape[3],) + x.shape[4:])


def _finite_or(x, fallback):
    return jnp.where(jnp.isfinite(x), x, fallback)


class _Layout(NamedTuple):
    """Static tiling: key block size, query rows per chunk, padded sequence length."""
    block_k: int
    chunk_rows: int
    padded_length: int


class _Chunk:
    """One query chunk (rows [start, start + rows)) and the key blocks its scan visits."""

    def __init__(self, start, rows, num_blocks, q, row_bias, segment_ids, all_key_blocks,
                 block_k):
        self.start = start
        self.q = q[:, :, start:start + rows]
        self.row_bias = row_bias[:, :, start:start + rows]
        self.segment_ids = None if segment_ids is None else segment_ids[:, start:start + rows]
        self.block_k = block_k
        # scan inputs: (k, v, col_bias, segment_ids, block index), blocks [0, num_blocks)
        self.key_blocks = tuple(None if x is None else x[:num_blocks] for x in all_key_blocks)

    def logits(self, key_block, scale):
        """[B, H, rows, bk] float32 logits against one key block, -inf where invalid."""
        k_block, _, col_block, seg_block, block_index = key_block
        logits = jnp.einsum("bhqd,bhkd->bhqk", self.q, k_block,
                            preferred_element_type=jnp.float32)
        logits = scale * logits + self.row_bias[..., :, None] - col_block[..., None, :]
        query_pos = self.start + jnp.arange(self.q.shape[2])
        key_pos = block_index * self.block_k + jnp.arange(self.block_k)
        valid = query_pos[:, None] >= key_pos[None, :]
        if seg_block is not None:
            valid = valid & (self.segment_ids[:, None, :, None] == seg_block[:, None, None, :])
        return jnp.where(valid, logits, -jnp.inf)


def _forward_chunk(chunk, scale):
    """Online softmax of one query chunk over its key blocks -> (out f32, lse f32)."""
    batch, heads, rows, _ = chunk.q.shape

    def visit_key_block(carry, key_block):
        run_max, run_sum, acc = carry
        logits = chunk.logits(key_block, scale)
        v_block = key_block[1]
        new_max = jnp.maximum(run_max, jnp.max(logits, axis=-1))
        shift = _finite_or(new_max, 0.0)
        weights = jnp.exp(logits - shift[..., None])
        decay = jnp.exp(run_max - shift)
        run_sum = decay * run_sum + jnp.sum(weights, axis=-1)
        acc = decay[..., None] * acc + jnp.einsum(
            "bhqk,bhkd->bhqd", weights.astype(v_block.dtype), v_block,
            preferred_element_type=jnp.float32)
        return (new_max, run_sum, acc), None

    init = (jnp.full((batch, heads, rows), -jnp.inf, jnp.float32),
            jnp.zeros((batch, heads, rows), jnp.float32),
            jnp.zeros((batch, heads, rows, chunk.key_blocks[1].shape[-1]), jnp.float32))
    (run_max, run_sum, acc), _ = lax.scan(visit_key_block, init, chunk.key_blocks)
    has_key = run_sum > 0  # guard; a causal row always sees its own key
    safe_sum = jnp.where(has_key, run_sum, 1.0)
    out = acc / safe_sum[..., None]
    lse = jnp.where(has_key, run_max + jnp.log(safe_sum), -jnp.inf)
    return out, lse


def _backward_chunk(chunk, lse, dout, delta, scale):
    """Gradient tiles of one query chunk -> (dq, per-key-block dk, dv, d col_bias, d row_bias).

    All float32; dq and d row_bias [B, H, rows(, D)], the others [n, B, H, bk(, D)].
    """
    lse_safe = _finite_or(lse, jnp.inf)  # rows with no key: P = 0

    def visit_key_block(carry, key_block):
        dq, drow = carry
        k_block, v_block = key_block[:2]
        logits = chunk.logits(key_block, scale)
        probs = jnp.exp(logits - lse_safe[..., None])
        dprobs = jnp.einsum("bhqd,bhkd->bhqk", dout, v_block, preferred_element_type=jnp.float32)
        dlogits = probs * (dprobs - delta[..., None])
        dlogits_in = dlogits.astype(chunk.q.dtype)
        dq = dq + jnp.einsum("bhqk,bhkd->bhqd", dlogits_in, k_block,
                             preferred_element_type=jnp.float32)
        dk_block = jnp.einsum("bhqk,bhqd->bhkd", dlogits_in, chunk.q,
                              preferred_element_type=jnp.float32)
        dv_block = jnp.einsum("bhqk,bhqd->bhkd", probs.astype(dout.dtype), dout,
                              preferred_element_type=jnp.float32)
        drow = drow + jnp.sum(dlogits, axis=-1)
        return (dq, drow), (dk_block, dv_block, -jnp.sum(dlogits, axis=-2))

    init = (jnp.zeros(chunk.q.shape, jnp.float32), jnp.zeros(chunk.q.shape[:3], jnp.float32))
    (dq, drow), (dk, dv, dcol) = lax.scan(visit_key_block, init, chunk.key_blocks)
    return scale * dq, scale * dk, dv, dcol, drow


def _chunks(q, k, v, row_bias, col_bias, segment_ids, layout):
    num_blocks = layout.padded_length // layout.block_k
    all_key_blocks = [_key_blocks(x, num_blocks, layout.block_k) for x in (k, v, col_bias)]
    all_key_blocks.append(None if segment_ids is None
                          else _key_blocks(segment_ids, num_blocks, layout.block_k))
    all_key_blocks.append(jnp.arange(num_blocks))
    return [_Chunk(start, rows, visits, q, row_bias, segment_ids, all_key_blocks, layout.block_k)
            for start, rows, visits in _query_chunks(layout)]


def _blocked_forward(q, k, v, row_bias, col_bias, segment_ids, scale, layout):
    """[B, H, Tp, D] inputs -> (out [B, H, Tp, Dv] float32, lse [B, H, Tp] f32)."""
    outs, lses = [], []
    for chunk in _chunks(q, k, v, row_bias, col_bias, segment_ids, layout):
        out, lse = _forward_chunk(chunk, scale)
        outs.append(out)
        lses.append(lse)
    return jnp.concatenate(outs, axis=2), jnp.concatenate(lses, axis=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _flash(q, k, v, row_bias, col_bias, segment_ids, scale, layout):
    out, lse = _blocked_forward(q, k, v, row_bias, col_bias, segment_ids, scale, layout)
    return out.astype(q.dtype), lse


def _flash_fwd(q, k, v, row_bias, col_bias, segment_ids, scale, layout):
    out, lse = _blocked_forward(q, k, v, row_bias, col_bias, segment_ids, scale, layout)
    # the float32 out is the residual: Delta from it matches the recomputed P (see docstring)
    return (out.astype(q.dtype), lse), (q, k, v, row_bias, col_bias, segment_ids, out, lse)


def _flash_bwd(scale, layout, residuals, cotangents):
    q, k, v, row_bias, col_bias, segment_ids, out, lse = residuals
    dout, dlse = cotangents
    dout = dout.astype(q.dtype)
    dlse = jnp.where(jnp.isfinite(lse), dlse, 0.0)
    delta = jnp.einsum("bhtd,bhtd->bht", dout.astype(jnp.float32), out.astype(jnp.float32)) - dlse
    dq_parts, drow_parts = [], []
    dk, dv, dcol = (jnp.zeros(x.shape, jnp.float32) for x in (k, v, col_bias))
    for chunk in _chunks(q, k, v, row_bias, col_bias, segment_ids, layout):
        rows = slice(chunk.start, chunk.start + chunk.q.shape[2])
        dq_chunk, dk_part, dv_part, dcol_part, drow_chunk = _backward_chunk(
            chunk, lse[:, :, rows], dout[:, :, rows], delta[:, :, rows], scale)
        dq_parts.append(dq_chunk)
        drow_parts.append(drow_chunk)
        seen = slice(0, dk_part.shape[0] * layout.block_k)
        dk = dk.at[:, :, seen].add(_join_key_blocks(dk_part))
        dv = dv.at[:, :, seen].add(_join_key_blocks(dv_part))
        dcol = dcol.at[:, :, seen].add(_join_key_blocks(dcol_part))
    drow = jnp.concatenate(drow_parts, axis=2)  # not the identity dlse_t: see the docstring
    return (jnp.concatenate(dq_parts, axis=2).astype(q.dtype), dk.astype(k.dtype),
            dv.astype(v.dtype), drow.astype(row_bias.dtype), dcol.astype(col_bias.dtype), None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, *, row_bias=None, col_bias=None, scale=None, segment_ids=None,
                    block_size=None, query_chunk_size=None):
    """Blocked causal attention with bias row_bias_t - col_bias_s. Returns (out, lse).

    q, k [B, T, H, D]; v [B, T, H, Dv]; row_bias, col_bias None (zero) or float [B, T, H]
    (computed in float32, differentiable); segment_ids None or int [B, T].
    block_size: keys per block (default 128; T is padded internally; a T shorter than the
    block uses one block of T). query_chunk_size: query rows per scan, rounded up to a multiple
    of the block (default: see the module docstring).
    out [B, T, H, Dv] (q's dtype), lse [B, T, H] float32. Exact gradients via custom_vjp.
    """
    batch, length, heads, head_dim = check_qkv(q, k, v)
    checks.check_segment_ids(segment_ids, batch, length)
    scale = resolve_scale(scale, head_dim)
    check_block_size("block_size", block_size)
    check_block_size("query_chunk_size", query_chunk_size)
    biases = []
    for name, bias in (("row_bias", row_bias), ("col_bias", col_bias)):
        if bias is None:
            bias = jnp.zeros((batch, length, heads), jnp.float32)
        check_per_token(name, bias, batch, length, heads)
        biases.append(bias.astype(jnp.float32))

    block_k = min(block_size or DEFAULT_BLOCK_SIZE, length)
    num_key_blocks = -(-length // block_k)
    if query_chunk_size is None:
        chunk_rows = _default_query_chunk(num_key_blocks, block_k)
    else:
        chunk_rows = padded_length(query_chunk_size, block_k)
    padded = num_key_blocks * block_k

    def to_heads_major(x):  # [B, T, H, ...] -> [B, H, Tp, ...], zero padded
        x = jnp.moveaxis(x, 2, 1)
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, padded - length)
        return jnp.pad(x, pad)

    segment_ids = pad_segment_ids(segment_ids, padded)  # padding: its own document
    out, lse = _flash(*(to_heads_major(x) for x in (q, k, v, *biases)), segment_ids,
                      scale, _Layout(block_k, chunk_rows, padded))
    return jnp.moveaxis(out[:, :, :length], 1, 2), jnp.moveaxis(lse[:, :, :length], 1, 2)

