"""FPAAttention: causal attention with the FPA field/level path-minimum bias (no RoPE).

    q, k, v = projections of x                            [B, T, H, head_dim]   (common.py)
    delta, g, h = x @ W + c per head                      [B, T, H]  (delta_proj, field_proj, level_proj)
    phi, psi = fields(delta, g, h);  beta = softplus(rho) [H]
    bias_ts = beta * min(0, min_{s<u<=t} phi_u - psi_s)   (fpa_attention)
    y = attention(q, k, v, bias) @ W_out                  [B, T, D]

beta = softplus(rho) > 0 by construction (float32 softplus underflows to 0 only below
rho = -87), so the op's beta > 0 check (fpa_jax.fpa.checks; under jit in checked mode,
mixer_core.ranges) does not fire for this layer.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from fpa_jax import context_shard
from fpa_jax.baselines.dipsum import dipsum_attention
from fpa_jax.baselines.softmax import softmax_attention
from fpa_jax.fpa.api import fpa_attention
from fpa_jax.fpa.fields import fields
from fpa_jax.layers import common
from mixer_core import shard
from mixer_core.inputs import check_mixer_inputs

Dtype = Any


def fpa_op_name(*, use_bias: bool, dip_sum: bool) -> str:
    """The op an FPAAttention with these fields calls (plain softmax attention without bias)."""
    if not use_bias:
        return "softmax_attention"
    return "dipsum_attention" if dip_sum else "fpa_attention"


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
                    range minimum (dense-only op "dipsum_attention", so implementation None or
                    "reference"; needs content=True, query_level=False). With the init below its bias
                    starts as c_delta * (t - s) (t - s + 1) / 2: quadratic, not FoX's linear decay.
      use_bias      False: plain causal softmax attention without positions (NoPE) and no
                    bias parameters -- the "bias off in the first layer" setting.
      tau           temperature of the straight-through soft minimum used for the gradient.
      block_size    the op's block (None: its default; a positive multiple of 8): the key
                    block of the "xla" paths and the query tile of the ring (mesh.context > 1);
                    the GPU kernels keep their own. Not with dip_sum (a dense op).

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
    forget_init_range: tuple = common.DEFAULT_FORGET_INIT_RANGE
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None
    block_size: int | None = None

    @property
    def op_name(self) -> str:
        """The op this layer calls; `implementation` is checked against its registry."""
        return fpa_op_name(use_bias=self.use_bias, dip_sum=self.dip_sum)

    def _check_config(self) -> None:
        layer = type(self).__name__
        common.check_common(self)
        common.check_positive_float(layer, "tau", self.tau)
        common.check_block_size(self)
        if self.use_bias and self.dip_sum and self.block_size is not None:
            raise ValueError(f"{layer}: block_size does not apply to dip_sum=True (a dense op), "
                             f"got {self.block_size}")
        common.check_forget_init_range(layer, self.forget_init_range)
        if not self.use_bias and not self.content:
            raise ValueError(f"{layer}: use_bias=False with content=False leaves no attention logits")
        if self.use_bias and self.dip_sum and (self.query_level or not self.content):
            raise ValueError(
                f"{layer}: dip_sum=True supports only key levels with content "
                f"(query_level=False, content=True), got query_level={self.query_level}, "
                f"content={self.content}"
            )

    @nn.compact
    def __call__(self, x, *, segment_ids=None, positions=None):
        """x [B,T,D] -> [B,T,D]. `positions` is accepted for a uniform interface and unused (no RoPE)."""
        self._check_config()
        check_mixer_inputs(type(self).__name__, x, segment_ids, positions)
        scale = common.attention_scale(self.head_dim)

        if not self.use_bias:
            q, k, v = common.head_projections(self, x, ("query", "key", "value"))
            out = shard.ring_or_shard(
                softmax_attention, context_shard.softmax_attention, q, k, v,
                layouts=shard.SOFTMAX_LAYOUTS, scale=scale, segment_ids=segment_ids,
                implementation=self.implementation, **common.block_options(self))
            return common.output_projection(self, out, x.shape[-1])

        if self.content:
            q, k, v = common.head_projections(self, x, ("query", "key", "value"))
        else:
            (v,) = common.head_projections(self, x, ("value",))
            q = k = jnp.zeros_like(v)  # ignored by the op when content=False

        decay_rate = -np.log(common.per_head_forget_values(self.num_heads, self.forget_init_range))
        delta_init = decay_rate if self.query_level else -decay_rate
        delta = common.per_head_scalar_map(self, x, "delta_proj",
                                           common.constant_vector_init(delta_init))
        zeros = jnp.zeros_like(delta)
        g = zeros if self.stack_form else common.per_head_scalar_map(self, x, "field_proj")
        has_level = self.key_level and not self.stack_form
        h = common.per_head_scalar_map(self, x, "level_proj") if has_level else zeros

        rho = self.param(
            "rho",
            common.logical(nn.initializers.constant(math.log(math.expm1(1.0))), common.PER_HEAD_AXES),
            (self.num_heads,),
            self.param_dtype,
        )
        beta = jax.nn.softplus(rho.astype(jnp.float32))

        if self.dip_sum:
            phi, psi = fields(delta, g, h, segment_ids=segment_ids)
            out = dipsum_attention(q, k, v, phi, psi, beta, scale=scale, segment_ids=segment_ids,
                                   implementation=self.implementation)
        else:   # the walk per shard of batch and heads, or over the ring
            out = shard.ring_or_shard(
                fpa_attention_of_walk, context_shard.fpa_attention, q, k, v, delta, g, h, beta,
                layouts=shard.FPA_WALK_LAYOUTS, scale=scale, tau=self.tau,
                segment_ids=segment_ids, implementation=self.implementation,
                query_level=self.query_level, content=self.content, **common.block_options(self))
        return common.output_projection(self, out, x.shape[-1])


def fpa_attention_of_walk(q, k, v, delta, g, h, beta, *, segment_ids=None, **options):
    """fpa_attention from the walk's inputs delta, g, h [B, T, H]: phi, psi = fields(delta, g,
    h), restarting at each document start (the counterpart of context_shard.fpa_attention)."""
    phi, psi = fields(delta, g, h, segment_ids=segment_ids)
    return fpa_attention(q, k, v, phi, psi, beta, segment_ids=segment_ids, **options)
