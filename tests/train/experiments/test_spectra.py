"""train/experiments/spectra.py on a randomly initialised GDN + attention model (no training):
the needle placement, the captured layer inputs (against the embedding and RMSNorm by hand),
the summary against gdn_jax.diagnostics called directly, and the report files."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax.diagnostics import gdn_transition_inputs, transition_spectrum, write_energy
from tests.seeds import case_seed
from train.core.model import build_mixer, build_model
from train.core.presets import load_config
from train.experiments.spectra import mixer_inputs, needle_inputs, run_spectra, write_report

CONFIG = ["model.pattern=AG", "model.num_layers=2", "model.d_model=32", "attention.kind=softmax",
          "attention.position=rope", "attention.num_heads=2", "attention.head_dim=16",
          "gdn.num_heads=2", "gdn.head_dim=16", "gdn.implementation=reference", "data.seq_len=32"]


def test_needle_inputs():
    rng = np.random.default_rng(case_seed(1410))
    hay = rng.integers(0, 256, size=(2, 20)).astype(np.int32)
    tokens = needle_inputs(hay, [7, 8, 9], 5)
    np.testing.assert_array_equal(tokens[:, 3:6], [[7, 8, 9]] * 2)
    np.testing.assert_array_equal(np.delete(tokens, [3, 4, 5], axis=1), np.delete(hay, [3, 4, 5], axis=1))
    for position in (1, 20):
        with pytest.raises(ValueError, match="needle_position"):
            needle_inputs(hay, [7, 8, 9], position)


@pytest.mark.slow
def test_summary_matches_the_diagnostics_and_the_report_is_written(tmp_path):
    config = load_config(None, CONFIG)
    model = build_model(config, 256)
    rng = np.random.default_rng(case_seed(1411))
    tokens = rng.integers(0, 256, size=(2, 24)).astype(np.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(case_seed(1412)), jnp.asarray(tokens),
                                 jnp.zeros(tokens.shape, jnp.int32))["params"]
    params = jax.tree.map(lambda x: x.value if hasattr(x, "value") else x, params,
                          is_leaf=lambda x: hasattr(x, "value"))

    inputs = mixer_inputs(model, params, tokens)
    embedded = np.asarray(params["embed"]["embedding"])[tokens]
    by_hand = embedded / np.sqrt(np.mean(embedded ** 2, -1, keepdims=True) + config.model.norm_eps)
    np.testing.assert_allclose(inputs["layers_0"], by_hand * np.asarray(
        params["layers_0"]["mixer_norm"]["scale"]), rtol=1e-4, atol=1e-5)

    position, distances = 6, [4, 17]
    summary, first = run_spectra(config, params, tokens, needle_position=position,
                                 distances=distances)
    module = build_mixer(config, 1, name=None)
    log_alpha, beta, keys = gdn_transition_inputs(module, params["layers_1"]["mixer"],
                                                  inputs["layers_1"])
    widths, energies = [], []
    for b in range(2):
        spectrum = transition_spectrum(log_alpha[b], beta[b], keys[b], start=position,
                                       distances=distances)
        widths.append(np.asarray(spectrum.slow_band_width))
        energies.append(np.asarray(write_energy(spectrum, keys[b, position])))
    np.testing.assert_allclose(summary["m_slow"], np.mean([w.sum(1) for w in widths], 0))
    np.testing.assert_allclose(summary["h_slow"], np.mean([(w > 0).sum(1) for w in widths], 0))
    np.testing.assert_allclose(summary["layers"]["layers_1"]["e_write"], np.mean(energies, 0),
                               rtol=1e-5, atol=1e-6)
    assert list(summary["layers"]) == ["layers_1"] and summary["layer_heads"] == 2
    assert summary["distances"] == distances

    results = [{"run": "a", "step": 1, **summary}, {"run": "b", "step": 2, **summary}]
    written = write_report(results, [first, first], tmp_path)
    assert sorted(p.name for p in written) == ["compare_layers_1.png", "slow_band.png",
                                               "spectra.json", "spectrum_layers_1.png"]
    for path in written[1:]:
        assert path.read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "spectra.json").read_text())["runs"][1]["step"] == 2
