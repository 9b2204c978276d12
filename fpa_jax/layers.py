"""Flax Linen attention layers: FPA and the attention baselines it is compared with.

Every layer maps x [B, T, D] to y [B, T, D] with causal multi-head attention:

    q, k, v = x @ W_query, x @ W_key, x @ W_value          [B, T, H, head_dim]  (W_*: [D, H, head_dim])
    o       = attention_op(q, k, v, <layer-specific bias>)  [B, T, H, head_dim]
    y       = o @ W_out                                     [B, T, D]            (W_out: [H, head_dim, D])

with scale 1/sqrt(head_dim). The layer-specific part:

    FPAAttention        delta, g, h = x @ W + c per head   [B, T, H]  (delta_proj, field_proj, level_proj)
                        phi, psi = fields(delta, g, h);  beta = softplus(rho)  [H]
                        bias_ts = beta * min(0, min_{s<u<=t} phi_u - psi_s)   (fpa_attention; no RoPE)
    FoXAttention        log f = log_sigmoid(x @ W_f + b_f)  [B, T, H]         (forget_proj; no RoPE)
                        bias_ts = sum_{s<u<=t} log f_u                         (fox_attention)
    SoftmaxAttention    RoPE on q, k ("rope"), nothing ("nope"), or ALiBi slopes ("alibi")
    SelectiveAttention  selection logits = head 0's scaled q.k, shared by all heads (selective_attention)
    DCPAttention        mask logits_ts = <a_t, b_s> / sqrt(r) + c, a = x @ W_a, b = x @ W_b  [B, T, r]
                        shared by all heads (dcp_attention)

`__call__(x, *, segment_ids=None, positions=None)`: segment_ids [B, T] int marks packed documents
(equal id = same document, documents contiguous; no attention across them); positions [B, T] int
feed RoPE and default to 0, 1, 2, ... restarting at every document start.

Parameters carry logical axis names: projection kernels ("embed", "heads", "head_dim"), output
kernel ("heads", "head_dim", "embed"), scalar-map kernels ("embed", "heads"), per-head vectors
("heads",), DCP's low-rank mask kernels ("embed", "mask_rank") and its scalar offset ().
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from fpa_jax.baselines.dcp import dcp_attention
from fpa_jax.baselines.dipsum import dipsum_attention
from fpa_jax.baselines.fox import fox_attention
from fpa_jax.baselines.rope import alibi_slopes, apply_rope
from fpa_jax.baselines.selective import selective_attention
from fpa_jax.baselines.softmax import softmax_attention
from fpa_jax.fpa.api import fpa_attention
from fpa_jax.fpa.fields import document_starts, fields

Dtype = Any

PROJECTION_AXES = ("embed", "heads", "head_dim")
OUTPUT_AXES = ("heads", "head_dim", "embed")
SCALAR_MAP_AXES = ("embed", "heads")
PER_HEAD_AXES = ("heads",)

DEFAULT_FORGET_INIT_RANGE = (0.95, 0.99)
SOFTMAX_POSITIONS = ("rope", "nope", "alibi")
SELECTIVE_POSITIONS = ("rope", "nope")
DENSE_ONLY_IMPLEMENTATIONS = (None, "reference")


# ----------------------------------------------------------------------------------------------
# Initialisers
# ----------------------------------------------------------------------------------------------


def per_head_forget_values(num_heads: int, forget_init_range=DEFAULT_FORGET_INIT_RANGE) -> np.ndarray:
    """Initial forget gates f_h, one per head, spread over `forget_init_range` = (low, high).

    The decay rates -log f_h are geometrically spaced between -log(low) and -log(high), so the
    heads start with time-scales 1/(-log f_h) spread evenly on a log scale (about 20 to 100
    tokens for the default (0.95, 0.99)). A single head gets the geometric middle.
    """
    low, high = forget_init_range
    rate_fast, rate_slow = -math.log(low), -math.log(high)
    if num_heads == 1:
        rates = np.array([math.sqrt(rate_fast * rate_slow)])
    else:
        rates = np.exp(np.linspace(math.log(rate_fast), math.log(rate_slow), num_heads))
    return np.exp(-rates)


def _constant_vector_init(values: np.ndarray):
    """Initialiser returning the given per-head vector (shape must match)."""

    def init(key, shape, dtype=jnp.float32):
        del key
        if tuple(shape) != values.shape:
            raise ValueError(f"per-head init: expected shape {values.shape}, got {tuple(shape)}")
        return jnp.asarray(values, dtype)

    return init


def _logical(init, axes):
    return nn.with_logical_partitioning(init, axes)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _check_positive_int(layer: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{layer}: {name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value}")


def _check_positive_float(layer: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{layer}: {name} must be a positive number, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{layer}: {name} must be a positive finite number, got {value}")


def _check_choice(layer: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{layer}: {name} must be one of {list(choices)}, got {value!r}")


def _check_float_dtype(layer: str, name: str, value) -> None:
    try:
        ok = jnp.issubdtype(jnp.dtype(value), jnp.floating)
    except TypeError:
        ok = False
    if not ok:
        raise TypeError(f"{layer}: {name} must be a floating dtype, got {value!r}")


def _check_common(module) -> None:
    layer = type(module).__name__
    _check_positive_int(layer, "num_heads", module.num_heads)
    _check_positive_int(layer, "head_dim", module.head_dim)
    _check_float_dtype(layer, "dtype", module.dtype)
    _check_float_dtype(layer, "param_dtype", module.param_dtype)


def _check_forget_init_range(layer: str, value) -> None:
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(f, (int, float)) and 0.0 < f < 1.0 for f in value)
        and value[0] <= value[1]
    )
    if not ok:
        raise ValueError(
            f"{layer}: forget_init_range must be (low, high) with 0 < low <= high < 1, got {value!r}"
        )


def _check_dense_only(layer: str, what: str, implementation) -> None:
    if implementation not in DENSE_ONLY_IMPLEMENTATIONS:
        raise ValueError(
            f"{layer}: {what} has only a dense reference op; implementation must be one of "
            f"{list(DENSE_ONLY_IMPLEMENTATIONS)}, got {implementation!r}"
        )


def _check_inputs(layer: str, x, segment_ids, positions) -> None:
    if x.ndim != 3:
        raise ValueError(f"{layer}: x must have shape [batch, length, model_dim], got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{layer}: x must be floating point, got dtype {x.dtype}")
    for name, value in (("segment_ids", segment_ids), ("positions", positions)):
        if value is None:
            continue
        if value.shape != x.shape[:2]:
            raise ValueError(
                f"{layer}: {name} must have shape {x.shape[:2]} (x's [batch, length]), got {value.shape}"
            )
        if not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{layer}: {name} must be an integer array, got dtype {value.dtype}")


# ----------------------------------------------------------------------------------------------
# Shared building blocks (called inside the layers' compact __call__)
# ----------------------------------------------------------------------------------------------


def positions_within_segments(segment_ids, batch: int, length: int):
    """0, 1, 2, ... along the sequence, restarting at each document start. Returns [B, T] int32."""
    steps = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if segment_ids is None:
        return steps
    segment_start = jax.lax.cummax(jnp.where(document_starts(segment_ids), steps, 0), axis=1)
    return steps - segment_start


def _check_rope(layer: str, module) -> None:
    _check_positive_float(layer, "rope_base", module.rope_base)
    if module.position == "rope" and module.head_dim % 2:
        raise ValueError(f"{layer}: position='rope' needs an even head_dim, got {module.head_dim}")


def _rotate(module, q, k, x, segment_ids, positions):
    """RoPE on q and k [B, T, H, D]; positions default to restarting at each document."""
    if positions is None:
        positions = positions_within_segments(segment_ids, *x.shape[:2])
    return (apply_rope(q, positions, base=module.rope_base),
            apply_rope(k, positions, base=module.rope_base))


def _head_projections(module, x, names):
    """q/k/v-style projections x [B,T,D] -> [B,T,H,head_dim], one DenseGeneral per name."""
    return [
        nn.DenseGeneral(
            features=(module.num_heads, module.head_dim),
            axis=-1,
            use_bias=False,
            dtype=module.dtype,
            param_dtype=module.param_dtype,
            kernel_init=_logical(nn.initializers.lecun_normal(), PROJECTION_AXES),
            name=name,
        )(x)
        for name in names
    ]


def _output_projection(module, heads_out, model_dim: int):
    """[B,T,H,head_dim] -> [B,T,D] through the "out" kernel [H, head_dim, D]."""
    return nn.DenseGeneral(
        features=model_dim,
        axis=(-2, -1),
        use_bias=False,
        dtype=module.dtype,
        param_dtype=module.param_dtype,
        kernel_init=_logical(nn.initializers.lecun_normal(), OUTPUT_AXES),
        name="out",
    )(heads_out)


def _per_head_scalar_map(module, x, name: str, bias_init=nn.initializers.zeros):
    """x [B,T,D] -> float32 [B,T,H]: <w_h, x_t> + c_h; kernel [D, H] starts at zero."""
    return nn.Dense(
        features=module.num_heads,
        use_bias=True,
        dtype=jnp.float32,
        param_dtype=module.param_dtype,
        kernel_init=_logical(nn.initializers.zeros, SCALAR_MAP_AXES),
        bias_init=_logical(bias_init, PER_HEAD_AXES),
        name=name,
    )(x)


def _scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------


class FPAAttention(nn.Module):
    """Causal attention with the FPA field/level path-minimum bias (no positional encoding).

        delta = x @ W_delta + c_delta,  g = x @ W_g + c_g,  h = x @ W_h + c_h     [B, T, H]
        phi, psi = fields(delta, g, h)   (W = cumsum delta; phi = W + g; psi = W + h)
        logit_ts = q_t.k_s / sqrt(head_dim) + softplus(rho) * min(0, min_{s<u<=t} phi_u - psi_s)

    Parameters: query, key, value, out (kernels); delta_proj, field_proj (g), level_proj (h)
    (kernel [D, H] + bias [H] each); rho [H].

    Switches:
      stack_form    g = h = 0 (no field_proj / level_proj).
      key_level     False: h = 0, so psi = W (no level_proj).
      query_level   compare with the query's level psi_t instead of the key's psi_s.
      content       False: no q.k term (no query / key params); logits are the bias alone.
      dip_sum       sum of dips, beta * sum_{s<u<=t} min(0, phi_u - psi_s), instead of the
                    range minimum (dense reference op, so implementation None or "reference";
                    needs content=True, query_level=False). With the init below its bias
                    starts as c_delta * (t - s) (t - s + 1) / 2: quadratic, not FoX's linear decay.
      use_bias      False: plain causal softmax attention without positions (NoPE) and no
                    bias parameters -- the "bias off in the first layer" setting.
      tau           temperature of the straight-through soft minimum used for the gradient.

    Initialisation (chosen so that FPA starts as FoX with a constant per-head forget gate):
      * W_delta = 0 and c_delta = log f_h with f_h spread geometrically over
        forget_init_range (default 0.95..0.99, i.e. decay time-scales of about 20..100 tokens).
        FoX's delta is log sigmoid(.) <= 0 by construction; FPA's delta is a free linear map
        that may turn positive during training, but at init delta = c_delta < 0, a mildly
        negative decay like a FoX gate. A zero kernel still receives gradient
        (dL/dW_delta = sum_t x_t dL/ddelta_t); it only keeps the initial walk data-independent
        and strictly decreasing.
      * W_g = W_h = 0 and c_g = c_h = 0, so phi = psi = W. With a non-increasing walk the range
        minimum is min_{s<u<=t} W_u = W_t, hence bias_ts = W_t - W_s = sum_{s<u<=t} delta_u:
        exactly FoX's bias (here the ALiBi-like bias c_delta * (t - s)). Keys are "dead"
        (R_ts < psi_s) wherever the walk fell, so the straight-through gradient reaches g and h
        from the first step.
      * query_level=True: the init above would make every gap R_ts - psi_t = W_t - W_t = 0, a
        tie with zero bias and zero straight-through gradient for ever. So with query levels
        c_delta = -log f_h > 0 instead: the walk rises, R_ts = W_{s+1}, and
        bias_ts = beta * (W_{s+1} - W_t) = log f_h * (t - s - 1), FoX's decay one step later.
      * rho = log(e - 1), so beta = softplus(rho) = 1, FoX's scale.
      * q/k/v/out kernels: LeCun normal (variance 1/fan_in).
    """

    num_heads: int
    head_dim: int
    stack_form: bool = False
    key_level: bool = True
    query_level: bool = False
    content: bool = True
    dip_sum: bool = False
    use_bias: bool = True
    tau: float = 1.0
    forget_init_range: tuple = DEFAULT_FORGET_INIT_RANGE
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    def _check_config(self) -> None:
        layer = type(self).__name__
        _check_common(self)
        _check_positive_float(layer, "tau", self.tau)
        _check_forget_init_range(layer, self.forget_init_range)
        if not self.use_bias and not self.content:
            raise ValueError(f"{layer}: use_bias=False with content=False leaves no attention logits")
        if self.use_bias and self.dip_sum and (self.query_level or not self.content):
            raise ValueError(
                f"{layer}: dip_sum=True supports only key levels with content "
                f"(query_level=False, content=True), got query_level={self.query_level}, "
                f"content={self.content}"
            )
        if self.use_bias and self.dip_sum:
            _check_dense_only(layer, "dip_sum=True", self.implementation)

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        """x [B,T,D] -> [B,T,D]. `positions` is accepted for a uniform interface and unused (no RoPE)."""
        self._check_config()
        _check_inputs(type(self).__name__, x, segment_ids, positions)
        scale = _scale(self.head_dim)

        if not self.use_bias:
            q, k, v = _head_projections(self, x, ("query", "key", "value"))
            out = softmax_attention(q, k, v, scale=scale, segment_ids=segment_ids,
                                    implementation=self.implementation)
            return _output_projection(self, out, x.shape[-1])

        if self.content:
            q, k, v = _head_projections(self, x, ("query", "key", "value"))
        else:
            (v,) = _head_projections(self, x, ("value",))
            q = k = jnp.zeros_like(v)  # ignored by the op when content=False

        decay_rate = -np.log(per_head_forget_values(self.num_heads, self.forget_init_range))
        delta_init = decay_rate if self.query_level else -decay_rate
        delta = _per_head_scalar_map(self, x, "delta_proj", _constant_vector_init(delta_init))
        zeros = jnp.zeros_like(delta)
        g = zeros if self.stack_form else _per_head_scalar_map(self, x, "field_proj")
        h = _per_head_scalar_map(self, x, "level_proj") if (self.key_level and not self.stack_form) else zeros
        phi, psi = fields(delta, g, h, segment_ids=segment_ids)

        rho = self.param(
            "rho",
            _logical(nn.initializers.constant(math.log(math.expm1(1.0))), PER_HEAD_AXES),
            (self.num_heads,),
            self.param_dtype,
        )
        beta = jax.nn.softplus(rho.astype(jnp.float32))

        if self.dip_sum:
            out = dipsum_attention(q, k, v, phi, psi, beta, scale=scale, segment_ids=segment_ids)
        else:
            out = fpa_attention(
                q, k, v, phi, psi, beta, scale=scale, tau=self.tau, segment_ids=segment_ids,
                implementation=self.implementation, query_level=self.query_level, content=self.content,
            )
        return _output_projection(self, out, x.shape[-1])


class FoXAttention(nn.Module):
    """Forgetting attention (FoX): softmax attention plus the summed log forget gates, no RoPE.

        log f = log_sigmoid(x @ W_f + b_f)       [B, T, H]   (forget_proj)
        logit_ts = q_t.k_s / sqrt(head_dim) + sum_{s<u<=t} log f_u

    Initialisation: W_f = 0 and b_f = logit(f_h) with the same per-head spread of forget gates
    as FPAAttention (forget_init_range, default 0.95..0.99): the gates start high, so attention
    starts long-range with decay time-scales of about 20..100 tokens, and the layer starts as
    exactly the same function as an FPAAttention with the same q/k/v/out weights. The zero
    kernel receives gradient from the first step. q/k/v/out kernels: LeCun normal.
    """

    num_heads: int
    head_dim: int
    forget_init_range: tuple = DEFAULT_FORGET_INIT_RANGE
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        """x [B,T,D] -> [B,T,D]. `positions` is accepted for a uniform interface and unused (no RoPE)."""
        layer = type(self).__name__
        _check_common(self)
        _check_forget_init_range(layer, self.forget_init_range)
        _check_inputs(layer, x, segment_ids, positions)

        q, k, v = _head_projections(self, x, ("query", "key", "value"))
        forget = per_head_forget_values(self.num_heads, self.forget_init_range)
        forget_logit = _per_head_scalar_map(self, x, "forget_proj",
                                            _constant_vector_init(np.log(forget / (1.0 - forget))))
        log_forget = jax.nn.log_sigmoid(forget_logit)
        out = fox_attention(q, k, v, log_forget, scale=_scale(self.head_dim), segment_ids=segment_ids,
                            implementation=self.implementation)
        return _output_projection(self, out, x.shape[-1])


class SoftmaxAttention(nn.Module):
    """Causal softmax attention with RoPE ("rope"), no positions ("nope") or ALiBi ("alibi").

    RoPE rotates q and k by `positions` (default: restarting at each document) with base
    rope_base. ALiBi adds -slope_h * (t - s) with the standard geometric slopes.
    Parameters: query, key, value, out (LeCun normal).
    """

    num_heads: int
    head_dim: int
    position: str = "rope"
    rope_base: float = 10000.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        layer = type(self).__name__
        _check_common(self)
        _check_choice(layer, "position", self.position, SOFTMAX_POSITIONS)
        _check_rope(layer, self)
        _check_inputs(layer, x, segment_ids, positions)

        q, k, v = _head_projections(self, x, ("query", "key", "value"))
        slopes = None
        if self.position == "rope":
            q, k = _rotate(self, q, k, x, segment_ids, positions)
        elif self.position == "alibi":
            slopes = alibi_slopes(self.num_heads)
        out = softmax_attention(q, k, v, scale=_scale(self.head_dim), segment_ids=segment_ids,
                                alibi_slopes=slopes, implementation=self.implementation)
        return _output_projection(self, out, x.shape[-1])


class SelectiveAttention(nn.Module):
    """Selective Attention: one layer-shared soft mask built from head 0's attention logits.

        selection_logits_us = <q_u, k_s> / sqrt(head_dim) of head 0 (after RoPE)   [B, T, T]
        logit_ts = q_t.k_s / sqrt(head_dim) - sum_{s<u<t} relu(selection_logits_us)  (every head)

    The selection reuses head 0's query/key, so there are no extra parameters: query, key,
    value, out (LeCun normal). Dense [B, T, T] selection logits: for short sequences (probes).
    """

    num_heads: int
    head_dim: int
    position: str = "rope"
    rope_base: float = 10000.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        layer = type(self).__name__
        _check_common(self)
        _check_choice(layer, "position", self.position, SELECTIVE_POSITIONS)
        _check_dense_only(layer, "Selective Attention", self.implementation)
        _check_rope(layer, self)
        _check_inputs(layer, x, segment_ids, positions)

        q, k, v = _head_projections(self, x, ("query", "key", "value"))
        if self.position == "rope":
            q, k = _rotate(self, q, k, x, segment_ids, positions)
        scale = _scale(self.head_dim)
        selection_logits = scale * jnp.einsum(
            "bud,bsd->bus", q[:, :, 0], k[:, :, 0], preferred_element_type=jnp.float32
        )
        out = selective_attention(q, k, v, selection_logits, scale=scale, segment_ids=segment_ids)
        return _output_projection(self, out, x.shape[-1])


class DCPAttention(nn.Module):
    """DCP-style attention: a layer-shared, path-accumulated keep mask from low-rank scores.

        a = x @ W_mask_query,  b = x @ W_mask_key                 [B, T, r]   (r = mask_rank)
        mask_logits_us = <a_u, b_s> / sqrt(r) + mask_offset       [B, T, T]   (shared by all heads)
        logit_ts = q_t.k_s / sqrt(head_dim) + sum_{s<u<=t} log_sigmoid(mask_logits_us)

    The low-rank "interaction" queries and keys (Dynamic Context Pruning) let every later token
    u vote to keep or drop an earlier key s; dcp_attention accumulates the votes along the path.
    No positional encoding. Parameters: query, key, value, out; mask_query, mask_key (kernels
    [D, r], logical axes ("embed", "mask_rank")); mask_offset (scalar).

    Initialisation: W_mask_query, W_mask_key LeCun normal (so <a_u, b_s> / sqrt(r) is about
    N(0, 1) for unit-scale x; neither factor may start at zero, or the other gets no gradient)
    and mask_offset = logit(keep_init) (default 0.99): keys start almost kept, keep
    probabilities about sigmoid(4.6 +- 1) = 0.97..0.996 per token, like slow FoX gates.
    mask_rank defaults to head_dim. Dense [B, T, T] mask logits: for short sequences (probes).
    """

    num_heads: int
    head_dim: int
    mask_rank: int | None = None
    keep_init: float = 0.99
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        """x [B,T,D] -> [B,T,D]. `positions` is accepted for a uniform interface and unused."""
        layer = type(self).__name__
        _check_common(self)
        rank = self.head_dim if self.mask_rank is None else self.mask_rank
        _check_positive_int(layer, "mask_rank", rank)
        if not (isinstance(self.keep_init, float) and 0.0 < self.keep_init < 1.0):
            raise ValueError(f"{layer}: keep_init must be a float in (0, 1), got {self.keep_init!r}")
        _check_dense_only(layer, "DCP attention", self.implementation)
        _check_inputs(layer, x, segment_ids, positions)

        q, k, v = _head_projections(self, x, ("query", "key", "value"))
        mask_axes = ("embed", "mask_rank")
        mask_query = nn.Dense(rank, use_bias=False, dtype=jnp.float32, param_dtype=self.param_dtype,
                              kernel_init=_logical(nn.initializers.lecun_normal(), mask_axes),
                              name="mask_query")(x)
        mask_key = nn.Dense(rank, use_bias=False, dtype=jnp.float32, param_dtype=self.param_dtype,
                            kernel_init=_logical(nn.initializers.lecun_normal(), mask_axes),
                            name="mask_key")(x)
        mask_offset = self.param(
            "mask_offset",
            _logical(nn.initializers.constant(math.log(self.keep_init / (1.0 - self.keep_init))), ()),
            (),
            self.param_dtype,
        )
        mask_logits = jnp.einsum("bur,bsr->bus", mask_query, mask_key) / math.sqrt(rank)
        mask_logits = mask_logits + mask_offset.astype(jnp.float32)
        out = dcp_attention(q, k, v, mask_logits, scale=_scale(self.head_dim), segment_ids=segment_ids)
        return _output_projection(self, out, x.shape[-1])
