"""The mixer contract: one MixerSpec per mixer kind, in the immutable table MIXERS.

Kinds: the attention variants that `attention.kind` names (fpa, fox, softmax, selective, dcp)
and gdn (GatedDeltaNet). A layer's kind follows its letter of `model.pattern`: A is
attention.kind, G is gdn (`layer_kinds`). What the trainer knows of a kind, it asks its spec:

    section          the config section of its options ("attention" | "gdn"), the layer's
                     entry in `Config.layer_sections`; title: its name in messages
    build(config, layer_index, *, name, dtype, param_dtype)
                     the Flax mixer, called as mixer(x [B, T, D], *, segment_ids, positions)
    op_name(config, layer_index)
                     the op that mixer calls; `implementation` is checked against its registry
    options          attention fields this kind reads beyond the common ones (a kind whose
                     options do not name a field must leave it at its default)
    positions        the attention.position values it accepts (its `check` refuses the others;
                     () for gdn, which has none); "rope" among them: it can rotate q and k by
                     RoPE (attention.rope_base), the positions `cpt.positions` extends
    check(config)    ConfigError naming the key for an impossible setting of its options
    check_context(config)
                     the same with mesh.context > 1; None: the kind has no context-parallel path
    flops_term, flops(config)
                     train/tools/bench.py's FLOPs term that its sequence mixing adds to, and
                     its forward + backward FLOPs per token and layer (bench's module doc)
    width(config, context)
                     values per token (compute dtype) it keeps for its backward, with the mesh's
                     context axis of that size (train/core/memory.py's module doc)
    export_names     flax leaf path below a layer's "mixer" -> (fla suffix below "attn.",
                     layout of to_torch in train/tools/export.py)
    export           MixerExport (refusal, config, fpa_torch): the config.json of the model
                     that export writes for a model whose attention layers are of this kind
                     (for gdn: of Gated DeltaNet layers only); None: flash-linear-attention
                     has no model with it
    decoding         MixerDecoding (check, prefill, step) for train/generate; None: no cache
    kv_width(config) values per token and row that a cache of its keys and values holds (its
                     decoding cache grows with the context; eviction and windows drop keys);
                     None: `recurrent`, a state of a fixed size and no per-token keys
    transition       (mixer, params, x [B, T, D]) -> (log_alpha, beta, keys) of its gated delta
                     rule's transition, what `spectra` measures (gdn_jax/diagnostics.py); None:
                     no such transition

Per layer and token with T = data.seq_len and C = the delta rule's chunk (GDN_CHUNK):

    attention  flops  3 H (D_qk + D_v) (T + 1)    (D_qk = 0 for FPA without content)
               width  (4 + 2 (context - 1)) H Dh  (q, k, v, out; with context > 1 the other
                                                   devices' k, v blocks of the ring backward)
               kv_width  2 H Dh                   (a key and a value per head)
    gdn        flops  3 HV (6 K V + (2 K + V) (C + 1))
               width  4 H K + 5 HV V, plus HV K V float32 values per chunk where the op
                      keeps its chunk-entering states; 2 H K + 4 HV V where it keeps only
                      its inputs on one device along T (`_gdn_width`)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from fpa_jax import layers
from fpa_jax.baselines.rope_scaling import YarnScaling
from fpa_jax.decode import layers as attention_decoding
from fpa_jax.layers.fpa import fpa_op_name
from fpa_jax.layers.selective import POSITIONS as SELECTIVE_POSITIONS
from fpa_jax.layers.softmax import POSITIONS as SOFTMAX_POSITIONS
from gdn_jax.diagnostics import gdn_transition_inputs
from gdn_jax.layer import GatedDeltaNet, recomputes_conv_outputs
from gdn_jax.ops import api as gdn_api
from train.core.config import Config, require

GDN = "gdn"
GDN_CHUNK = GatedDeltaNet.chunk_size     # the delta rule's chunk (the trainer keeps the default)


@dataclasses.dataclass(frozen=True)
class MixerDecoding:
    """Prefill and one-token step of a mixer kind (pure functions of a layer and its params).

    check(mixer)                                    ValueError for a layer it cannot step
    prefill(mixer, params, x [B, T, D], *, evict_below)          -> (y [B, T, D], cache)
    step(mixer, params, x_t [B, D], cache, *, evict_below)       -> (y_t [B, D], cache)
    """

    check: Callable[[nn.Module], None]
    prefill: Callable[..., tuple[Any, Any]]
    step: Callable[..., tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class MixerExport:
    """The model that train/tools/export.py writes for a model whose attention layers are of
    this kind, the others Gated DeltaNet (for gdn: a model of Gated DeltaNet layers only).

    refusal(config)        why that model cannot hold this config (export's ExportError
                           message), or None
    config(config, base)   its config.json: base (the entries of every model) and its own
    fpa_torch              format "fpa-torch" holds its layers too (train/hf_fpa's PyTorch
                           model runs them)
    """

    refusal: Callable[[Config], str | None]
    config: Callable[[Config, dict[str, Any]], dict[str, Any]]
    fpa_torch: bool = False


@dataclasses.dataclass(frozen=True)
class MixerSpec:
    """What the trainer knows of one mixer kind (see the module doc)."""

    section: str
    title: str                                   # the kind's name in messages
    build: Callable[..., nn.Module]
    op_name: Callable[[Config, int], str]
    options: tuple[str, ...]
    positions: tuple[str, ...]
    check: Callable[[Config], None]
    check_context: Callable[[Config], None] | None
    flops_term: str
    flops: Callable[[Config], int]
    width: Callable[[Config, int], int]
    export_names: Mapping[tuple[str, ...], tuple[str, str]]
    export: MixerExport | None
    decoding: MixerDecoding | None
    kv_width: Callable[[Config], int] | None
    transition: Callable[..., tuple[Any, Any, Any]] | None

    @property
    def recurrent(self) -> bool:
        """A fixed-size state instead of per-token keys and values (kv_width is None): no
        cache that grows with the context, nothing to evict or window."""
        return self.kv_width is None


# ------------------------------------------------------------------------------ attention

def _attention_fields(config: Config) -> dict[str, Any]:
    a = config.attention
    return dict(num_heads=a.num_heads, head_dim=a.head_dim, implementation=a.implementation)


def _build_fpa(config: Config, layer_index: int, **common) -> nn.Module:
    a = config.attention
    return layers.FPAAttention(stack_form=a.stack_form, key_level=a.key_level,
                               query_level=a.query_level, content=a.content, dip_sum=a.dip_sum,
                               tau=a.tau, use_bias=layer_index not in a.no_bias_layers,
                               block_size=a.block_size, **_attention_fields(config), **common)


def _build_softmax(config: Config, layer_index: int, **common) -> nn.Module:
    a = config.attention
    scaling = YarnScaling(a.yarn_factor, a.yarn_original_length) if a.yarn_factor else None
    return layers.SoftmaxAttention(position=a.position, rope_base=a.rope_base,
                                   rope_scaling=scaling, block_size=a.block_size,
                                   **_attention_fields(config), **common)


def _build_selective(config: Config, layer_index: int, **common) -> nn.Module:
    a = config.attention
    return layers.SelectiveAttention(position=a.position, rope_base=a.rope_base,
                                     **_attention_fields(config), **common)


def _build_fox(config: Config, layer_index: int, **common) -> nn.Module:
    return layers.FoXAttention(block_size=config.attention.block_size,
                               **_attention_fields(config), **common)


def _builder(layer_class: type[nn.Module]) -> Callable[..., nn.Module]:
    """The builder of a layer that takes only the common attention fields."""
    return lambda config, layer_index, **common: layer_class(**_attention_fields(config), **common)


def _check_position(allowed: tuple[str, ...]) -> Callable[[Config], None]:
    def check(config: Config) -> None:
        a = config.attention
        require(a.position in allowed,
                f"attention.position={a.position!r} is not available for attention.kind="
                f"{a.kind!r} (allowed: {allowed})")
    return check


def _check_block_size(config: Config) -> None:
    size = config.attention.block_size
    require(size is None or (size > 0 and size % 8 == 0),
            f"attention.block_size must be unset (the op's default) or a positive multiple of 8, "
            f"got {size}")


def _check_fpa(config: Config) -> None:
    a, m = config.attention, config.model
    _check_block_size(config)
    require(a.tau > 0, f"attention.tau must be > 0, got {a.tau}")
    require(not (a.dip_sum and a.block_size is not None),
            f"attention.block_size={a.block_size} does not apply to attention.dip_sum "
            f"(a dense op); leave it unset")
    if a.no_bias_layers:
        require(a.content, "attention.no_bias_layers with attention.content=false leaves those "
                           "layers no attention logits (no bias, no q.k)")
        sections = config.layer_sections()
        for index in a.no_bias_layers:
            require(0 <= index < m.num_layers,
                    f"attention.no_bias_layers: layer {index} out of range [0, {m.num_layers})")
            require(sections[index] == "attention",
                    f"attention.no_bias_layers: layer {index} is a {sections[index]} layer, "
                    f"not an attention layer (pattern {m.pattern!r})")


def _check_softmax(config: Config) -> None:
    a = config.attention
    _check_block_size(config)
    if a.yarn_factor:
        require(a.position == "rope",
                f"attention.yarn_factor needs attention.kind='softmax' with position='rope', "
                f"got kind={a.kind!r}, position={a.position!r}")
        require(a.yarn_factor >= 1 and a.yarn_original_length >= 1,
                f"attention.yarn_factor must be 0 (off) or >= 1 with attention."
                f"yarn_original_length >= 1, got {a.yarn_factor} and {a.yarn_original_length}")


def _check_ring_attention(config: Config) -> None:
    """Ring attention (mesh.context > 1): no dip sum, and its single XLA path."""
    context, a = config.mesh.context, config.attention
    require(not a.dip_sum, f"mesh.context={context} does not support attention.dip_sum "
                           f"(a dense-only op)")
    require(a.implementation is None,
            f"attention.implementation={a.implementation!r} must be unset with "
            f"mesh.context={context} (ring attention has a single XLA path)")


def _attention_flops(config: Config, *, content: bool = True) -> int:
    """content=False: no q.k term (D_qk = 0)."""
    a = config.attention
    qk_dim = a.head_dim if content else 0
    return 3 * a.num_heads * (qk_dim + a.head_dim) * (config.data.seq_len + 1)


def _fpa_flops(config: Config) -> int:
    return _attention_flops(config, content=config.attention.content)


def _attention_width(config: Config, context: int) -> int:
    return (4 + 2 * (context - 1)) * config.attention.num_heads * config.attention.head_dim


def _attention_kv_width(config: Config) -> int:
    return 2 * config.attention.num_heads * config.attention.head_dim


ATTENTION_NAMES = MappingProxyType({
    ("query", "kernel"): ("q_proj.weight", "heads_in"),
    ("key", "kernel"): ("k_proj.weight", "heads_in"),
    ("value", "kernel"): ("v_proj.weight", "heads_in"),
    ("out", "kernel"): ("o_proj.weight", "heads_out"),
    ("forget_proj", "kernel"): ("f_proj.weight", "linear"),
    ("forget_proj", "bias"): ("f_proj.bias", "same"),
    ("delta_proj", "kernel"): ("delta_proj.weight", "linear"),
    ("delta_proj", "bias"): ("delta_proj.bias", "same"),
    ("field_proj", "kernel"): ("field_proj.weight", "linear"),
    ("field_proj", "bias"): ("field_proj.bias", "same"),
    ("level_proj", "kernel"): ("level_proj.weight", "linear"),
    ("level_proj", "bias"): ("level_proj.bias", "same"),
    ("rho",): ("rho", "same"),
})

SLOT_DECODING = MixerDecoding(check=attention_decoding.check_supported,
                              prefill=attention_decoding.prefill, step=attention_decoding.step)


def _no_check(_) -> None:
    """Nothing to refuse."""


def _attention(title: str, build: Callable[..., nn.Module], op_name: str | Callable,
               positions: tuple[str, ...], check: Callable[[Config], None] = _no_check, *,
               options: tuple[str, ...] = (), flops: Callable[[Config], int] = _attention_flops,
               ring: bool = False, decodes: bool = False,
               export: MixerExport | None = None) -> MixerSpec:
    """The spec of an attention kind; op_name: a name, or (config, layer_index) -> name;
    check: its own checks, after attention.position's against `positions`."""
    check_position = _check_position(positions)

    def check_all(config: Config) -> None:
        check_position(config)
        check(config)

    return MixerSpec(
        section="attention", title=title, build=build,
        op_name=op_name if callable(op_name) else (lambda config, layer_index: op_name),
        options=options, positions=positions, check=check_all,
        check_context=_check_ring_attention if ring else None, flops_term="attention",
        flops=flops, width=_attention_width, export_names=ATTENTION_NAMES, export=export,
        decoding=SLOT_DECODING if decodes else None, kv_width=_attention_kv_width,
        transition=None)


# ------------------------------------------------------------------------------ Gated DeltaNet

def _build_gdn(config: Config, layer_index: int, **common) -> nn.Module:
    g = config.gdn
    return GatedDeltaNet(num_heads=g.num_heads, head_dim=g.head_dim,
                         num_v_heads=g.num_v_heads or None, v_head_dim=g.v_head_dim or None,
                         conv_size=g.conv_size, norm_eps=config.model.norm_eps,
                         implementation=g.implementation, **common)


def _check_gdn(config: Config) -> None:
    g, o = config.gdn, config.optim
    if GDN in config.layer_sections():
        num_v_heads = g.num_v_heads or g.num_heads
        require(num_v_heads % g.num_heads == 0,
                f"gdn.num_v_heads={num_v_heads} must be a multiple of gdn.num_heads={g.num_heads}")
    else:
        require(o.alpha_lr_scale == 1.0 and not o.freeze_gdn_decay,
                "optim.alpha_lr_scale / optim.freeze_gdn_decay need GatedDeltaNet layers "
                f"(model.pattern={config.model.pattern!r} has none)")


def _gdn_flops(config: Config) -> int:
    g = config.gdn
    k_dim, v_dim = g.head_dim, g.v_head_dim or g.head_dim
    v_heads = g.num_v_heads or g.num_heads
    return 3 * v_heads * (6 * k_dim * v_dim + (2 * k_dim + v_dim) * (GDN_CHUNK + 1))


def _gdn_width(config: Config, context: int) -> int:
    """What a Gated DeltaNet layer keeps for its backward, in compute-dtype values per token
    (gdn_jax/layer.py; its convolutions and norms are recomputed): the q, k, v projections
    (the convolutions' inputs), the op's q, k, v, the output gate z, the op's output and the
    gated norm's output (4 H K + 5 HV V), and, where the op keeps them (`_gdn_keeps_states`),
    its chunk-entering states, HV K V float32 values per chunk of GDN_CHUNK tokens. Where the
    op keeps only its inputs and the convolutions run their kernels (one device along T, the
    default or "pallas" implementation), the layer recomputes the op's q, k, v instead of
    keeping them: 2 H K + 4 HV V."""
    g = config.gdn
    key_width = g.num_heads * g.head_dim
    value_heads, value_dim = g.num_v_heads or g.num_heads, g.v_head_dim or g.head_dim
    compute_bytes = jnp.dtype(config.model.dtype).itemsize
    states = value_heads * g.head_dim * value_dim * 4 // (GDN_CHUNK * compute_bytes)
    keeps = _gdn_keeps_states(config, context)
    if recomputes_conv_outputs(g.implementation, context, keeps):
        return 2 * key_width + 4 * value_heads * value_dim
    return 4 * key_width + 5 * value_heads * value_dim + (states if keeps else 0)


def _gdn_keeps_states(config: Config, context: int) -> bool:
    """Whether the op this config's layers run (`gdn_api.keeps_chunk_states`, for the
    layer's inputs on this platform, T / context tokens per device) keeps its chunk-entering
    states for the backward."""
    g = config.gdn
    try:
        return gdn_api.keeps_chunk_states(
            g.implementation, dtype=config.model.dtype, head_dim=g.head_dim,
            value_head_dim=g.v_head_dim or g.head_dim, chunk_size=GDN_CHUNK,
            seq_len=max(1, config.data.seq_len // context))
    except ValueError:      # an implementation that cannot run here: the layer will say so
        return True


GDN_NAMES = MappingProxyType({
    ("q_proj", "kernel"): ("q_proj.weight", "linear"),
    ("k_proj", "kernel"): ("k_proj.weight", "linear"),
    ("v_proj", "kernel"): ("v_proj.weight", "linear"),
    ("z_proj", "kernel"): ("g_proj.weight", "linear"),
    ("a_proj", "kernel"): ("a_proj.weight", "linear"),
    ("b_proj", "kernel"): ("b_proj.weight", "linear"),
    ("q_conv", "kernel"): ("q_conv1d.weight", "conv"),
    ("k_conv", "kernel"): ("k_conv1d.weight", "conv"),
    ("v_conv", "kernel"): ("v_conv1d.weight", "conv"),
    ("A_log",): ("A_log", "same"),
    ("dt_bias",): ("dt_bias", "same"),
    ("o_norm", "scale"): ("o_norm.weight", "same"),
    ("o_proj", "kernel"): ("o_proj.weight", "linear"),
})


def _gdn_prefill(mixer, params, x, *, evict_below):
    """GatedDeltaNet.prefill; evict_below does not apply (the state has a fixed size)."""
    return mixer.apply({"params": params}, x, method="prefill")


def _gdn_step(mixer, params, x_t, cache, *, evict_below):
    """GatedDeltaNet.step; evict_below does not apply."""
    return mixer.apply({"params": params}, x_t, cache, method="step")


# ------------------------------------------------------------------------------ export

def _fla_heads(config: Config, model_type: str) -> str | None:
    """fla's attention derives head_dim = hidden_size // num_heads."""
    a, d_model = config.attention, config.model.d_model
    if a.num_heads * a.head_dim != d_model:
        return (f"attention: fla's {model_type} derives head_dim = hidden_size // num_heads, so it "
                f"needs num_heads * head_dim == d_model, got {a.num_heads} * {a.head_dim} != "
                f"{d_model}")
    return None


def _fla_attention(config: Config) -> dict[str, Any]:
    """The attention entries of fla's transformer and forgetting_transformer."""
    a = config.attention
    return {"num_heads": a.num_heads, "num_kv_heads": a.num_heads, "qkv_bias": False,
            "qk_norm": False, "window_size": None, "elementwise_affine": True}


def _fpa_export_config(config: Config, base: dict[str, Any]) -> dict[str, Any]:
    """This project's own fpa_transformer, its Gated DeltaNet layers included."""
    a = config.attention
    kinds = layer_kinds(config)
    fpa = {"layer_types": list(kinds), "num_heads": a.num_heads, "head_dim": a.head_dim,
           "fpa": {"stack_form": a.stack_form, "key_level": a.key_level,
                   "query_level": a.query_level, "content": a.content, "dip_sum": a.dip_sum,
                   "tau": a.tau, "no_bias_layers": list(a.no_bias_layers)}}
    gdn = {GDN: _gdn_export_entries(config)} if GDN in kinds else {}
    return {"model_type": "fpa_transformer", **base, **fpa, **gdn}


def _softmax_export_refusal(config: Config) -> str | None:
    a = config.attention
    if a.position != "rope":
        return (f"attention.position={a.position!r}: fla's transformer always applies "
                f"RoPE; only softmax attention with position='rope' maps onto it")
    hybrid = GDN in config.layer_sections()
    return _fla_heads(config, "gated_deltanet hybrid attention" if hybrid else "transformer")


def _softmax_export_config(config: Config, base: dict[str, Any]) -> dict[str, Any]:
    """fla's transformer, or its gated_deltanet with these attention layers in a hybrid."""
    a = config.attention
    sections = config.layer_sections()
    if GDN in sections:
        attention = {"layers": [i for i, section in enumerate(sections) if section == "attention"],
                     "num_heads": a.num_heads, "num_kv_heads": a.num_heads, "qkv_bias": False,
                     "window_size": None, "rope_theta": a.rope_base}
        return _gdn_export_config(config, base, attention)
    return {"model_type": "transformer", "architectures": ["TransformerForCausalLM"], **base,
            **_fla_attention(config), "rope_theta": a.rope_base}


def _fox_export_refusal(config: Config) -> str | None:
    if GDN in config.layer_sections():
        return (f"hybrid of Gated DeltaNet with attention.kind={config.attention.kind!r}: fla's "
                f"hybrids use softmax attention with RoPE only")
    return _fla_heads(config, "forgetting_transformer")


def _fox_export_config(config: Config, base: dict[str, Any]) -> dict[str, Any]:
    return {"model_type": "forgetting_transformer",
            "architectures": ["ForgettingTransformerForCausalLM"], **base,
            **_fla_attention(config), "use_output_gate": False}


def _gdn_export_entries(config: Config) -> dict[str, Any]:
    """The Gated DeltaNet entries of fla's gated_deltanet (and of fpa_transformer's "gdn")."""
    g = config.gdn
    value_dim = g.v_head_dim or g.head_dim
    return {"attn_mode": "chunk", "num_heads": g.num_heads, "head_dim": g.head_dim,
            "num_v_heads": g.num_v_heads or g.num_heads, "expand_v": value_dim / g.head_dim,
            "conv_size": g.conv_size, "use_gate": True, "use_short_conv": True,
            "allow_neg_eigval": False}


def _gdn_export_config(config: Config, base: dict[str, Any],
                       attention: dict[str, Any] | None = None) -> dict[str, Any]:
    """fla's gated_deltanet; attention: its "attn" entry, the softmax layers of a hybrid."""
    return {"model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"],
            **base, **_gdn_export_entries(config), "attn": attention}


# ------------------------------------------------------------------------------ the table

MIXERS: Mapping[str, MixerSpec] = MappingProxyType({
    "fpa": _attention(
        "FPA", _build_fpa,
        lambda config, layer_index: fpa_op_name(
            use_bias=layer_index not in config.attention.no_bias_layers,
            dip_sum=config.attention.dip_sum),
        ("nope",), _check_fpa, flops=_fpa_flops, ring=True, decodes=True,
        export=MixerExport(_no_check, _fpa_export_config, fpa_torch=True),
        options=("stack_form", "key_level", "query_level", "content", "dip_sum", "tau",
                 "no_bias_layers", "block_size")),
    "fox": _attention("FoX", _build_fox, "fox_attention", ("nope",), _check_block_size,
                      ring=True, decodes=True, options=("block_size",),
                      export=MixerExport(_fox_export_refusal, _fox_export_config)),
    "softmax": _attention("softmax", _build_softmax, "softmax_attention", SOFTMAX_POSITIONS,
                          _check_softmax, ring=True, decodes=True,
                          options=("yarn_factor", "block_size"),
                          export=MixerExport(_softmax_export_refusal, _softmax_export_config)),
    "selective": _attention("selective", _build_selective, "selective_attention",
                            SELECTIVE_POSITIONS),
    "dcp": _attention("DCP", _builder(layers.DCPAttention), "dcp_attention", ("nope",)),
    GDN: MixerSpec(
        section=GDN, title="Gated DeltaNet", build=_build_gdn,
        op_name=lambda config, layer_index: gdn_api.REGISTRY.op_name, options=(), positions=(),
        check=_check_gdn, check_context=_no_check, flops_term="recurrence", flops=_gdn_flops,
        width=_gdn_width, export_names=GDN_NAMES,
        export=MixerExport(_no_check, _gdn_export_config),
        decoding=MixerDecoding(check=_no_check, prefill=_gdn_prefill, step=_gdn_step),
        kv_width=None, transition=gdn_transition_inputs),
})

ATTENTION_KINDS = tuple(kind for kind, spec in MIXERS.items() if spec.section == "attention")
CONTEXT_PARALLEL_KINDS = tuple(kind for kind in ATTENTION_KINDS
                               if MIXERS[kind].check_context is not None)


def configured_kinds(config: Config) -> tuple[str, str]:
    """The kinds the config's mixer sections select, used by its layers or not:
    (attention.kind, "gdn")."""
    return config.attention.kind, GDN


def layer_kinds(config: Config) -> tuple[str, ...]:
    """The mixer kind of every layer (attention.kind for an A of the pattern, "gdn" for a G);
    ValueError for an attention.kind without a spec."""
    sections = config.layer_sections()
    kinds = tuple(config.attention.kind if section == "attention" else section
                  for section in sections)
    for section, kind in zip(sections, kinds):
        if kind not in MIXERS or MIXERS[kind].section != section:
            raise ValueError(f"attention.kind: unknown {kind!r}")
    return kinds


def layer_spec(config: Config, layer_index: int) -> MixerSpec:
    """The spec of layer `layer_index`'s mixer."""
    return MIXERS[layer_kinds(config)[layer_index]]
