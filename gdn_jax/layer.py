"""Gated DeltaNet layer (Flax Linen), parallel forward and single-token decoding.

Shapes: x [B, T, D]; H q/k heads of size K; HV value heads of size V (HV a multiple of H).

    q, k   = L2norm(silu(causal_conv(x W_q))), L2norm(silu(causal_conv(x W_k)))   [B, T, H, K]
    v      = silu(causal_conv(x W_v))                                            [B, T, HV, V]
    z      = x W_z                                                               [B, T, HV, V]
    g      = -exp(A_log) * softplus(x W_a + dt_bias)      log retention (float32) [B, T, HV]
    beta   = sigmoid(x W_b)                               write strength          [B, T, HV]
    o      = gated_delta_rule(q, k, v, g, beta)           S_t = e^{g_t}(I - beta_t k_t k_t^T) S_{t-1}
                                                                + beta_t k_t v_t^T,  o_t = S_t^T q_t K^-1/2
    y      = (RMSNorm(o) * w_norm * silu(z)) W_o                                 [B, T, D]

L2norm(x) = x / sqrt(sum x^2 + 1e-6); RMSNorm is per value head over V with eps `norm_eps`.
The op's value ranges hold by construction, for any parameters: g <= 0 (exp(.) softplus(.)
>= 0), beta = sigmoid(.) in [0, 1], |k_t| < 1 (L2norm), so its range checks (gdn_jax.ops.api;
under jit in checked mode, mixer_core.ranges) never fire for this layer.
The causal convolution is depthwise with `conv_size` taps; taps reaching before the start of
the current document (segment_ids) or before t = 0 read zeros (`gdn_jax.ops.short_conv`; its
"pallas" entry forms the backward in one Mosaic GPU pass, chosen where the delta rule may run
its kernels and time is not split over devices). The convolutions, the L2 and gated RMS norms
compute in float32 and keep only their 16-bit inputs for the backward pass, which recomputes
the rest (float32 intermediates kept for the backward were about 1 GiB per layer at B = 8,
T = 2048, width 768). Where the op's backward needs only its inputs (its "pallas" kernels
rerun the forward) and the convolutions run their kernels, the convolutions and the op run
under one custom VJP that keeps the projections alone (`mixer_core.recompute`): q, k, v are
recomputed in the backward pass, not kept beside them (2 H K + HV V fewer values per token).

Initialisation: projections lecun-normal; conv taps U(-1/sqrt(conv_size), 1/sqrt(conv_size))
(PyTorch Conv1d default); A_log = log(A), A ~ U(0, 16) clamped below at 1e-4 so log never sees 0;
dt = exp(U(log 1e-3, log 0.1)) clamped below at 1e-4, dt_bias = softplus^{-1}(dt)
= dt + log(-expm1(-dt)); norm weight ones.

`__call__(x, *, segment_ids=None, positions=None)` is the call signature of every token mixer
(fpa_jax.layers): `positions` is checked ([B, T] int) and otherwise ignored, since the delta
rule is position-free. `implementation` is checked at init against `gdn_jax.ops.api.REGISTRY`.

Decoding cache (`init_cache`): conv states {q,k,v}_conv [B, conv_size - 1, channels] (the last
inputs to each convolution) and the recurrent state [B, HV, K, V] float32. `prefill(x)` runs
the chunked parallel form on one document per row and returns its output with the cache after
its last token (conv histories: the last conv_size - 1 projections, zeros before t = 0; state:
the op's final state); `step(x_t, cache)` advances it by one token with the recurrent form.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from gdn_jax.ops import api, context_shard
from gdn_jax.ops.api import gated_delta_rule, recurrent_gated_delta_rule
from gdn_jax.ops.short_conv import l2_normalize, recomputed, short_conv
from mixer_core import shard
from mixer_core.inputs import check_mixer_inputs
from mixer_core.recompute import keeping_inputs_only

A_INIT_RANGE = (0.0, 16.0)
A_INIT_FLOOR = 1e-4
DT_INIT_RANGE = (1e-3, 0.1)
DT_INIT_FLOOR = 1e-4


@recomputed(static_argnums=(3, 4))
def gated_rms_norm(x: jax.Array, z: jax.Array, scale: jax.Array, eps: float,
                   dtype: Any) -> jax.Array:
    """x / sqrt(mean(x^2, -1) + eps) * scale * silu(z) in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale.astype(jnp.float32) * nn.silu(z.astype(jnp.float32))).astype(dtype)


def _history(inputs: jax.Array, size: int) -> jax.Array:
    """The last `size` rows of inputs [B, T, C] along T, zero-padded in front when T < size."""
    padded = jnp.pad(inputs, ((0, 0), (max(size - inputs.shape[1], 0), 0), (0, 0)))
    return padded[:, padded.shape[1] - size:]


def _a_log_init(key, shape, dtype=jnp.float32):
    a = jax.random.uniform(key, shape, jnp.float32, *A_INIT_RANGE)
    return jnp.log(jnp.maximum(a, A_INIT_FLOOR)).astype(dtype)


def _dt_bias_init(key, shape, dtype=jnp.float32):
    low, high = jnp.log(DT_INIT_RANGE[0]), jnp.log(DT_INIT_RANGE[1])
    dt = jnp.exp(jax.random.uniform(key, shape, jnp.float32, low, high))
    dt = jnp.maximum(dt, DT_INIT_FLOOR)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)


def conv_implementation(implementation: str | None, context: int) -> str | None:
    """The short convolutions' implementation (`gdn_jax.ops.short_conv`) for the op's
    `implementation` with time split over `context` devices: its default (the kernels where
    they run) when the delta rule may use its kernels, else "xla"; "xla" also when time is
    split (the kernels see whole sequences)."""
    return None if implementation in (None, "pallas") and context <= 1 else "xla"


def recomputes_conv_outputs(implementation: str | None, context: int,
                            keeps_chunk_states: bool) -> bool:
    """Whether the layer recomputes q, k, v in the backward pass instead of keeping them
    beside the projections: where the op's backward needs only its inputs
    (`api.keeps_chunk_states` is False: the "pallas" kernels with their default residuals)
    and the convolutions run their kernels (`conv_implementation` is the default)."""
    return not keeps_chunk_states and conv_implementation(implementation, context) is None


class CausalDepthwiseConv(nn.Module):
    """y_t[c] = silu(sum_j kernel[j, c] * x_{t - (W-1) + j}[c]); x [B, T, C], kernel [W, C].

    Taps that reach before t = 0 or into a previous document (segment_ids [B, T]) read zero.
    """

    channels: int
    kernel_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self):
        init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", in_axis=0, out_axis=1)
        self.kernel = self.param(
            "kernel", nn.with_logical_partitioning(init, ("conv", "heads_x_dim")),
            (self.kernel_size, self.channels), self.param_dtype)

    def __call__(self, x: jax.Array, segment_ids: jax.Array | None = None,
                 normalize_heads: int | None = None,
                 implementation: str | None = None) -> jax.Array:
        """[B, T, C]; with normalize_heads, L2-normalised heads [B, T, heads, C / heads].
        implementation: of `gdn_jax.ops.short_conv` (None: its default)."""
        return short_conv(x, self.kernel, segment_ids, dtype=self.dtype,
                          normalize_heads=normalize_heads, implementation=implementation)

    def step(self, x_t: jax.Array, conv_state: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x_t [B, C], conv_state [B, W-1, C] (previous inputs, oldest first) -> (y_t, state)."""
        window = jnp.concatenate([conv_state.astype(jnp.float32), x_t.astype(jnp.float32)[:, None]], axis=1)
        y_t = nn.silu(jnp.sum(window * self.kernel.astype(jnp.float32)[None], axis=1))
        return y_t.astype(self.dtype), window[:, 1:].astype(conv_state.dtype)


class GatedRMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2, -1) + eps) * scale * silu(z) over the last axis (size `features`)."""

    features: int
    eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, z: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("v_head_dim",)),
                           (self.features,), self.param_dtype)
        return gated_rms_norm(x, z, scale, self.eps, self.dtype)


class OutputProjection(nn.Module):
    """y = x @ kernel, kernel [F_in, features] with `features` given at call time (the model width)."""

    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, features: int) -> jax.Array:
        kernel = self.param("kernel", nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                   ("heads_x_dim", "embed")),
                            (x.shape[-1], features), self.param_dtype)
        return jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet token mixer: x [B, T, D] -> y [B, T, D] (see the module docstring)."""

    num_heads: int
    head_dim: int
    num_v_heads: int | None = None
    v_head_dim: int | None = None
    conv_size: int = 4
    norm_eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    implementation: str | None = None
    chunk_size: int = 64

    @property
    def op_name(self) -> str:
        """The op this layer calls; `implementation` is checked against its registry."""
        return api.REGISTRY.op_name

    @property
    def value_heads(self) -> int:
        return self.num_heads if self.num_v_heads is None else self.num_v_heads

    @property
    def value_head_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    def _check_fields(self):
        for name in ("num_heads", "head_dim", "conv_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GatedDeltaNet.{name}: expected a positive int, got {value!r}")
        for name, value in (("num_v_heads", self.value_heads), ("v_head_dim", self.value_head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GatedDeltaNet.{name}: expected a positive int or None, got {value!r}")
        if self.value_heads % self.num_heads:
            raise ValueError(f"GatedDeltaNet.num_v_heads: expected a multiple of num_heads={self.num_heads}, "
                             f"got {self.value_heads}")
        try:
            api.REGISTRY.check_name(self.implementation)
        except ValueError as error:
            raise ValueError(f"GatedDeltaNet: {error}") from None

    def setup(self):
        self._check_fields()
        key_width = self.num_heads * self.head_dim
        value_width = self.value_heads * self.value_head_dim

        def projection(features, axes):
            return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes))

        def conv(channels):
            return CausalDepthwiseConv(channels, self.conv_size, dtype=self.dtype, param_dtype=self.param_dtype)

        self.q_proj = projection(key_width, ("embed", "heads_x_dim"))
        self.k_proj = projection(key_width, ("embed", "heads_x_dim"))
        self.v_proj = projection(value_width, ("embed", "heads_x_dim"))
        self.z_proj = projection(value_width, ("embed", "heads_x_dim"))
        self.a_proj = projection(self.value_heads, ("embed", "v_heads"))
        self.b_proj = projection(self.value_heads, ("embed", "v_heads"))
        self.q_conv = conv(key_width)
        self.k_conv = conv(key_width)
        self.v_conv = conv(value_width)
        self.A_log = self.param("A_log", nn.with_logical_partitioning(_a_log_init, ("v_heads",)),
                                (self.value_heads,), self.param_dtype)
        self.dt_bias = self.param("dt_bias", nn.with_logical_partitioning(_dt_bias_init, ("v_heads",)),
                                  (self.value_heads,), self.param_dtype)
        self.o_norm = GatedRMSNorm(self.value_head_dim, eps=self.norm_eps, dtype=self.dtype,
                                   param_dtype=self.param_dtype)
        self.o_proj = OutputProjection(dtype=self.dtype, param_dtype=self.param_dtype)

    # -- shared pieces -------------------------------------------------------------------------
    def _split_heads(self, x: jax.Array, heads: int, dim: int) -> jax.Array:
        return x.reshape(*x.shape[:-1], heads, dim)

    def _gates(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [..., D] -> (g, beta) [..., HV] float32."""
        a = self.a_proj(x).astype(jnp.float32)
        g = -jnp.exp(self.A_log.astype(jnp.float32)) * nn.softplus(a + self.dt_bias.astype(jnp.float32))
        beta = nn.sigmoid(self.b_proj(x).astype(jnp.float32))
        return g, beta

    def _readout(self, o: jax.Array, z: jax.Array, model_dim: int) -> jax.Array:
        """o, z [..., HV, V] -> y [..., D]."""
        gated = self.o_norm(o, z)
        return self.o_proj(gated.reshape(*gated.shape[:-2], -1), model_dim)

    def _recomputes_conv_outputs(self, x: jax.Array, segment_ids: jax.Array | None) -> bool:
        """`recomputes_conv_outputs` for this layer's op on x [B, T, D]."""
        batch, length, _ = x.shape
        q = jax.ShapeDtypeStruct((batch, length, self.num_heads, self.head_dim), self.dtype)
        v = jax.ShapeDtypeStruct((batch, length, self.value_heads, self.value_head_dim),
                                 self.dtype)
        keeps = api.keeps_chunk_states(
            self.implementation, **api.input_facts(q, v, None, segment_ids, self.chunk_size))
        return recomputes_conv_outputs(self.implementation, shard.context_size(), keeps)

    def _conv_implementation(self) -> str | None:
        """The short convolutions' implementation (`conv_implementation`)."""
        return conv_implementation(self.implementation, shard.context_size())

    # -- parallel forward ----------------------------------------------------------------------
    def __call__(self, x: jax.Array, *, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
        """x [B, T, D] (segment_ids [B, T] int: equal ids = same contiguous document) -> [B, T, D].

        positions [B, T] int: accepted for the mixers' common signature, checked, then ignored.
        """
        check_mixer_inputs("GatedDeltaNet", x, segment_ids, positions)
        x = x.astype(self.dtype)
        conv = self._conv_implementation()

        def convolved_delta_rule(q_in, k_in, v_in, q_taps, k_taps, v_taps, g, beta, segment_ids):
            def convolved(x_in, taps, normalize_heads):
                return short_conv(x_in, taps, segment_ids, dtype=self.dtype,
                                  normalize_heads=normalize_heads, implementation=conv)
            q = convolved(q_in, q_taps, self.num_heads)
            k = convolved(k_in, k_taps, self.num_heads)
            v = self._split_heads(convolved(v_in, v_taps, None), self.value_heads,
                                  self.value_head_dim)
            o, _ = shard.ring_or_shard(
                gated_delta_rule, context_shard.gated_delta_rule, q, k, v, g, beta,
                layouts=shard.GDN_LAYOUTS, out_layouts=shard.GDN_OUT_LAYOUTS,
                segment_ids=segment_ids, chunk_size=self.chunk_size,
                implementation=self.implementation)
            return o

        if self._recomputes_conv_outputs(x, segment_ids):
            # the op's backward reruns its forward from q, k, v anyway, so they need not be
            # kept beside the projections the convolutions keep: 2 H K + HV V values per token
            convolved_delta_rule = keeping_inputs_only(convolved_delta_rule)
        z = self._split_heads(self.z_proj(x), self.value_heads, self.value_head_dim)
        g, beta = self._gates(x)
        o = convolved_delta_rule(self.q_proj(x), self.k_proj(x), self.v_proj(x),
                                 self.q_conv.kernel, self.k_conv.kernel, self.v_conv.kernel,
                                 g, beta, segment_ids)
        return self._readout(o, z, x.shape[-1])

    def transition_inputs(self, x: jax.Array, *, segment_ids: jax.Array | None = None):
        """x [B, T, D] -> (log_alpha, beta [B, T, HV], keys [B, T, HV, K]), all float32.

        The per-step transition of value head h is A_t = exp(log_alpha_t) (I - beta_t k_t k_t^T),
        with k_t the L2-normalised key of q/k head h // (HV / H).
        """
        check_mixer_inputs("GatedDeltaNet", x, segment_ids, None)
        x = x.astype(self.dtype)
        keys = self.k_conv(self.k_proj(x), segment_ids, normalize_heads=self.num_heads)
        log_alpha, beta = self._gates(x)
        key_head_of_value_head = jnp.arange(self.value_heads) // (self.value_heads // self.num_heads)
        return log_alpha, beta, keys.astype(jnp.float32)[:, :, key_head_of_value_head]

    # -- decoding ------------------------------------------------------------------------------
    def _cache_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        key_width = self.num_heads * self.head_dim
        value_width = self.value_heads * self.value_head_dim
        history = self.conv_size - 1
        return {"q_conv": (batch_size, history, key_width), "k_conv": (batch_size, history, key_width),
                "v_conv": (batch_size, history, value_width),
                "state": (batch_size, self.value_heads, self.head_dim, self.value_head_dim)}

    def prefill(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """x [B, T, D], one document per row -> (y [B, T, D] of the parallel form, the cache of
        `init_cache` after token T - 1)."""
        check_mixer_inputs("GatedDeltaNet", x, None, None)
        x = x.astype(self.dtype)
        projected = {"q_conv": self.q_proj(x), "k_conv": self.k_proj(x), "v_conv": self.v_proj(x)}
        q = l2_normalize(self._split_heads(self.q_conv(projected["q_conv"]), self.num_heads,
                                           self.head_dim))
        k = l2_normalize(self._split_heads(self.k_conv(projected["k_conv"]), self.num_heads,
                                           self.head_dim))
        v = self._split_heads(self.v_conv(projected["v_conv"]), self.value_heads,
                              self.value_head_dim)
        z = self._split_heads(self.z_proj(x), self.value_heads, self.value_head_dim)
        g, beta = self._gates(x)
        o, state = gated_delta_rule(q, k, v, g, beta, chunk_size=self.chunk_size,
                                    output_final_state=True, implementation=self.implementation)
        cache = self.init_cache(x.shape[0])
        cache = {name: _history(value, self.conv_size - 1).astype(cache[name].dtype)
                 for name, value in projected.items()} | {"state": state}
        return self._readout(o, z, x.shape[-1]), cache

    def init_cache(self, batch_size: int, dtype: Any = None) -> dict[str, jax.Array]:
        """Empty decoding cache: conv histories in `dtype` (default self.dtype), state float32."""
        self._check_fields()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"GatedDeltaNet.init_cache: batch_size must be a positive int, got {batch_size!r}")
        conv_dtype = self.dtype if dtype is None else dtype
        return {name: jnp.zeros(shape, jnp.float32 if name == "state" else conv_dtype)
                for name, shape in self._cache_shapes(batch_size).items()}

    def step(self, x_t: jax.Array, cache: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        """One decoding step: x_t [B, D], cache from `init_cache` -> (y_t [B, D], updated cache)."""
        if x_t.ndim != 2:
            raise ValueError(f"GatedDeltaNet.step: x_t must be [B, D], got shape {x_t.shape}")
        expected = self._cache_shapes(x_t.shape[0])
        if not isinstance(cache, dict) or set(cache) != set(expected):
            got = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
            raise ValueError(f"GatedDeltaNet.step: cache must have keys {sorted(expected)}, got {got}")
        for name, shape in expected.items():
            if cache[name].shape != shape:
                raise ValueError(f"GatedDeltaNet.step: cache[{name!r}] must have shape {shape}, "
                                 f"got {cache[name].shape}")
        x_t = x_t.astype(self.dtype)
        q, q_history = self.q_conv.step(self.q_proj(x_t), cache["q_conv"])
        k, k_history = self.k_conv.step(self.k_proj(x_t), cache["k_conv"])
        v, v_history = self.v_conv.step(self.v_proj(x_t), cache["v_conv"])
        q = l2_normalize(self._split_heads(q, self.num_heads, self.head_dim))
        k = l2_normalize(self._split_heads(k, self.num_heads, self.head_dim))
        v = self._split_heads(v, self.value_heads, self.value_head_dim)
        z = self._split_heads(self.z_proj(x_t), self.value_heads, self.value_head_dim)
        g, beta = self._gates(x_t)
        o, state = recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                              initial_state=cache["state"], output_final_state=True)
        y_t = self._readout(o[:, 0], z, x_t.shape[-1])
        return y_t, {"q_conv": q_history, "k_conv": k_history, "v_conv": v_history, "state": state}
