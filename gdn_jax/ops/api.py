"""Public gated delta rule ops: argument checks, defaults, then dispatch through `REGISTRY`.

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T     S [K, V] per value head
    o_t = S_t^T (scale * q_t)                                            scale default K**-0.5

    q, k [B, T, H, K]   v [B, T, HV, V] (HV a multiple of H; value head j reads q/k head
    j // (HV // H))   g (log decay, <= 0) and beta [B, T, HV]   state [B, HV, K, V] float32
    segment_ids [B, T] int: the state restarts from zero at each token whose id differs from
    the previous token's; the first document starts from `initial_state`.
    Returns (out [B, T, HV, V] in v's dtype, final_state [B, HV, K, V] float32 or None).

q and k are used as given (the layer L2-normalises them). Gates, states and all internal
arithmetic are float32 for bf16/f16/f32 inputs (float64 only if an input is float64).

Value ranges (outside them the state grows without bound or turns NaN): g <= 0, 0 <= beta
<= 1, |k_t| <= 1 + KEY_NORM_TOLERANCE (unit keys; zero keys allowed). Checked at once on
concrete arrays (ValueError naming the argument); inside jit only in checked mode
(`mixer_core.ranges.checked_ranges` + `jax.experimental.checkify`). GatedDeltaNet keeps
them by construction: g = -exp(A_log) softplus(.) <= 0, beta = sigmoid(.), k L2-normalised.

Implementations (`REGISTRY`, op name "gated_delta_rule"; default order ("pallas", "xla")):
  "reference"  the token-by-token scan (`gdn_jax.ops.naive`); never chosen by default
  "xla"        chunked WY form (`gdn_jax.ops.chunk`), O(T * chunk) memory; runs everywhere
  "pallas"     the Mosaic GPU kernels (`mixer_kernels.mosaic_gpu.gated_delta.register`: the entry and
               its `supports`), imported here
An entry is `fn(q, k, v, g, beta, *, scale, initial_state, segment_ids, chunk_size)
-> (out [B, T, HV, V] (any float dtype; cast to v's here), final_state [B, HV, K, V] float32)`
on validated arrays (scale a number, initial_state None or an array, chunk_size a positive
int). Its `supports(**facts)` reads `platform_facts()` plus dtype, batch, seq_len, num_heads,
num_v_heads, head_dim (K), value_head_dim (V), has_segment_ids, has_initial_state and
chunk_size (docs/api.md, "Dispatch").
"""

import math

import jax.numpy as jnp
import numpy as np

from mixer_core.ranges import check_range
from gdn_jax.ops.chunk import chunked_forward
from gdn_jax.ops.naive import recurrent_forward
from mixer_kernels.mosaic_gpu.gated_delta import register as pallas_backend
from mixer_core.registry import Entry, Registry, platform_facts


def _check_rank_and_float(name, x, rank, layout):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected an array {layout}, got {type(x).__name__}")
    if x.ndim != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {x.dtype}")


def _check_shape(name, x, expected, layout):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} {layout}, got {tuple(x.shape)}")


KEY_NORM_TOLERANCE = 1e-2   # bf16 rounding of a unit key stays far below this


def _key_norms(k, xp):
    return xp.sqrt(xp.sum(xp.square(k.astype(xp.float32)), axis=-1))


def _check_ranges(k, g, beta):
    check_range("g", g, lambda x, xp: x <= 0, "log decay g <= 0 everywhere",
                lambda x, xp: xp.max(x))
    check_range("beta", beta, lambda x, xp: (x >= 0) & (x <= 1), "beta in [0, 1] everywhere",
                lambda x, xp: xp.where(xp.all(x >= 0), xp.max(x), xp.min(x)))
    check_range("k", k, lambda x, xp: _key_norms(x, xp) <= 1 + KEY_NORM_TOLERANCE,
                "L2-normalised keys (|k_t| <= 1), largest norm",
                lambda x, xp: xp.max(_key_norms(x, xp)))


def _validate(q, k, v, g, beta, scale, initial_state, segment_ids):
    _check_rank_and_float("q", q, 4, "[B, T, H, K]")
    _check_rank_and_float("k", k, 4, "[B, T, H, K]")
    _check_rank_and_float("v", v, 4, "[B, T, HV, V]")
    _check_rank_and_float("g", g, 3, "[B, T, HV]")
    _check_rank_and_float("beta", beta, 3, "[B, T, HV]")
    batch, seq_len, num_heads, key_dim = q.shape
    if seq_len == 0:
        raise ValueError("q: expected at least one time step, got T = 0")
    _check_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    if tuple(v.shape[:2]) != (batch, seq_len):
        raise ValueError(f"v: expected leading dims (B, T) = {(batch, seq_len)} as in q, "
                         f"got {tuple(v.shape[:2])}")
    num_v_heads, value_dim = v.shape[2], v.shape[3]
    if num_v_heads % num_heads != 0:
        raise ValueError(f"v: expected the number of value heads HV to be a multiple of "
                         f"H = {num_heads} (q heads), got HV = {num_v_heads}")
    _check_shape("g", g, (batch, seq_len, num_v_heads), "[B, T, HV]")
    _check_shape("beta", beta, (batch, seq_len, num_v_heads), "[B, T, HV]")
    if initial_state is not None:
        _check_rank_and_float("initial_state", initial_state, 4, "[B, HV, K, V]")
        _check_shape("initial_state", initial_state, (batch, num_v_heads, key_dim, value_dim),
                     "[B, HV, K, V]")
    if segment_ids is not None:
        if not hasattr(segment_ids, "shape") or not hasattr(segment_ids, "dtype"):
            raise TypeError(f"segment_ids: expected an integer array [B, T], "
                            f"got {type(segment_ids).__name__}")
        if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
            raise TypeError(f"segment_ids: expected an integer dtype, got {segment_ids.dtype}")
        _check_shape("segment_ids", segment_ids, (batch, seq_len), "[B, T]")
    if scale is not None and isinstance(scale, (int, float, np.number)) and not scale > 0:
        raise ValueError(f"scale: expected a positive number, got {scale}")
    _check_ranges(k, g, beta)


def _prepare(q, k, v, g, beta, scale, initial_state, segment_ids, output_final_state):
    _validate(q, k, v, g, beta, scale, initial_state, segment_ids)
    if not isinstance(output_final_state, (bool, np.bool_)):
        raise TypeError(f"output_final_state: expected a bool, got "
                        f"{type(output_final_state).__name__}")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _finish(out, final_state, v, output_final_state):
    return out.astype(v.dtype), (final_state if output_final_state else None)


def _reference(q, k, v, g, beta, *, scale, initial_state, segment_ids, chunk_size):
    del chunk_size  # token by token
    return recurrent_forward(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                             segment_ids=segment_ids)


def _xla(q, k, v, g, beta, *, scale, initial_state, segment_ids, chunk_size):
    return chunked_forward(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           segment_ids=segment_ids, chunk_size=chunk_size)


REGISTRY = Registry("gated_delta_rule", default_order=("pallas", "xla"), entries=(
    Entry("reference", _reference),
    Entry("xla", _xla),
    Entry("pallas", pallas_backend.gated_delta_rule_pallas, supports=pallas_backend.supports),
))


def input_facts(q, v, initial_state, segment_ids, chunk_size):
    """The facts of the op's inputs that `supports` reads besides the platform's (q, v, the
    initial state: arrays or anything with .shape and .dtype)."""
    batch, seq_len, num_heads, key_dim = q.shape
    return {"dtype": jnp.dtype(q.dtype), "batch": batch, "seq_len": seq_len,
            "num_heads": num_heads, "num_v_heads": v.shape[2], "head_dim": key_dim,
            "value_head_dim": v.shape[3], "has_segment_ids": segment_ids is not None,
            "has_initial_state": initial_state is not None, "chunk_size": chunk_size}


def keeps_chunk_states(implementation=None, **facts) -> bool:
    """Whether the implementation `gated_delta_rule` runs on inputs with these `facts` (those
    of `supports`, less the platform's, which are added here) keeps the chunk-entering states
    [N, B, HV, K, V] float32 for its backward pass: "xla" does, "pallas" only with its
    `RESIDUALS = "internals"`; "reference" keeps them per token (True: at least these).
    Raises ValueError where `gated_delta_rule` would (an unknown or unsupported name)."""
    name, _ = REGISTRY.select(implementation, **platform_facts(), **facts)
    return pallas_backend.keeps_chunk_states() if name == "pallas" else True


def recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                               output_final_state=False, segment_ids=None):
    """Token-by-token oracle (a `lax.scan` over T; autodiff stores every state).

    Arguments and result as in `gated_delta_rule`. For tests and short sequences.
    """
    scale = _prepare(q, k, v, g, beta, scale, initial_state, segment_ids, output_final_state)
    out, final_state = recurrent_forward(q, k, v, g, beta, scale=scale,
                                         initial_state=initial_state, segment_ids=segment_ids)
    return _finish(out, final_state, v, output_final_state)


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     output_final_state=False, segment_ids=None, chunk_size=64,
                     implementation=None):
    """Gated delta rule (decay first, then delta update), as in the module docstring.

    Args:
      q, k: [B, T, H, K] floating; used as given (no normalisation here).
      v: [B, T, HV, V] floating, HV a multiple of H. Output has v's dtype.
      g: [B, T, HV] log decay (alpha = exp(g)); beta: [B, T, HV] write strength.
      scale: query scale, default K**-0.5.
      initial_state: optional [B, HV, K, V] floating; zeros if None.
      output_final_state: also return the state after the last token.
      segment_ids: optional [B, T] integer document ids of packed sequences.
      chunk_size: chunk length C of the chunked paths (positive int).
      implementation: None (the first of `REGISTRY.default_order` that supports the inputs)
        or a name in `REGISTRY` ("xla", "reference", ...).

    Returns:
      (out [B, T, HV, V], final_state [B, HV, K, V] float32 or None).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
        raise TypeError(f"chunk_size: expected a positive int, got {type(chunk_size).__name__}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size}")
    scale = _prepare(q, k, v, g, beta, scale, initial_state, segment_ids, output_final_state)
    chunk_size = int(chunk_size)
    _, fn = REGISTRY.select(implementation,
                            **platform_facts(),
                            **input_facts(q, v, initial_state, segment_ids, chunk_size))
    out, final_state = fn(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          segment_ids=segment_ids, chunk_size=chunk_size)
    return _finish(out, final_state, v, output_final_state)
