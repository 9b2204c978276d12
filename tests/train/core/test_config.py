"""Config presets, key=value overrides, validation errors and the CLI's front door."""

import pytest

from train.cli import entry as cli
from train.core.config import ConfigError
from train.core.presets import CONFIG_DIR, apply_overrides, config_from_dict, load_config

PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def test_required_presets_exist():
    required = {"tiny_fpa", "tiny_fox", "tiny_softmax", "tiny_gdn", "tiny_hybrid", "fpa_125m",
                "fox_125m", "softmax_rope_125m", "selective_rope_125m", "gdn_125m", "hybrid_125m"}
    assert required <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_validates(preset):
    config = load_config(preset)
    assert config.name == preset
    assert len(config.layer_sections()) == config.model.num_layers


@pytest.mark.parametrize("preset,kind,position", [
    ("fpa_125m", "fpa", "nope"), ("fox_125m", "fox", "nope"),
    ("softmax_rope_125m", "softmax", "rope"), ("selective_rope_125m", "selective", "rope")])
def test_paper_sized_attention_presets(preset, kind, position):
    config = load_config(preset)
    assert (config.model.num_layers, config.model.d_model) == (12, 768)
    assert (config.attention.num_heads, config.attention.head_dim) == (12, 64)
    assert (config.attention.kind, config.attention.position) == (kind, position)
    assert set(config.layer_sections()) == {"attention"}


def test_gdn_and_hybrid_presets_have_their_mixers():
    assert set(load_config("gdn_125m").layer_sections()) == {"gdn"}
    hybrid = load_config("hybrid_125m").layer_sections()
    assert hybrid.count("gdn") == 9 and hybrid.count("attention") == 3
    assert load_config("tiny_hybrid").layer_sections() == ("gdn", "gdn", "gdn", "attention")


def test_overrides_are_dotted_and_typed():
    config = load_config("tiny_fpa", ["model.num_layers=4", "optim.lr=1e-3", "model.pattern=GA",
                                      "attention.no_bias_layers=[1]", "optim.clip_norm=0",
                                      "model.tie_embeddings=false", "attention.implementation=xla"])
    assert config.model.num_layers == 4 and config.model.pattern == "GA"
    assert config.optim.lr == 1e-3 and isinstance(config.optim.lr, float)
    assert config.optim.clip_norm == 0.0 and isinstance(config.optim.clip_norm, float)
    assert config.attention.no_bias_layers == (1,)
    assert config.model.tie_embeddings is False
    assert config.attention.implementation == "xla"
    assert config.layer_sections() == ("gdn", "attention", "gdn", "attention")
    # the preset file itself is untouched by overrides
    assert load_config("tiny_fpa").model.num_layers == 2


def test_overrides_do_not_mutate_the_input():
    raw = {"model": {"d_model": 32}}
    merged = apply_overrides(raw, ["model.d_model=64"])
    assert raw == {"model": {"d_model": 32}} and merged["model"]["d_model"] == 64


@pytest.mark.parametrize("overrides,message", [
    (["model.bogus=1"], "model.bogus"),
    (["modle.d_model=1"], "modle"),
    (["model.num_layers=two"], "model.num_layers"),
    (["model.num_layers=1.5"], "model.num_layers"),
    (["model.num_layers=true"], "model.num_layers"),
    (["optim.lr=fast"], "optim.lr"),
    (["model.tie_embeddings=3"], "model.tie_embeddings"),
    (["attention.no_bias_layers=zero"], "attention.no_bias_layers"),
    (["model"], "key=value"),
    (["model.d_model.x=1"], "d_model"),
])
def test_unknown_keys_and_wrong_types_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config("tiny_fpa", overrides)


@pytest.mark.parametrize("overrides,message", [
    (["model.num_layers=3", "model.pattern=GA"], "tile"),
    (["model.pattern=AXG"], "model.pattern"),
    (["attention.position=rope"], "attention.position"),
    (["attention.kind=softmax", "attention.position=bogus"], "attention.position"),
    (["attention.kind=selective", "attention.position=alibi"], "attention.position"),
    (["attention.kind=mamba"], "attention.kind"),
    (["attention.kind=fox", "attention.no_bias_layers=[0]"], "no_bias_layers"),
    (["attention.no_bias_layers=[2]"], "out of range"),
    (["attention.no_bias_layers=[0]", "attention.content=false"], "no attention logits"),
    (["model.pattern=GA", "attention.no_bias_layers=[0]"], "gdn layer"),
    (["attention.kind=fox", "attention.stack_form=true"], "FPA options"),
    (["model.scan_layers=true", "attention.no_bias_layers=[0]"], "scan_layers"),
    (["optim.alpha_lr_scale=0.5"], "GatedDeltaNet"),
    (["model.pattern=G", "gdn.num_heads=4", "gdn.num_v_heads=6"], "num_v_heads"),
    (["optim.name=lion"], "optim.name"),
    (["optim.schedule=linear"], "optim.schedule"),
    (["optim.warmup_steps=700"], "warmup_steps"),
    (["data.heldout_fraction=0"], "heldout_fraction"),
    (["model.dtype=float16"], "model.dtype"),
    (["mesh.data=0"], "mesh.data"),
    (["train.steps=0"], "train.steps"),
    (["train.init_on=gpu"], "train.init_on must be 'host' or 'device'"),
    (["cpt.mode=column"], "cpt.mode"),
])
def test_impossible_combinations_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny_fpa", overrides)


def test_config_round_trips_through_its_dict():
    config = load_config("tiny_hybrid", ["attention.kind=fpa", "attention.position=nope",
                                         "attention.no_bias_layers=[3]"])
    assert config_from_dict(config.to_dict()) == config


def test_cli_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for command in ("fit", "eval", "prepare", "plot", "bench", "cpt", "probe", "generate",
                    "export", "main"):
        assert command in text


def test_cli_reports_config_errors_before_starting(capsys, tmp_path):
    run_dir = tmp_path / "run"
    assert cli.main(["fit", "tiny_fpa", "model.bogus=1", "--run-dir", str(run_dir)]) == 2
    assert "model.bogus" in capsys.readouterr().err
    assert not run_dir.exists()
    assert cli.main(["fit", "no_such_preset"]) == 2
    assert "tiny_fpa" in capsys.readouterr().err  # lists the presets


def test_every_preset_extends_a_base():
    import yaml

    bases = {}
    for preset in PRESETS:
        bases[preset] = yaml.safe_load((CONFIG_DIR / f"{preset}.yaml").read_text())["base"]
    assert {bases[p] for p in PRESETS if p.startswith("tiny_")} == {"base/tiny"}
    assert bases["gdn_125m_cpt"] == "gdn_125m"
    assert {bases[p] for p in PRESETS
            if p.endswith("_125m")} == {"base/paper_125m"}


def test_inherited_values_are_resolved():
    """Values pinned from the presets as they were before inheritance (one file each)."""
    cpt = load_config("gdn_125m_cpt")
    assert cpt.name == "gdn_125m_cpt"
    assert (cpt.data.seq_len, cpt.data.batch_size, cpt.optim.name, cpt.optim.lr) == (
        8192, 64, "muon", 8.6e-4)
    assert (cpt.model.d_model, cpt.model.mlp_dim, cpt.model.dtype) == (768, 2048, "bfloat16")
    assert (cpt.gdn.num_heads, cpt.train.log_every, cpt.train.position_buckets) == (12, 20, 16)
    assert (cpt.optim.min_lr_ratio, cpt.train.checkpoint_every) == (0.1, 250)
    fox = load_config("fox_125m")
    assert (fox.attention.kind, fox.attention.num_heads, fox.optim.warmup_steps,
            fox.train.steps, fox.data.source) == ("fox", 12, 500, 5150, "arrayrecord:data/lm")
    gdn = load_config("tiny_gdn")
    assert (gdn.model.d_model, gdn.train.steps, gdn.optim.lr) == (64, 600, 3e-3)
    assert (gdn.attention.num_heads, gdn.attention.head_dim) == (2, 16)  # defaults, not a base's


def test_user_preset_extends_a_preset_and_is_validated_before_overrides(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: tiny_fpa\nmodel:\n  num_layers: 4\n")
    (tmp_path / "mine_long.yaml").write_text("base: mine\ndata:\n  seq_len: 512\n")
    config = load_config(str(tmp_path / "mine_long.yaml"), ["optim.lr=1e-3"])
    assert config.name == "mine_long"
    assert (config.model.num_layers, config.data.seq_len, config.optim.lr) == (4, 512, 1e-3)
    assert (config.attention.kind, config.attention.num_heads, config.train.steps) == ("fpa", 4, 600)

    (tmp_path / "broken.yaml").write_text("base: tiny_fpa\nattention:\n  position: rope\n")
    with pytest.raises(ConfigError, match="attention.position"):  # an override cannot rescue it
        load_config(str(tmp_path / "broken.yaml"), ["attention.kind=softmax"])
    (tmp_path / "a.yaml").write_text("base: b\n")
    (tmp_path / "b.yaml").write_text("base: a\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "orphan.yaml").write_text("base: no_such_base\n")
    with pytest.raises(ConfigError, match="no_such_base"):
        load_config(str(tmp_path / "orphan.yaml"))
    with pytest.raises(ConfigError, match="unknown config key 'base'"):
        load_config("tiny_fpa", ["base=tiny_fox"])


def test_run_directory_stores_the_resolved_config(tmp_path):
    import json

    from train.checkpoint.run_files import save_run_files

    config = load_config("gdn_125m_cpt")
    save_run_files(tmp_path, config=config.to_dict())
    stored = json.loads((tmp_path / "config.json").read_text())
    assert "base" not in stored and stored["train"]["log_every"] == 20
    assert config_from_dict(stored) == config


@pytest.mark.parametrize("content, message", [
    (b"\x00\xff\xfe", "not a UTF-8 text file"),
    (b"", "the file is empty"),
    (b"base: tiny_fpa\noptim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", "line 4: key 'lr' appears twice"),
])
def test_a_yaml_file_that_is_not_one_config_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))
    assert cli.main(["config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and message in err[0]
