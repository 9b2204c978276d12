"""The SpectralShift demonstration's machinery (benchmarks/spectralshift_demo.py), without
training: every variant's cpt config (what it switches, the same tokens for all) and the table."""

import importlib.util
from pathlib import Path

import pytest

from gdn_jax.spectral_shift import spectralshift_scale

DEMO = Path(__file__).resolve().parents[2] / "benchmarks" / "spectralshift_demo.py"


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("spectralshift_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_variants_switch_what_they_say_on_the_same_tokens(demo):
    size = demo.SIZES["cpu"]
    expected = {"plain": (False, False, 0.5), "ss_k0.5": (True, True, 0.5),
                "reparam": (True, False, 0.5), "lr_scale": (False, True, 0.5),
                "ss_k1": (True, True, 1.0)}
    assert set(demo.VARIANTS) == set(expected)
    data = set()
    for pattern, positions in (("G", "keep"), ("GA", "abf")):
        for name, switches in expected.items():
            config = demo.extension_config(size, pattern, Path("ref"), name)
            c = config.cpt
            assert (c.reparameterize, c.scale_lr, c.k) == switches, name
            assert c.positions == positions and config.optim.freeze_gdn_decay
            assert spectralshift_scale(size["short"], config.data.seq_len, c.k) == pytest.approx(
                demo.VARIANT_S[name] if name != "plain" else 0.5)
            data.add((pattern, config.data.seq_len * config.data.batch_size, config.data.seed,
                      config.train.steps, config.data.source))
    assert len(data) == 2    # one token stream per model, shared by its five variants
    assert {tokens for _, tokens, *_ in data} == {size["short"] * size["batch"]}


def test_table_lists_every_model_and_variant(demo, tmp_path):
    summary = {"distances": [7, 223], "m_slow": [3.0, 0.0], "h_slow": [1.0, 0.0],
               "e_write_mean": [0.25, 0.0], "layer_heads": 8}
    rows = [{"variant": v, "s": s, "summary": summary, "loss_short": 2.5, "loss_target": 2.7,
             "retrieval": {"passkey": 0.5}} for v, s in [("reference", 1.0), ("ss_k0.5", 0.5)]]
    records = {"size": "cpu", "settings": demo.SIZES["cpu"], "needle_position": 32,
               "models": {"gdn": rows, "hybrid": rows}}
    text = demo.write_table(records, tmp_path, 1.0)
    lines = text.splitlines()
    assert len(lines) == 2 + 4 and "M_slow @ ell 7/223" in lines[0]
    assert lines[3].startswith("| gdn | ss_k0.5 | 0.5 | 3.0 / 0.0 | 1.0 / 0.0 of 8 | 0.250 / 0.000")
    assert "passkey 0.50" in lines[3]
    assert (tmp_path / "table.md").read_text().endswith(text + "\n")


def test_prose_size_extends_the_language_model_comparisons_gdn(demo):
    """h200_prose builds on configs/lmc_h200_gdn.yaml (its shape and corpus) and offers no
    hybrid; every variant sees the pretraining's tokens per step at 4x the context."""
    size = demo.SIZES["h200_prose"]
    config = demo.extension_config(size, "G", Path("ref"), "ss_k1")
    assert (config.model.d_model, config.model.num_layers, config.model.pattern) == (768, 12, "G")
    assert config.data.source == "arrayrecord:data/prose"
    assert (config.data.seq_len, config.data.seq_len * config.data.batch_size) == (
        4 * size["short"], size["short"] * size["batch"])
    assert config.cpt.k == 1.0 and config.cpt.positions == "keep"
    with pytest.raises(SystemExit, match="error: --models: this size has only \\['gdn'\\]"):
        demo.extension_config(size, "GA", Path("ref"), "plain")


def test_a_later_call_adds_its_variants_and_replaces_the_reference(demo):
    earlier = [{"variant": "reference", "loss_short": 1.0}, {"variant": "plain", "loss_short": 2.0},
               {"variant": "ss_k0.5", "loss_short": 3.0}]
    rows = [{"variant": "reference", "loss_short": 1.5, "first": [0], "tokens": [1]},
            {"variant": "ss_k1", "loss_short": 4.0, "first": [0], "tokens": [1]}]
    merged = demo.merge_rows(rows, earlier)
    assert [(r["variant"], r["loss_short"]) for r in merged] == [
        ("reference", 1.5), ("plain", 2.0), ("ss_k0.5", 3.0), ("ss_k1", 4.0)]
    assert all("first" not in r and "tokens" not in r for r in merged)
    kept = demo.merge_rows(rows[1:], earlier)     # --reference-from-results: measured no reference
    assert [(r["variant"], r["loss_short"]) for r in kept] == [
        ("reference", 1.0), ("plain", 2.0), ("ss_k0.5", 3.0), ("ss_k1", 4.0)]


def test_skip_measured_continues_where_an_earlier_call_stopped(demo):
    earlier = [{"variant": "reference"}, {"variant": "plain"}]
    variants = ["plain", "ss_k0.5", "ss_k1"]
    assert demo.variants_to_run(variants, earlier, skip_measured=True) == ["ss_k0.5", "ss_k1"]
    assert demo.variants_to_run(variants, earlier, skip_measured=False) == variants
    assert demo.variants_to_run(variants, [], skip_measured=True) == variants


def test_reference_from_results_needs_an_earlier_reference_row(demo, tmp_path):
    with pytest.raises(SystemExit, match="error: --reference-from-results: .* no reference row "
                                         "of gdn at size h200_prose"):
        demo.main(["--size", "h200_prose", "--models", "gdn", "--variants", "plain",
                   "--reference-from-results", "--out", str(tmp_path), "--runs", str(tmp_path)])
