"""Forward pass of the causal attention kernel family (FPA, FoX / ALiBi, plain softmax).

    attention_forward(q, k, v, bias=NoBias(), *, scale, segment_ids=None, block=64,
                      prune=True, return_stats=False, p_in_registers=None,
                      float32_out=False, return_norms=False)
        -> (out, lse) [, out_f32] [, norms] [, stats]

    logit_ts = scale <q_t, k_s> + b_ts        valid: s <= t and doc(s) == doc(t)
    lse_t    = log sum_{s valid} exp(logit_ts)      natural log, float32, [B, H, T]
    out_t    = sum_{s valid} exp(logit_ts - lse_t) v_s                    [B, T, H, D]

q, k, v [B, T, H, D] bf16 / fp16 (float32 also runs in the GPU interpreter), D in {64, 128};
bias one of bias.py's NoBias / SeparableBias / FPABias; segment_ids [B, T] int (contiguous
documents) or None. lse is finite for every row: key t itself is always valid with bias 0.

Pruning (prune=True; FPA and separable biases): an off-diagonal n x n tile (query block I, key
block J) is skipped when

    bias_bound(I, J) + scale max_{t in I} |q_t| max_{s in J} |k_s|  <  min_{t in I} scale <q_t, k_t> - margin
    margin = 10 + log T  (nats)

with bias_bound an upper bound of b_ts over the tile (forward_kernel.py lists it per bias).
Every logit of a skipped tile then lies more than `margin` below its row's diagonal logit, so
all skipped tiles together carry less than T e^-margin = e^-10 (4.5e-5) of any row's mass.
float32_out=True also returns out in float32 before its rounding to q's dtype (the FPA backward
takes Delta_t = <dout_t, out_t> from it: fpa_jax/fpa/xla_vjp.py).
stats (return_stats=True): {"pruned_tiles": pruned off-diagonal tiles, "tiles": visited
off-diagonal tiles}, both float32 scalars summed over batch and heads.

The wrapper (XLA, O(T) memory) pads T to a multiple of the block (only when needed), packs the
per-row / per-column vectors and per-block scalars the kernel reads, and runs the kernel.
"""

import math
from typing import Optional

import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias
from mixer_kernels.mosaic_gpu.attention.common import (BIG, BLOCK, SUPPORTED_HEAD_DIMS,
                                                        dead_key_bounds, pack_rows, pruning_norms)
from mixer_kernels.mosaic_gpu.attention.fields import at_block_ends, statistics
from mixer_core.interpret import interpret_active
from mixer_core.padding import pad_time, padded_length
from mixer_kernels.mosaic_gpu.attention.forward_kernel import LOG2E, ForwardConfig, forward_kernel
from mixer_kernels.mosaic_gpu.common import document_start_index


def pruning_margin(length: int) -> float:
    return 10.0 + math.log(max(length, 1))


def heads_major(x, padded, value=0.0, edge=False):
    """[B, T, H] -> [B, H, Tp] float32."""
    x = jnp.moveaxis(x.astype(jnp.float32), 1, 2)
    if edge and padded > x.shape[-1]:
        return jnp.pad(x, ((0, 0), (0, 0), (0, padded - x.shape[-1])), mode="edge")
    return pad_time(x, padded, 2, value)


def _blocks(x, n):
    """[..., Tp] -> [..., nb, n]."""
    return x.reshape(x.shape[:-1] + (x.shape[-1] // n, n))


def _per_block(scalar, n):
    """[..., nb] -> [..., nb * n] (each block's scalar repeated over its positions)."""
    return jnp.repeat(scalar, n, axis=-1)


def _pack(vectors, names, n):
    """{name: [B, H, Tp]} -> [B, H, nb, len(names), n] float32."""
    return pack_rows([vectors[name] for name in names], n)


def _masked_block(x, real, n, reduce, fill):
    """Per-block reduction over real positions only: [B, H, Tp] -> [B, H, nb]."""
    return reduce(_blocks(jnp.where(real, x, fill), n), axis=-1)


def _check(q, k, v, bias, segment_ids, block):
    if q.ndim != 4:
        raise ValueError(f"q: expected rank 4 [B, T, H, D], got shape {q.shape}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"k, v: expected shape {q.shape} like q, got {k.shape} and {v.shape}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        raise TypeError(f"q: expected bfloat16 or float16, got {q.dtype}")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: head dim must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[-1]}")
    if block != BLOCK:
        raise ValueError(f"block: only {BLOCK} is supported, got {block}")
    if not isinstance(bias, (NoBias, SeparableBias, FPABias)):
        raise TypeError(f"bias: expected NoBias, SeparableBias or FPABias, got {type(bias)}")
    batch, length, heads, _ = q.shape
    per_token = {"row": "SeparableBias.row", "col": "SeparableBias.col",
                 "phi": "FPABias.phi", "psi": "FPABias.psi"}
    for field, name in per_token.items():
        x = getattr(bias, field, None)
        if x is not None and x.shape != (batch, length, heads):
            raise ValueError(f"{name}: expected shape {(batch, length, heads)}, got {x.shape}")
    if isinstance(bias, FPABias) and bias.beta.shape != (heads,):
        raise ValueError(f"FPABias.beta: expected shape {(heads,)}, got {bias.beta.shape}")
    if segment_ids is not None and segment_ids.shape != (batch, length):
        raise ValueError(f"segment_ids: expected shape {(batch, length)}, got {segment_ids.shape}")


def block_norms(qp, kp, scale, length, n, content=True):
    """The pruning test's per-block norms of padded qp, kp [B, Tp, H, D]: (dmin, qn, kn), each
    [B, H, nb] float32: the lowest scale <q_t, k_t> over the block's real positions, the
    largest scale |q_t| and the largest |k_s| (zeros without content)."""
    batch, padded, heads, _ = qp.shape
    if content:
        diag, qn, kn = pruning_norms(qp, kp, scale)
    else:
        diag = qn = kn = jnp.zeros((batch, heads, padded), jnp.float32)
    real = (jnp.arange(padded) < length)[None, None, :]
    return (_masked_block(diag, real, n, jnp.min, BIG), _blocks(qn, n).max(-1),
            _blocks(kn, n).max(-1))


def attention_forward(q, k, v, bias=NoBias(), *, scale: float,
                      segment_ids: Optional[jnp.ndarray] = None, block: int = BLOCK,
                      prune: bool = True, return_stats: bool = False,
                      p_in_registers: Optional[bool] = None, float32_out: bool = False,
                      return_norms: bool = False):
    """Causal biased attention forward; see the module docstring. p_in_registers: None picks
    True for 16-bit inputs on the GPU, False in the GPU interpreter (which needs P in shared
    memory) and for float32. return_norms: also return `block_norms` stacked, [B, H, nb, 3],
    which the backward takes instead of reducing q and k again (None where nothing is
    pruned: prune=False or no bias)."""
    _check(q, k, v, bias, segment_ids, block)
    batch, length, heads, head_dim = q.shape
    n = block
    padded = padded_length(length, n)
    fpa = isinstance(bias, FPABias)
    mode = "fpa" if fpa else "separable" if isinstance(bias, SeparableBias) else "none"
    content = bool(bias.content) if fpa else True
    prune = bool(prune) and mode != "none"
    cfg = ForwardConfig(mode=mode, scale=float(scale), block=n,
                        segments=segment_ids is not None,
                        query_level=bool(bias.query_level) if fpa else False,
                        content=content, prune=prune, margin=pruning_margin(length),
                        count_pruned=bool(return_stats) and prune,
                        p_in_registers=bool(p_in_registers) if p_in_registers is not None
                        else not interpret_active() and q.dtype != jnp.float32,
                        float32_out=bool(float32_out))

    qp, kp, vp = (pad_time(x, padded, 1) for x in (q, k, v))
    real = (jnp.arange(padded) < length)[None, None, :]
    vec = {}
    if segment_ids is not None:
        starts = document_start_index(segment_ids, padded)
        vec["start"] = jnp.broadcast_to(starts[:, None, :], (batch, heads, padded))
    norms = block_norms(qp, kp, cfg.scale, length, n, content) if prune else None
    if prune:
        vec["dmin"], vec["qn"], vec["kn"] = (_per_block(x, n) for x in norms)
    if mode == "separable":
        vec["row"] = heads_major(bias.row, padded)
        vec["col"] = heads_major(bias.col, padded)
        if prune:
            vec["rmax"] = _per_block(_masked_block(vec["row"], real, n, jnp.max, -BIG), n)
            vec["cmin"] = _per_block(_blocks(vec["col"], n).min(-1), n)
        vec["row"], vec["col"] = vec["row"] * LOG2E, vec["col"] * LOG2E  # the kernel's base 2
    elif fpa:
        phi = heads_major(bias.phi, padded, edge=True)
        psi = heads_major(bias.psi, padded)
        stats = statistics(phi, n, 1.0, masses=False)  # minima only
        vec["pre"], vec["suf"] = stats.get("pre_min", cfg.levels), stats.get("suf_min", cfg.levels)
        vec["bmin"] = _per_block(at_block_ends(vec["pre"], n), n)
        vec["beta"] = jnp.broadcast_to(bias.beta.astype(jnp.float32)[None, :, None],
                                       (batch, heads, padded))
        vec["psi"] = vec["dpsi"] = psi
        if cfg.unbiased_tiles:  # bounds of the no-dead-pair test (forward_kernel.py)
            vec["clo"] = vec["bmin"]
            vec["kap"], vec["kpmax"] = dead_key_bounds(vec["suf"], psi, n)
        if not cfg.query_level:   # the key side of the off-diagonal bias (forward_kernel.py)
            vec["key_gap"] = jnp.minimum(vec["suf"] - psi, 0.0)
        for level in range(cfg.levels):
            vec[f"dpre{level}"] = stats.get("pre_min", level)
            vec[f"dsuf{level}"] = stats.get("suf_min", level)
        if prune and cfg.query_level:
            vec["qc"] = _per_block(_masked_block(vec["pre"] - psi, real, n, jnp.max, -BIG), n)
            vec["qp"] = _per_block(_masked_block(psi, real, n, jnp.min, BIG), n)
        elif prune:
            vec["cmax"] = _per_block(_masked_block(vec["pre"], real, n, jnp.max, -BIG), n)
            vec["kp"] = _per_block(_blocks(psi, n).min(-1), n)

    row_names, col_names = cfg.row_names(), cfg.col_names()
    nb = padded // n
    empty = jnp.zeros((batch, heads, nb, 1, n), jnp.float32)
    rowp = _pack(vec, row_names, n) if row_names else empty
    colp = _pack(vec, col_names, n) if col_names else empty
    outs = forward_kernel(cfg, qp, kp, vp, rowp, colp)
    out, lse = outs[0][:, :length], outs[1][:, :, :length]
    results = (out, lse) + ((outs[-1][:, :length],) if cfg.float32_out else ())
    if return_norms:
        results += (None if norms is None else jnp.stack(norms, axis=-1),)
    if not return_stats:
        return results
    pruned = outs[2][..., 0].sum() if cfg.count_pruned else jnp.float32(0.0)
    if segment_ids is None:
        visited = jnp.float32(batch * heads * nb * (nb - 1) // 2)
    else:
        first = _blocks(vec["start"][:, :, :padded], n)[..., 0] // n  # [B, H, nb]
        visited = (jnp.arange(nb, dtype=jnp.float32) - first).sum()
    return results + ({"pruned_tiles": pruned, "tiles": visited},)
