"""The expected tensor names and shapes of an exported checkpoint (flash-linear-attention layout).

This table is written down independently of the mapping code in train/tools/export.py: the tests
export tiny models and check the files against `expected_layout` (names and shapes exactly).

Shape symbols:
    D  hidden_size (model.d_model)        V  vocab size        F  MLP width (intermediate_size)
    H, Dh   attention heads and head dim (attention.num_heads, attention.head_dim)
    GH, GK  Gated DeltaNet q/k heads and their dim; GHV, GV value heads and their dim
    W  Gated DeltaNet conv taps (gdn.conv_size)
A shape entry "H*Dh" is a product. Per-layer names are prefixed with "model.layers.{i}.".
FPA-only entries carry a condition on the FPA switches: content (q.k term), field (not
stack_form), level (key_level and not stack_form); an FPA layer without bias (use_bias False,
attention.no_bias_layers) has only the q/k/v/o projections.
"""

from __future__ import annotations

import math

from train.core.config import Config

MODEL_TENSORS = {
    "model.embeddings.weight": ("V", "D"),
    "model.norm.weight": ("D",),
}
UNTIED_HEAD = {"lm_head.weight": ("V", "D")}

BLOCK_TENSORS = {
    "attn_norm.weight": ("D",),
    "mlp_norm.weight": ("D",),
    "mlp.gate_proj.weight": ("F", "D"),
    "mlp.up_proj.weight": ("F", "D"),
    "mlp.down_proj.weight": ("D", "F"),
}

SOFTMAX_TENSORS = {
    "attn.q_proj.weight": ("H*Dh", "D"),
    "attn.k_proj.weight": ("H*Dh", "D"),
    "attn.v_proj.weight": ("H*Dh", "D"),
    "attn.o_proj.weight": ("D", "H*Dh"),
}

FOX_TENSORS = {
    **SOFTMAX_TENSORS,
    "attn.f_proj.weight": ("H", "D"),
    "attn.f_proj.bias": ("H",),
}

# FPA: name -> (shape, condition or None)
FPA_TENSORS = {
    "attn.q_proj.weight": (("H*Dh", "D"), "content"),
    "attn.k_proj.weight": (("H*Dh", "D"), "content"),
    "attn.v_proj.weight": (("H*Dh", "D"), None),
    "attn.o_proj.weight": (("D", "H*Dh"), None),
    "attn.delta_proj.weight": (("H", "D"), None),
    "attn.delta_proj.bias": (("H",), None),
    "attn.field_proj.weight": (("H", "D"), "field"),
    "attn.field_proj.bias": (("H",), "field"),
    "attn.level_proj.weight": (("H", "D"), "level"),
    "attn.level_proj.bias": (("H",), "level"),
    "attn.rho": (("H",), None),
}

GDN_TENSORS = {
    "attn.q_proj.weight": ("GH*GK", "D"),
    "attn.k_proj.weight": ("GH*GK", "D"),
    "attn.v_proj.weight": ("GHV*GV", "D"),
    "attn.g_proj.weight": ("GHV*GV", "D"),
    "attn.a_proj.weight": ("GHV", "D"),
    "attn.b_proj.weight": ("GHV", "D"),
    "attn.A_log": ("GHV",),
    "attn.dt_bias": ("GHV",),
    "attn.q_conv1d.weight": ("GH*GK", "1", "W"),
    "attn.k_conv1d.weight": ("GH*GK", "1", "W"),
    "attn.v_conv1d.weight": ("GHV*GV", "1", "W"),
    "attn.o_norm.weight": ("GV",),
    "attn.o_proj.weight": ("D", "GHV*GV"),
}


def _symbols(config: Config, vocab_size: int) -> dict[str, int]:
    g, a = config.gdn, config.attention
    return {"D": config.model.d_model, "V": vocab_size, "F": config.mlp_dim(), "H": a.num_heads,
            "Dh": a.head_dim, "GH": g.num_heads, "GK": g.head_dim,
            "GHV": g.num_v_heads or g.num_heads, "GV": g.v_head_dim or g.head_dim,
            "W": g.conv_size, "1": 1}


def _shape(symbolic: tuple[str, ...], symbols: dict[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(symbols[factor] for factor in entry.split("*")) for entry in symbolic)


def _fpa_layer_tensors(config: Config, layer_index: int) -> dict[str, tuple[str, ...]]:
    a = config.attention
    if layer_index in a.no_bias_layers:
        return dict(SOFTMAX_TENSORS)
    holds = {None: True, "content": a.content, "field": not a.stack_form,
             "level": a.key_level and not a.stack_form}
    return {name: shape for name, (shape, condition) in FPA_TENSORS.items() if holds[condition]}


def expected_layout(config: Config, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """fla-style tensor name -> shape that an export of this model must contain, exactly."""
    symbols = _symbols(config, vocab_size)
    table = dict(MODEL_TENSORS)
    if not config.model.tie_embeddings:
        table.update(UNTIED_HEAD)
    for index, kind in enumerate(config.layer_sections()):
        if kind == "gdn":
            mixer = GDN_TENSORS
        elif config.attention.kind == "fpa":
            mixer = _fpa_layer_tensors(config, index)
        elif config.attention.kind == "fox":
            mixer = FOX_TENSORS
        else:
            mixer = SOFTMAX_TENSORS
        for suffix, shape in {**BLOCK_TENSORS, **mixer}.items():
            table[f"model.layers.{index}.{suffix}"] = shape
    return {name: _shape(shape, symbols) for name, shape in table.items()}
