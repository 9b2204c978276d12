"""Backward pass of the causal attention kernel family (FPA, FoX / ALiBi, plain softmax).

    attention_backward(q, k, v, out, lse, dout, bias, *, scale, segment_ids=None, block=64,
                       prune=False) -> (dq, dk, dv, bias_grads)

q, k, v, out, dout [B, T, H, D] (bf16 / fp16 on the GPU; float32 also runs in the interpreter);
lse [B, H, T] float32, natural log of the row's softmax normaliser (the forward's residual);
segment_ids [B, T] int or None (contiguous documents). bias is one of bias.py's

    NoBias()                                           -> bias_grads = ()
    SeparableBias(row, col)   b_ts = row_t - col_s     -> (d row, d col), each [B, T, H] float32
    FPABias(phi, psi, beta, tau, query_level, content) -> (dphi, dpsi [B, T, H], dbeta [H])

FPA's dbeta is centred per row (backward_kernels.py: the rows' error of delta cancels)
and delta should come from the float32 out (vjp.py saves it). FPA's dphi is the
straight-through soft-minimum gradient of fpa_jax/fpa/xla_vjp.py with every exponent
relative to a local hard minimum (fields.py): the kernels (backward_kernels.py)
return per-level key-side and query-side shares and one scalar per off-diagonal tile for the
gap blocks; short XLA passes spread them over the positions. Internally T is padded to a
multiple of the block (padded rows get lse = +inf, so they carry no probability).

prune=True skips the off-diagonal tiles that the forward's pruning test skips (forward.py: the
same bound on the same per-block scalars, margin 10 + log T nats), and, with segment_ids, the
tiles whose query and key blocks share no document. A skipped tile's softmax weights are below
e^-margin of its rows' mass, so its gradient terms are negligible.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.attention import fields, fields_kernels
from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias
from mixer_kernels.mosaic_gpu.attention.common import (BIG, BLOCK, LOG2E, SUPPORTED_HEAD_DIMS,
                                                        dead_key_bounds, decay, pack_rows,
                                                        row_dots)
from mixer_kernels.mosaic_gpu.attention.backward_diagonal_kernel import diagonal_shares_kernel
from mixer_kernels.mosaic_gpu.attention.backward_kernels import (KernelConfig, dkv_kernel, dq_kernel,
                                                           pack_layout)
from mixer_kernels.mosaic_gpu.attention.forward import block_norms, heads_major, pruning_margin
from mixer_kernels.mosaic_gpu.common import document_start_index
from mixer_core.interpret import interpret_active
from mixer_core.padding import pad_time, padded_length


def _pack_named(vectors, names, n):
    """The packed per-block rows of `names` (backward_kernels.pack_layout): the vectors, then
    one row of per-block scalars (read from each block's first position) -> [B, H, nb, R, n]."""
    vector_names, scalar_names = pack_layout(names)
    rows = [vectors[name] for name in vector_names]
    if scalar_names:
        b, h, tp = vectors[scalar_names[0]].shape
        firsts = [vectors[name].reshape(b, h, tp // n, n)[..., 0] for name in scalar_names]
        scalars = jnp.stack(firsts, axis=-1)                    # [B, H, nb, S]
        scalars = jnp.pad(scalars, [(0, 0)] * 3 + [(0, n - len(scalar_names))])
        rows.append(scalars.reshape(b, h, tp))
    return pack_rows(rows, n)


def _unpack(packed, index):
    """[B, H, nb, R, n] -> row `index` as [B, H, Tp]."""
    b, h, nb, _, n = packed.shape
    return packed[:, :, :, index, :].reshape(b, h, nb * n)


def _to_bth(x, length):
    return jnp.moveaxis(x[:, :, :length], 1, 2)


# The sweeps' matmul schedule per bias mode, (dq, dk/dv) (backward_kernels.KernelConfig
# overlap_dq / overlap_dkv): True issues the scores' and dP's matmuls together and forms P
# while dP's is in flight. Chosen from device time on an H200 at (4, 4096, 12, 64) and
# (8, 2048, 16, 128) (docs/benchmarks.md, "Overlapped matmul schedule"); since the tiles work
# in base 2 the overlapped dk/dv sweep of plain softmax is slower than the sequential one
# (0.323 against 0.222 ms at (8, 2048, 12, 64)), so no mode but FPA overlaps. Read when the
# backward is traced.
OVERLAP = {"fpa": (True, True), "separable": (False, False), "none": (False, False)}


def kernel_config(bias, scale, segment_ids, length, block=BLOCK, prune=False,
                  lhs_in_registers=None):
    """The static configuration of the kernels for this bias. lhs_in_registers: None picks
    registers when compiled, shared memory in the GPU interpreter."""
    if lhs_in_registers is None:
        lhs_in_registers = not interpret_active()
    fpa = isinstance(bias, FPABias)
    mode = "fpa" if fpa else "separable" if isinstance(bias, SeparableBias) else "none"
    return KernelConfig(mode=mode, scale=float(scale), block=block,
                        segments=segment_ids is not None,
                        tau=float(bias.tau) if fpa else 1.0,
                        query_level=bool(bias.query_level) if fpa else False,
                        content=bool(bias.content) if fpa else True,
                        prune=bool(prune), margin=pruning_margin(length),
                        lhs_in_registers=bool(lhs_in_registers), overlap_dq=OVERLAP[mode][0],
                        overlap_dkv=OVERLAP[mode][1])


def document_end_index(segment_ids, padded, n):
    """[B, T] contiguous document ids -> [B, Tp] float32: per key block, the last position of
    the document of its last real key (repeated over the block)."""
    length = segment_ids.shape[1]
    positions = jnp.arange(length)
    last = jnp.concatenate([segment_ids[:, 1:] != segment_ids[:, :-1],
                            jnp.ones_like(segment_ids[:, :1], bool)], axis=1)
    ends = jax.lax.cummin(jnp.where(last, positions, length), axis=1, reverse=True)
    block_last = jnp.minimum(jnp.arange(padded // n) * n + n - 1, length - 1)
    return jnp.repeat(ends[:, block_last], n, axis=-1).astype(jnp.float32)


def _per_block(x, n, reduce, real=None, fill=0.0):
    """[B, H, Tp] -> per-block reduction over (real) positions, repeated over the block."""
    if real is not None:
        x = jnp.where(real, x, fill)
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // n, n))
    return jnp.repeat(reduce(blocks, axis=-1), n, axis=-1)


def _pruning_vectors(cfg, qp, kp, vectors, length, norms=None):
    """The per-block scalars of the forward's pruning test (forward.py), [B, H, Tp] each; its
    key-level bound also reads kp, the key block's lowest level, which prepare forms for the
    share paths. norms: the forward's `block_norms` [B, H, nb, 3], else formed from qp, kp."""
    n = cfg.block
    real = (jnp.arange(qp.shape[1]) < length)[None, None, :]
    if norms is None:
        norms = block_norms(qp, kp, cfg.scale, length, n, cfg.content)
    else:
        norms = tuple(norms[..., index] for index in range(3))
    out = {name: jnp.repeat(x, n, axis=-1) for name, x in zip(("dmin", "qn", "kn"), norms)}
    if cfg.mode == "separable":
        out["rmax"] = _per_block(vectors["row"], n, jnp.max, real, -BIG)
        out["cmin"] = _per_block(vectors["col"], n, jnp.min)
    elif cfg.query_level:
        out["qc"] = _per_block(vectors["pre_min"] - vectors["psi"], n, jnp.max, real, -BIG)
        out["qp"] = _per_block(vectors["psi"], n, jnp.min, real, BIG)
    else:
        out["cmax"] = _per_block(vectors["pre_min"], n, jnp.max, real, -BIG)
    return out


def prepare(cfg, q, k, v, out, lse, dout, bias, segment_ids, norms=None):
    """XLA pre-pass: padded tiles and the packed per-block vectors the kernels read (norms:
    the forward's `block_norms`, or None to form them here)."""
    batch, length, heads, _ = q.shape
    n = cfg.block
    padded = padded_length(length, n)
    nb = padded // n
    time_pad = lambda x: pad_time(x, padded, 1)
    qp, kp, vp = (time_pad(x) for x in (q, k, v))
    dop = time_pad(dout.astype(q.dtype))
    delta = row_dots(dout, out)
    vectors = {"lse": pad_time(lse.astype(jnp.float32), padded, 2, jnp.inf),
               "delta": pad_time(delta, padded, 2)}
    if segment_ids is not None:
        starts = document_start_index(segment_ids, padded)
        vectors["seg"] = jnp.broadcast_to(starts[:, None, :], (batch, heads, padded))
    if cfg.mode == "separable":
        vectors["row"] = heads_major(bias.row, padded)
        vectors["col"] = heads_major(bias.col, padded)
    rowd = cold = jnp.zeros((1, 1, 1, 1, n), jnp.float32)
    beta = jnp.zeros((1, 1, n), jnp.float32)
    phi = None
    if cfg.mode == "fpa":
        phi = heads_major(bias.phi, padded, edge=True)
        vectors["psi"] = heads_major(bias.psi, padded)
        stats = fields.statistics(phi, n, cfg.tau)
        top = cfg.diag_levels  # the block level
        vectors.update({kind: stats.get(kind, top)
                        for kind in fields_kernels.KINDS})
        vectors["bmin"] = jnp.repeat(fields.at_block_ends(vectors["pre_min"], n), n, axis=-1)
        vectors["bmass"] = jnp.repeat(fields.at_block_ends(vectors["pre_mass"], n), n, axis=-1)
        if cfg.separable:  # per-block bounds of the share paths (backward_kernels._share_path)
            vectors["chi"] = _per_block(vectors["pre_min"], n, jnp.max)
            vectors["alo"] = _per_block(vectors["suf_min"], n, jnp.min)
            vectors["kap"], vectors["kpmax"] = dead_key_bounds(vectors["suf_min"],
                                                               vectors["psi"], n)
            vectors["kp"] = _per_block(vectors["psi"], n, jnp.min)
            # the separable path's masses weighted relative to their block's lowest piece,
            # and the key side of the bias, min(0, A_s - psi_s) (Tile.separable_weights,
            # Tile.level_gap)
            vectors["pre_wmass"] = vectors["pre_mass"] * decay(
                vectors["pre_min"] - vectors["bmin"], cfg.tau)
            vectors["suf_wmass"] = vectors["suf_mass"] * decay(
                vectors["suf_min"] - vectors["alo"], cfg.tau)
            vectors["key_gap"] = jnp.minimum(vectors["suf_min"] - vectors["psi"], 0.0)
        # the diagonal's level rows: minima of levels 0 .. top-1, then their masses (the sweep
        # kernels load only the minima, for the bias; backward_diagonal_kernel.py loads both)
        rowd, cold = stats.diagonal_pack("pre"), stats.diagonal_pack("suf")
        beta = jnp.broadcast_to(bias.beta.astype(jnp.float32)[:, None, None], (heads, 1, n))
    if cfg.skips and segment_ids is not None:
        ends = document_end_index(segment_ids, padded, n)
        vectors["dend"] = jnp.broadcast_to(ends[:, None, :], (batch, heads, padded))
    if cfg.prunes:
        vectors.update(_pruning_vectors(cfg, qp, kp, vectors, length, norms))
    if cfg.mode == "separable":   # the tiles subtract lse with the row (Tile.logits_and_bias)
        vectors["row"] = vectors["row"] - vectors.pop("lse")
    for name in ("lse", "row", "col"):   # the tiles' base 2 (backward_kernels.Tile.probs)
        if name in vectors:
            vectors[name] = vectors[name] * LOG2E
    rowp = _pack_named(vectors, cfg.row_names(), n)
    col_names = cfg.col_names()
    colp = _pack_named(vectors, col_names, n) if col_names else \
        jnp.zeros((batch, heads, nb, 1, n), jnp.float32)
    field_state = None if phi is None else (phi, stats)  # reused by finish
    return (qp, kp, vp, dop, rowp, colp, rowd, cold, beta), field_state


def run_kernels(cfg, args):
    """(dkv outputs, dq outputs, FPA's diagonal shares [B, H, nb, 2 levels, n] or None); dq
    outputs are (dq [B, Tp, H, D], row pack [B, H, nb, R, n] if the mode has row sums)."""
    diagonal = diagonal_shares_kernel(cfg, *args) if cfg.mode == "fpa" else None
    return dkv_kernel(cfg, *args), dq_kernel(cfg, *args), diagonal


def finish(cfg, kernel_outs, field_state, length, beta_dtype=jnp.float32):
    """XLA post-pass: slice off the padding, turn the kernels' sums into bias gradients.
    kernel_outs: run_kernels' result; field_state: prepare's second result (FPA: phi and its
    level statistics; None otherwise)."""
    dkv_out, dq_out, diagonal = kernel_outs
    dk, dv = dkv_out[0][:, :length], dkv_out[1][:, :length]
    dq = dq_out[0][:, :length]
    if cfg.mode == "none":
        return dq, dk, dv, ()
    colo, rowo = dkv_out[2], dq_out[1]
    if cfg.mode == "separable":
        drow = _to_bth(_unpack(rowo, 0), length)
        dcol = _to_bth(_unpack(colo, 0), length)
        return dq, dk, dv, (drow, dcol)

    batch, heads, nb = colo.shape[:3]
    levels = cfg.diag_levels
    phi, stats = field_state
    col_at = 0 if cfg.query_level else 1
    row_at = 1 if cfg.query_level else 0
    dpsi = _unpack(rowo, 0) if cfg.query_level else _unpack(colo, 0)
    row_out = cfg.row_out_names()
    dsum, pgap = (_unpack(rowo, row_out.index(name)) for name in ("dsum", "pgap"))
    dbeta = _unpack(colo, col_at).sum(axis=(0, 2)) - (dsum * pgap).sum(axis=(0, 2))  # centred
    # per block [B, H, nb, 2 (levels + 1), n]: the key side's diagonal levels and block
    # level, then the query side's
    shares = jnp.concatenate([diagonal[:, :, :, :levels], colo[:, :, :, col_at + 1:col_at + 2],
                              diagonal[:, :, :, levels:], rowo[:, :, :, row_at:row_at + 1]],
                             axis=3)
    gapo = dkv_out[3]  # [B, H, nb(j), chunks, n] -> totals[i, j]
    gap_total = jnp.swapaxes(gapo.reshape(batch, heads, nb, -1)[..., :nb], -1, -2)
    dphi = fields.field_gradient(shares, gap_total, phi, cfg.block, cfg.tau, stats)
    return (dq, dk, dv,
            (_to_bth(dphi, length), _to_bth(dpsi, length), dbeta.astype(beta_dtype)))


def _check(q, k, v, out, lse, dout, bias, segment_ids, block):
    if q.ndim != 4:
        raise ValueError(f"q: expected rank 4 [B, T, H, D], got shape {q.shape}")
    for name, x in (("k", k), ("v", v), ("out", out), ("dout", dout)):
        if x.shape != q.shape:
            raise ValueError(f"{name}: expected shape {q.shape} like q, got {x.shape}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        raise TypeError(f"q: expected bfloat16 or float16, got {q.dtype}")
    batch, length, heads, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: head dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if block != BLOCK:
        raise ValueError(f"block: only {BLOCK} is supported, got {block}")
    if lse.shape != (batch, heads, length):
        raise ValueError(f"lse: expected shape {(batch, heads, length)} [B, H, T], got {lse.shape}")
    if not isinstance(bias, (NoBias, SeparableBias, FPABias)):
        raise TypeError(f"bias: expected NoBias, SeparableBias or FPABias, got {type(bias)}")
    for field in ("row", "col", "phi", "psi"):
        x = getattr(bias, field, None)
        if x is not None and x.shape != (batch, length, heads):
            raise ValueError(f"{type(bias).__name__}.{field}: expected shape "
                             f"{(batch, length, heads)}, got {x.shape}")
    if isinstance(bias, FPABias) and bias.beta.shape != (heads,):
        raise ValueError(f"FPABias.beta: expected shape {(heads,)}, got {bias.beta.shape}")
    if segment_ids is not None and segment_ids.shape != (batch, length):
        raise ValueError(f"segment_ids: expected shape {(batch, length)}, got {segment_ids.shape}")


def attention_backward(q, k, v, out, lse, dout, bias=NoBias(), *, scale: float,
                       segment_ids: Optional[jnp.ndarray] = None, block: int = BLOCK,
                       prune: bool = False, norms: Optional[jnp.ndarray] = None):
    """Gradients of causal biased attention; see the module docstring. norms: the forward's
    pruning norms (`attention_forward(..., return_norms=True)`), used when pruning."""
    _check(q, k, v, out, lse, dout, bias, segment_ids, block)
    cfg = kernel_config(bias, scale, segment_ids, q.shape[1], block, prune)
    if norms is not None:
        expected = (q.shape[0], q.shape[2], padded_length(q.shape[1], block) // block, 3)
        if norms.shape != expected:
            raise ValueError(f"norms: expected shape {expected} [B, H, nb, 3], got {norms.shape}")
    args, field_state = prepare(cfg, q, k, v, out, lse, dout, bias, segment_ids, norms)
    beta_dtype = bias.beta.dtype if cfg.mode == "fpa" else jnp.float32
    return finish(cfg, run_kernels(cfg, args), field_state, q.shape[1], beta_dtype)
