"""Checkpoint export (train/tools/export.py, flash-linear-attention layout): names and shapes
against the table, exact re-import, the transposes, the config, the refusals."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import traverse_util

from benchmarks import verify_export_fla as verify
from tests.seeds import case_seed
from train.core.mixers import MIXERS
from train.core.presets import load_config
from train.tools import export
from train.tools.export_layout import expected_layout
from train.tools.safetensors_file import read_safetensors, read_safetensors_header


VOCAB = 48


BASE = ["model.d_model=32", "model.num_layers=2", "attention.num_heads=2", "attention.head_dim=16",
        "gdn.num_heads=2", "gdn.head_dim=16", "model.vocab_size=48", "model.vocab_multiple=1"]


MODELS = {
    "fpa": (["attention.kind=fpa", "attention.no_bias_layers=[0]"], "fpa_transformer"),
    "fpa_variants": (["attention.kind=fpa", "attention.content=false", "attention.key_level=false",
                      "model.tie_embeddings=false"],
                     "fpa_transformer"),
    "fpa_gdn_hybrid": (["attention.kind=fpa", "attention.stack_form=true", "model.pattern=GA",
                        "gdn.num_v_heads=4", "gdn.v_head_dim=8"], "fpa_transformer"),
    "fox": (["attention.kind=fox", "model.num_layers=1"], "forgetting_transformer"),
    "softmax": (["attention.kind=softmax", "attention.position=rope", "model.num_layers=1",
                 "model.tie_embeddings=false"], "transformer"),
    "gdn": (["model.pattern=G", "gdn.num_v_heads=4", "gdn.conv_size=3"], "gated_deltanet"),
    "gdn_softmax_hybrid": (["model.pattern=GA", "attention.kind=softmax",
                            "attention.position=rope", "attention.rope_base=500000",
                            "gdn.num_v_heads=4", "gdn.v_head_dim=8", "gdn.conv_size=3"],
                           "gated_deltanet"),
}


def random_params(config, seed):
    """Every leaf of the model's params filled with fresh normal values (no zero kernels)."""
    abstract = export.abstract_params(config, VOCAB)
    leaves, tree = jax.tree.flatten(abstract)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(tree, [rng.standard_normal(x.shape).astype(np.float32)
                                     for x in leaves])


def bits(array):
    array = np.asarray(array)
    return array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint32)


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    overrides, model_type = MODELS[request.param]
    config = load_config(None, BASE + overrides)
    params = random_params(config, case_seed(hash(request.param) % 1000))
    out = export.export_params(params, config, VOCAB, tmp_path_factory.mktemp(request.param))
    return config, params, out, model_type


def test_names_and_shapes_match_the_table(exported):
    config, _, out, _ = exported
    tensors, metadata = read_safetensors(out / export.WEIGHTS_FILE)
    assert {name: t.shape for name, t in tensors.items()} == expected_layout(config, VOCAB)
    assert all(t.dtype == np.float32 for t in tensors.values())
    assert metadata == {"format": "pt"}


def test_reimport_is_bit_identical(exported):
    _, params, out, _ = exported
    config, vocab_size, restored = export.load_export(out)
    assert vocab_size == VOCAB
    assert jax.tree.structure(restored) == jax.tree.structure(params)
    for path, leaf in traverse_util.flatten_dict(params).items():
        back = traverse_util.flatten_dict(restored)[path]
        assert back.dtype == np.float32 and back.shape == leaf.shape, path
        np.testing.assert_array_equal(bits(back), bits(leaf), err_msg="/".join(path))


def test_config_and_readme(exported):
    config, _, out, model_type = exported
    saved = json.loads((out / export.CONFIG_FILE).read_text())
    assert saved["model_type"] == model_type
    assert saved["hidden_size"] == 32 and saved["vocab_size"] == VOCAB
    assert saved["num_hidden_layers"] == config.model.num_layers
    assert saved["intermediate_size"] == config.mlp_dim()
    assert saved["tie_word_embeddings"] == config.model.tie_embeddings
    assert saved["dtype"] == "float32" and "torch_dtype" not in saved
    if model_type == "gated_deltanet":
        g = config.gdn
        assert (saved["num_heads"], saved["head_dim"]) == (g.num_heads, g.head_dim)
        assert saved["num_v_heads"] == (g.num_v_heads or g.num_heads)
        assert saved["expand_v"] * g.head_dim == (g.v_head_dim or g.head_dim)
        assert saved["conv_size"] == g.conv_size
        attention_layers = [i for i, k in enumerate(config.layer_sections()) if k == "attention"]
        if attention_layers:
            assert saved["attn"]["layers"] == attention_layers
            assert saved["attn"]["rope_theta"] == config.attention.rope_base
            assert saved["attn"]["num_heads"] * 16 == 32
        else:
            assert saved["attn"] is None
    if model_type in ("transformer", "forgetting_transformer"):
        assert saved["num_heads"] * 16 == saved["hidden_size"]
    readme = (out / export.README_FILE).read_text()
    assert model_type in readme
    if model_type == "fpa_transformer":
        assert "delta_proj.weight" in readme and "rho" in readme
    else:
        assert "AutoModelForCausalLM" in readme


def test_transposes_follow_torch_conventions():
    """x @ kernel (flax) == x @ weight.T (torch Linear); conv taps keep their order."""
    config = load_config(None, BASE + ["model.pattern=GA", "attention.kind=fox"])
    params = random_params(config, case_seed(11))
    flat = export._numpy_params(params)
    tensors = {e.name: export.to_torch(e.kind, flat[e.flax_path])
               for e in export.plan(config, params)}
    x = np.random.default_rng(case_seed(12)).standard_normal((3, 32)).astype(np.float32)
    attn, gdn = params["layers_1"]["mixer"], params["layers_0"]["mixer"]
    q_flax = np.einsum("bd,dhk->bhk", x, attn["query"]["kernel"]).reshape(3, -1)
    np.testing.assert_allclose(x @ tensors["model.layers.1.attn.q_proj.weight"].T, q_flax,
                               rtol=1e-5, atol=1e-5)
    o = np.random.default_rng(case_seed(13)).standard_normal((3, 2, 16)).astype(np.float32)
    np.testing.assert_allclose(o.reshape(3, -1) @ tensors["model.layers.1.attn.o_proj.weight"].T,
                               np.einsum("bhk,hkd->bd", o, attn["out"]["kernel"]),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tensors["model.layers.0.attn.g_proj.weight"],
                                  gdn["z_proj"]["kernel"].T)
    conv = tensors["model.layers.0.attn.k_conv1d.weight"]
    assert conv.shape == (32, 1, 4)
    for channel, tap in [(0, 0), (5, 3), (31, 1)]:
        assert conv[channel, 0, tap] == gdn["k_conv"]["kernel"][tap, channel]
    np.testing.assert_array_equal(tensors["model.layers.1.attn.f_proj.weight"],
                                  attn["forget_proj"]["kernel"].T)


def test_bf16_export_rounds_once_and_reimports_exactly(tmp_path):
    config = load_config(None, BASE + ["model.pattern=GA", "attention.kind=softmax",
                                       "attention.position=rope"])
    params = random_params(config, case_seed(21))
    export.export_params(params, config, VOCAB, tmp_path, dtype="bf16")
    header, _ = read_safetensors_header(tmp_path / export.WEIGHTS_FILE)
    assert {entry["dtype"] for name, entry in header.items() if name != "__metadata__"} == {"BF16"}
    assert json.loads((tmp_path / export.CONFIG_FILE).read_text())["dtype"] == "bfloat16"
    _, _, restored = export.load_export(tmp_path)
    for path, leaf in traverse_util.flatten_dict(params).items():
        back = traverse_util.flatten_dict(restored)[path]
        assert back.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(bits(back), bits(leaf.astype(ml_dtypes.bfloat16)))


@pytest.mark.parametrize("overrides,message", [
    (["attention.kind=softmax", "attention.position=nope"], "position='nope'"),
    (["attention.kind=softmax", "attention.position=alibi"], "position='alibi'"),
    (["attention.kind=selective"], "kind='selective'"),
    (["attention.kind=dcp"], "kind='dcp'"),
    (["attention.kind=fox", "model.pattern=GA"], "hybrid"),
    (["attention.kind=fox", "attention.head_dim=8"], "num_heads \\* head_dim == d_model"),
    (["attention.kind=softmax", "attention.position=rope", "attention.num_heads=4"],
     "num_heads \\* head_dim == d_model"),
])
def test_models_fla_cannot_hold_are_refused(overrides, message):
    with pytest.raises(export.ExportError, match=message):
        export.fla_config(load_config(None, BASE + overrides), VOCAB)


def test_the_refusal_of_a_kind_names_the_kinds_the_mixer_table_exports():
    with pytest.raises(export.ExportError, match="exportable: ") as error:
        export.fla_config(load_config(None, BASE + ["attention.kind=dcp"]), VOCAB)
    named = str(error.value).split("exportable: ")[1].split(", ")
    assert {name.split(" ")[0] for name in named} == {
        kind for kind, spec in MIXERS.items() if spec.export is not None}


def test_unknown_parameters_and_dtypes_are_refused(tmp_path):
    config = load_config(None, BASE + ["attention.kind=fox", "model.num_layers=1"])
    params = random_params(config, case_seed(31))
    extra = {**params, "layers_0": {**params["layers_0"], "mixer": {
        **params["layers_0"]["mixer"], "mystery": {"kernel": np.zeros((2, 2), np.float32)}}}}
    with pytest.raises(export.ExportError, match="layers_0/mixer/mystery/kernel"):
        export.export_params(extra, config, VOCAB, tmp_path)
    with pytest.raises(export.ExportError, match="dtype"):
        export.export_params(params, config, VOCAB, tmp_path, dtype="float16")
    export.export_params(params, config, VOCAB, tmp_path)
    other = load_config(None, BASE + ["attention.kind=fox", "model.num_layers=2"])
    with pytest.raises(ValueError, match="missing"):
        export.import_params(tmp_path, other, export.abstract_params(other, VOCAB))


@pytest.mark.parametrize("name", ["fox", "softmax", "gdn_softmax_hybrid"])
def test_fla_convention_forward_matches_the_jax_model(name, tmp_path):
    """The export read back by the float64 forward in fla's conventions
    (benchmarks/verify_export_fla.py f64_logits) gives the JAX model's logits."""
    from train.core.model import LanguageModel

    config = load_config(None, BASE + MODELS[name][0] + ["gdn.implementation=reference"])
    params = random_params(config, case_seed(51 + len(name)))
    params = jax.tree.map(lambda p: p * np.float32(0.3), params)    # keep activations moderate
    export.export_params(params, config, VOCAB, tmp_path)
    tokens = np.random.default_rng(case_seed(61)).integers(0, VOCAB, 11)
    forward = jax.jit(LanguageModel(config, VOCAB).apply)
    expected = forward({"params": params}, tokens[None], np.ones((1, 11), np.int32))[0]
    np.testing.assert_allclose(verify.f64_logits(tmp_path, tokens[None])[0], expected,
                               rtol=2e-4, atol=2e-4)


def test_embedded_config_holds_only_what_defines_the_model(exported):
    """config.json embeds the model's part of the training config (model, the mixer sections
    its layers use, the trained length), not the data source, optimizer, mesh or schedule;
    it still rebuilds the same config for the model."""
    config, _, out, _ = exported
    embedded = json.loads((out / export.CONFIG_FILE).read_text())[export.JAX_CONFIG_KEY]["config"]
    kinds = set(config.layer_sections())
    assert set(embedded) == {"name", "model", "data"} | ({"attention", "gdn"} & kinds)
    assert embedded["data"] == {"seq_len": config.data.seq_len}
    restored, _, _ = export.load_export(out)
    assert restored.model == config.model
    for kind in kinds:
        assert getattr(restored, kind) == getattr(config, kind)
