"""Differentiable Pallas attention: the kernel forward and backward tied by jax.custom_vjp.

    fpa_pallas(q, k, v, phi, psi, beta, segment_ids, *, scale, tau, query_level, content,
               block_size=None) -> out
    fox_pallas(q, k, v, log_forget, segment_ids, *, scale, block_size=None) -> out
    softmax_pallas(q, k, v, segment_ids, alibi_slopes, *, scale, block_size=None) -> out
    pallas_supports(**facts) -> None | reason

Signatures follow docs/api.md "Dispatch". q, k, v [B, T, H, D] bf16 / fp16 (float32 only in
the GPU interpreter), D in {64, 128}; out in q's dtype. The forward (forward.py) saves out and
lse [B, H, T]; the backward (backward.py) recomputes the tiles. Bias gradients flow through
plain JAX around the custom VJP: FoX's row = col = cumsum(log_forget) (d log_forget is the
reverse cumulative sum of d row + d col, both sums of the same float32 dS). FPA and
the separable biases (FoX, ALiBi) save the output in float32 as the residual, so that
Delta_t = <dout_t, out_t> carries no rounding of out: d log_forget_u sums dS over the pairs
s < u <= t, where a per-row error e_t of Delta enters as e_t sum_{s<u} P_ts and does not
cancel (relative error of d log_forget at (1, 200, 2, 64), gates sigmoid(5 + N(0, 1)), four
draws: 1.4e-3 .. 4.6e-3 from the bf16 out, 1.2e-3 .. 2.5e-3 from the float32 one).
The residual costs 4 bytes per output element instead of 2. With pruning the biased ops also
keep the forward's per-block norms of the pruning test ([B, H, nb, 3], forward.block_norms),
so the backward does not reduce q and k over D again. The FPA backward also centres
dbeta per row (backward_kernels.py). ALiBi's
row = col = -slope * t (d slope from them). block_size is a tuning knob of the "xla" paths; the
kernels use their own block of 64 (the result does not depend on it).

Pruning (prune=True, the default): the forward skips off-diagonal tiles whose weight is below
e^-(10 + log T) of the row (forward.py) and the backward skips the same tiles (the same test on
the same per-block scalars), plus, with segment_ids, tiles that lie in no common document.
prune=False computes every causal tile in both.

Each kernel call goes through one `jax.jit` per static configuration (`_program`): the layers
of a model that call the kernels with equal shapes then share one traced program, which JAX
lowers once per compiled step (Mosaic GPU's layout inference takes seconds per kernel, so a
12-layer model otherwise lowers 36 copies of the same kernels).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mixer_kernels.mosaic_gpu.attention.backward import attention_backward
from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias
from mixer_kernels.mosaic_gpu.attention.common import SUPPORTED_HEAD_DIMS
from mixer_kernels.mosaic_gpu.attention.forward import attention_forward
from mixer_core.registry import mosaic_gpu_reason


@functools.lru_cache(maxsize=None)
def _program(fn, static):
    """jax.jit(fn) with the hashable `static` bound as its last argument. (GPU interpret mode
    is a JAX config state, so jit keeps its interpreted and compiled traces apart.)"""
    return jax.jit(lambda *arrays: fn(*arrays, static))


def _segment_cotangent(segment_ids):
    return None if segment_ids is None else np.zeros(segment_ids.shape, jax.dtypes.float0)


# ----------------------------------------------------------------------------- FPA


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _fpa(q, k, v, phi, psi, beta, segment_ids, static):
    return _fpa_fwd(q, k, v, phi, psi, beta, segment_ids, static)[0]


def _fpa_bias(phi, psi, beta, static):
    _, tau, query_level, content, _ = static
    return FPABias(phi, psi, beta, tau=tau, query_level=query_level, content=content)


def _fpa_forward(q, k, v, phi, psi, beta, segment_ids, static):
    """(out, lse, out32, norms or None)."""
    scale, *_, prune = static
    return attention_forward(q, k, v, _fpa_bias(phi, psi, beta, static), scale=scale,
                             segment_ids=segment_ids, prune=prune, float32_out=True,
                             return_norms=True)


def _fpa_backward(q, k, v, phi, psi, beta, segment_ids, out, lse, norms, dout, static):
    return attention_backward(q, k, v, out, lse, dout, _fpa_bias(phi, psi, beta, static),
                              scale=static[0], segment_ids=segment_ids, prune=static[-1],
                              norms=norms)


def _fpa_fwd(q, k, v, phi, psi, beta, segment_ids, static):
    out, lse, out32, norms = _program(_fpa_forward, static)(q, k, v, phi, psi, beta,
                                                            segment_ids)
    return out, (q, k, v, phi, psi, beta, segment_ids, out32, lse, norms)


def _fpa_bwd(static, residuals, dout):
    dq, dk, dv, (dphi, dpsi, dbeta) = _program(_fpa_backward, static)(*residuals, dout)
    q, k, v, phi, psi, beta, segment_ids, out, lse, _ = residuals
    return (dq, dk, dv, dphi.astype(phi.dtype), dpsi.astype(psi.dtype), dbeta,
            _segment_cotangent(segment_ids))


_fpa.defvjp(_fpa_fwd, _fpa_bwd)


def fpa_pallas(q, k, v, phi, psi, beta, segment_ids, *, scale, tau=1.0, query_level=False,
               content=True, block_size=None, prune=True):
    """FPA attention through the kernels; see the module docstring."""
    del block_size
    static = (float(scale), float(tau), bool(query_level), bool(content), bool(prune))
    return _fpa(q, k, v, phi, psi, beta, segment_ids, static)


# ----------------------------------------------------------------------------- separable / none


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _separable(q, k, v, row, col, segment_ids, scale, prune):
    return _separable_fwd(q, k, v, row, col, segment_ids, scale, prune)[0]


def _separable_forward(q, k, v, row, col, segment_ids, static):
    """(out, lse, out32, norms or None)."""
    scale, prune = static
    return attention_forward(q, k, v, SeparableBias(row, col), scale=scale,
                             segment_ids=segment_ids, prune=prune, float32_out=True,
                             return_norms=True)


def _separable_backward(q, k, v, row, col, segment_ids, out, lse, norms, dout, static):
    scale, prune = static
    return attention_backward(q, k, v, out, lse, dout, SeparableBias(row, col), scale=scale,
                              segment_ids=segment_ids, prune=prune, norms=norms)


def _separable_fwd(q, k, v, row, col, segment_ids, scale, prune):
    out, lse, out32, norms = _program(_separable_forward, (scale, prune))(q, k, v, row, col,
                                                                         segment_ids)
    return out, (q, k, v, row, col, segment_ids, out32, lse, norms)


def _separable_bwd(scale, prune, residuals, dout):
    dq, dk, dv, (drow, dcol) = _program(_separable_backward, (scale, prune))(*residuals, dout)
    segment_ids = residuals[5]
    return dq, dk, dv, drow, dcol, _segment_cotangent(segment_ids)


_separable.defvjp(_separable_fwd, _separable_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _plain(q, k, v, segment_ids, scale, prune):
    return _plain_fwd(q, k, v, segment_ids, scale, prune)[0]


def _plain_forward(q, k, v, segment_ids, static):
    scale, prune = static
    return attention_forward(q, k, v, NoBias(), scale=scale, segment_ids=segment_ids,
                             prune=prune)


def _plain_backward(q, k, v, segment_ids, out, lse, dout, static):
    scale, prune = static
    dq, dk, dv, _ = attention_backward(q, k, v, out, lse, dout, NoBias(), scale=scale,
                                       segment_ids=segment_ids, prune=prune)
    return dq, dk, dv


def _plain_fwd(q, k, v, segment_ids, scale, prune):
    out, lse = _program(_plain_forward, (scale, prune))(q, k, v, segment_ids)
    return out, (q, k, v, segment_ids, out, lse)


def _plain_bwd(scale, prune, residuals, dout):
    dq, dk, dv = _program(_plain_backward, (scale, prune))(*residuals, dout)
    segment_ids = residuals[3]
    return dq, dk, dv, _segment_cotangent(segment_ids)


_plain.defvjp(_plain_fwd, _plain_bwd)


def fox_pallas(q, k, v, log_forget, segment_ids, *, scale, block_size=None, prune=True):
    """FoX attention: bias_ts = c_t - c_s, c = cumsum(log_forget) in float32."""
    del block_size
    cumulative = jnp.cumsum(log_forget.astype(jnp.float32), axis=1)
    return _separable(q, k, v, cumulative, cumulative, segment_ids, float(scale), bool(prune))


def softmax_pallas(q, k, v, segment_ids, alibi_slopes, *, scale, block_size=None, prune=True):
    """Causal softmax attention, with ALiBi (-slope (t - s)) when alibi_slopes is given."""
    del block_size
    if alibi_slopes is None:
        return _plain(q, k, v, segment_ids, float(scale), bool(prune))
    batch, length, heads, _ = q.shape
    position = jnp.arange(length, dtype=jnp.float32)[:, None]
    term = jnp.broadcast_to(-position * alibi_slopes.astype(jnp.float32), (batch, length, heads))
    return _separable(q, k, v, term, term, segment_ids, float(scale), bool(prune))


# ----------------------------------------------------------------------------- dispatch


def pallas_supports(**facts):
    """None if the kernels run on these inputs, else why not (docs/api.md "Dispatch")."""
    reason = mosaic_gpu_reason(facts)
    if reason is not None:
        return reason
    head_dim = facts.get("head_dim")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"needs head_dim in {SUPPORTED_HEAD_DIMS}, got {head_dim}"
    if facts.get("value_head_dim", head_dim) != head_dim:
        return f"needs value_head_dim == head_dim, got {facts.get('value_head_dim')} != {head_dim}"
    return None
