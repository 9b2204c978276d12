"""The mixer table (train/core/mixers.py): a spec for every kind the config accepts, answers
that agree with the layers they describe, and validation that asks the table."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import traverse_util

from train.core.config import ConfigError
from train.core.mixers import MIXERS, layer_kinds, layer_spec
from train.core.model import build_mixer
from train.core.presets import load_config

ATTENTION = {"fpa": [], "fox": [], "softmax": ["attention.position=rope"],
             "selective": ["attention.position=rope"], "dcp": []}


def config_of(kind, *overrides):
    if kind == "gdn":
        return load_config("tiny_fpa", ["model.pattern=G", *overrides])
    return load_config("tiny_fpa", [f"attention.kind={kind}", *ATTENTION[kind], *overrides])


def test_every_kind_the_config_accepts_has_one_immutable_spec():
    assert set(MIXERS) == {*ATTENTION, "gdn"}
    for kind in (*ATTENTION, "gdn"):
        config = config_of(kind)
        assert set(layer_kinds(config)) == {kind}
        assert layer_spec(config, 0) is MIXERS[kind]
    with pytest.raises(TypeError):
        MIXERS["mamba"] = MIXERS["fox"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        MIXERS["fox"].flops_term = "dense"
    with pytest.raises(TypeError):
        MIXERS["gdn"].export_names[("x",)] = ("x", "same")


@pytest.mark.parametrize("kind,overrides", [
    *[(kind, []) for kind in (*ATTENTION, "gdn")],
    ("fpa", ["attention.dip_sum=true"]),
    ("fpa", ["model.num_layers=2", "attention.no_bias_layers=[1]"]),
])
def test_op_names_without_building_agree_with_the_layers(kind, overrides):
    config = config_of(kind, *overrides)
    for index in range(config.model.num_layers):
        spec = layer_spec(config, index)
        assert spec.op_name(config, index) == build_mixer(config, index, None).op_name


@pytest.mark.parametrize("kind", ["fpa", "fox", "softmax", "gdn"])
def test_export_names_cover_every_parameter_of_the_layer(kind):
    config = config_of(kind)
    mixer = build_mixer(config, 0, None)
    x = jnp.zeros((1, 4, config.model.d_model))
    params = nn.meta.unbox(jax.eval_shape(mixer.init, jax.random.PRNGKey(0), x))["params"]
    assert set(traverse_util.flatten_dict(params)) <= set(MIXERS[kind].export_names)


def test_decoding_exactly_where_a_cache_exists():
    assert {kind for kind, spec in MIXERS.items() if spec.decoding} == {"fpa", "fox", "softmax",
                                                                         "gdn"}


def test_export_exactly_where_a_model_holds_the_kind():
    """fla's models (or this project's fpa_transformer); format fpa-torch runs FPA only."""
    exported = {kind: spec.export for kind, spec in MIXERS.items() if spec.export}
    assert set(exported) == {"fpa", "fox", "softmax", "gdn"}
    assert {kind for kind, spec in exported.items() if spec.fpa_torch} == {"fpa"}


@pytest.mark.parametrize("kind,overrides,key", [
    ("fpa", ["attention.position=rope"], "attention.position"),
    ("softmax", ["attention.position=alibi", "attention.yarn_factor=2"], "attention.yarn_factor"),
    ("fox", ["attention.tau=2"], "attention.tau"),
    ("fpa", ["attention.tau=0"], "attention.tau"),
    ("gdn", ["gdn.num_heads=4", "gdn.num_v_heads=6"], "gdn.num_v_heads"),
    ("fpa", ["optim.freeze_gdn_decay=true"], "optim.freeze_gdn_decay"),
    ("selective", ["mesh.context=2"], "mesh.context"),
    ("fpa", ["mesh.context=2", "attention.dip_sum=true"], "attention.dip_sum"),
    ("fox", ["mesh.context=2", "attention.implementation=reference"], "attention.implementation"),
    ("gdn", ["gdn.implementation=fast"], "gdn.implementation"),
    ("fpa", ["attention.block_size=12"], "attention.block_size"),
    ("softmax", ["attention.block_size=-8"], "attention.block_size"),
    ("fpa", ["attention.dip_sum=true", "attention.block_size=16"], "attention.block_size"),
    ("selective", ["attention.block_size=16"],
     "attention.block_size only applies to attention.kind in ('fpa', 'fox', 'softmax')"),
])
def test_validation_errors_name_the_key(kind, overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        config_of(kind, *overrides)


def test_an_unknown_kind_is_named_by_validation_and_by_the_builder():
    with pytest.raises(ConfigError, match=r"attention\.kind must be one of \('fpa', 'fox', "
                                          r"'softmax', 'selective', 'dcp'\), got 'mamba'"):
        load_config("tiny_fpa", ["attention.kind=mamba"])
    with pytest.raises(ConfigError, match="got 'gdn'"):         # a kind of another section
        load_config("tiny_fpa", ["attention.kind=gdn"])
    config = load_config("tiny_fpa")
    unchecked = dataclasses.replace(config, attention=dataclasses.replace(config.attention,
                                                                          kind="mamba"))
    with pytest.raises(ValueError, match="attention.kind: unknown 'mamba'"):
        build_mixer(unchecked, 0, None)


@pytest.mark.parametrize("kind", ["fpa", "fox", "softmax"])
def test_attention_block_size_reaches_the_op(kind, monkeypatch):
    """attention.block_size goes from the config to the layer's op call (ring or not); unset,
    the op keeps its own default."""
    from mixer_core import shard
    calls = []

    def spy(op, ring, *arrays, **kwargs):
        calls.append(kwargs)
        return jnp.zeros_like(arrays[2])                   # v [B, T, H, Dv]

    monkeypatch.setattr(shard, "ring_or_shard", spy)
    x = jnp.zeros((1, 4, config_of(kind).model.d_model))
    for overrides, want in ([["attention.block_size=16"], 16], [[], None]):
        mixer = build_mixer(config_of(kind, *overrides), 0, None)
        assert mixer.block_size == want
        calls.clear()
        jax.eval_shape(mixer.init, jax.random.PRNGKey(0), x)
        assert [call.get("block_size") for call in calls] == [want], overrides


def test_gdn_width_counts_chunk_states_only_where_the_op_keeps_them(monkeypatch):
    """The width adds HV K V float32 values per chunk exactly where the op says it keeps its
    chunk-entering states (`gdn_api.keeps_chunk_states`, asked with the layer's
    implementation and T / context tokens per device); an implementation that cannot run
    here counts them. On one device along T, an op that keeps only its inputs lets the layer
    recompute q, k, v: 2 H K + 4 HV V."""
    from gdn_jax.ops import api as gdn_api
    from mixer_core.registry import UnsupportedImplementationError
    import train.core.mixers as mixers

    config = config_of("gdn", "model.dtype=bfloat16", "data.seq_len=64")
    g = config.gdn
    heads, dim = g.num_v_heads or g.num_heads, g.v_head_dim or g.head_dim
    states = heads * g.head_dim * dim * 4 // (mixers.GDN_CHUNK * 2)
    asked, keeps = [], {"now": True}

    def answer(implementation, **facts):
        asked.append((implementation, facts["seq_len"], facts["chunk_size"]))
        if keeps["now"] is None:
            raise UnsupportedImplementationError("not here")
        return keeps["now"]

    monkeypatch.setattr(gdn_api, "keeps_chunk_states", answer)
    widths = {}
    for keeps["now"] in (True, False, None):
        widths[keeps["now"]] = MIXERS["gdn"].width(config, 4)
    assert widths[True] - widths[False] == states > 0
    assert widths[None] == widths[True]
    assert asked == [(g.implementation, 16, mixers.GDN_CHUNK)] * 3
    keeps["now"] = False
    key_width = g.num_heads * g.head_dim
    assert MIXERS["gdn"].width(config, 1) == 2 * key_width + 4 * heads * dim
    assert widths[False] == 4 * key_width + 5 * heads * dim


def test_positions_kv_caches_and_transitions_are_the_layers_own():
    """positions: what each layer module accepts (fpa_jax's POSITIONS, NoPE elsewhere, none for
    GDN); a key-value cache of 2 H Dh values per token for every attention kind, none for the
    recurrent GDN; the delta-rule transition (what `spectra` measures) for GDN only."""
    from fpa_jax.layers.selective import POSITIONS as SELECTIVE
    from fpa_jax.layers.softmax import POSITIONS as SOFTMAX
    from gdn_jax.diagnostics import gdn_transition_inputs

    assert {kind: spec.positions for kind, spec in MIXERS.items()} == {
        "fpa": ("nope",), "fox": ("nope",), "softmax": SOFTMAX, "selective": SELECTIVE,
        "dcp": ("nope",), "gdn": ()}
    assert [kind for kind, spec in MIXERS.items() if "rope" in spec.positions] == [
        "softmax", "selective"]
    config = config_of("fpa", "attention.num_heads=3", "attention.head_dim=8")
    for kind, spec in MIXERS.items():
        assert spec.recurrent == (kind == "gdn") == (spec.kv_width is None)
        if not spec.recurrent:
            assert spec.kv_width(config) == 2 * 3 * 8
    assert {kind: spec.transition for kind, spec in MIXERS.items() if spec.transition} == {
        "gdn": gdn_transition_inputs}
    with pytest.raises(ConfigError, match=r"attention\.position='alibi' is not available for "
                                          r"attention\.kind='selective'"):
        config_of("selective", "attention.position=alibi")
