"""Spectral diagnostics of a trained GDN model on needle-in-a-haystack inputs (docs/gdn.md,
"Diagnostics"; the measures themselves are gdn_jax/diagnostics.py).

    input     num_samples sequences of T = max(lengths) tokens: held-out text of the run (its
              eval stream, concatenated as one document) with a needle sentence whose last
              token sits at position p (needle_position)
    distance  ell_L = L - 1 - p for each L in lengths: the needle at p, the question at L - 1
    per GDN layer (its input = the layer's mixer_norm output, captured from the model):
              log_alpha, beta, keys = gdn_transition_inputs(...)
              spectrum of Phi_{p -> p + ell} (transition_spectrum, start = p)
              E_write[ell, head] = share of the needle key k_p in the slow modes' input subspace
    summary   M_slow[ell] (slow modes summed over layer-heads), H_slow[ell] (layer-heads with a
              slow mode), E_write per layer and head; every number is a mean over the samples;
              gamma (decay rates, sorted ascending per head) is the mean over samples too

`spectra(run_dir, ...)` -> dict (JSON-ready); `write_report(results, out_dir)` writes
spectra.json and the PNGs: spectrum_<layer>.png (decay rates per head and distance, first
sample), slow_band.png (M_slow, H_slow and mean E_write against distance, one line per run),
and with two runs compare_<layer>.png (the rates of both, overlaid). The first run is drawn
solid, the second dashed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gdn_jax.diagnostics import (plot_decay_spectra, slow_mode_summary, transition_spectrum,
                                 write_energy)
from train.core.mixers import MIXERS, layer_kinds
from train.core.model import build_mixer, build_model

NEEDLE = " the key is 7413. "
DEFAULT_LENGTHS = (64, 256, 1024)
DEFAULT_NEEDLE_POSITION = 24


def haystack(run_dir: str | Path, length: int, num_samples: int) -> np.ndarray:
    """[num_samples, length] int32: the run's held-out token stream, cut into pieces."""
    # deferred: `python -m train --help` imports this module (the spectra defaults); the
    # trainer's orbax, optax and grain load only when a spectrum is measured
    from train.core.runs import load_run
    from train.core.session import make_split_dataset

    config, tokenizer = load_run(run_dir)
    stream, needed = [], num_samples * length
    for batch in make_split_dataset(config, tokenizer, "eval"):
        stream.append(np.asarray(batch["tokens"]).reshape(-1))
        if sum(len(s) for s in stream) >= needed:
            break
    tokens = np.concatenate(stream) if stream else np.zeros((0,), np.int32)
    if len(tokens) < needed:        # a small held-out split: repeat it
        if not len(tokens):
            raise ValueError(f"{run_dir}: the held-out split is empty")
        tokens = np.resize(tokens, needed)
    return tokens[:needed].reshape(num_samples, length).astype(np.int32)


def needle_tokens(run_dir: str | Path, length: int, num_samples: int, position: int
                  ) -> np.ndarray:
    """[num_samples, length] int32: the needle inputs `spectra` makes for a run (its held-out
    text with NEEDLE's last token at `position`); the same for every call on the same run."""
    # deferred: keeps orbax, optax and grain (the trainer) out of the plotting imports
    from train.core.runs import load_run

    _, tokenizer = load_run(run_dir)
    return needle_inputs(haystack(run_dir, length, num_samples), tokenizer.encode(NEEDLE),
                         position)


def needle_inputs(haystacks: np.ndarray, needle: Sequence[int], position: int) -> np.ndarray:
    """haystacks [N, T] with the needle's tokens ending at `position` (a copy)."""
    needle = np.asarray(needle, np.int32)
    start = position - len(needle) + 1
    if not len(needle) or start < 0 or position >= haystacks.shape[1]:
        raise ValueError(f"needle_position: the needle ({len(needle)} tokens) must end at a "
                         f"position in [{len(needle) - 1}, {haystacks.shape[1] - 1}], got {position}")
    tokens = np.array(haystacks)
    tokens[:, start:position + 1] = needle
    return tokens


def mixer_inputs(model, params, tokens: np.ndarray) -> dict[str, jax.Array]:
    """{"layers_i": the input of layer i's mixer [N, T, D]} for every layer, one forward pass."""
    tokens = jnp.asarray(tokens)

    def is_mixer_norm(module, method_name):
        return isinstance(module, nn.RMSNorm) and module.name == "mixer_norm"

    @jax.jit
    def captured_inputs(params, tokens):
        _, state = model.apply({"params": params}, tokens, jnp.zeros_like(tokens),
                               capture_intermediates=is_mixer_norm, mutable=["intermediates"])
        return state["intermediates"]

    captured = captured_inputs(params, tokens)
    return {name: captured[name]["mixer_norm"]["__call__"][0] for name in captured
            if name.startswith("layers_")}


def transition_layers(config) -> dict[str, tuple[int, Any]]:
    """{"layers_i": (i, its `MixerSpec.transition`)} for every layer whose mixer has a
    delta-rule transition to measure (the GatedDeltaNet layers)."""
    return {f"layers_{index}": (index, MIXERS[kind].transition)
            for index, kind in enumerate(layer_kinds(config))
            if MIXERS[kind].transition is not None}


def run_spectra(config, params, tokens: np.ndarray, *, needle_position: int,
                distances: Sequence[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary dict, {layer: first sample's TransitionSpectrum}) for a model and its inputs."""
    vocab = params["embed"]["embedding"].shape[0]
    model = build_model(config, vocab)
    inputs = mixer_inputs(model, params, tokens)
    gdn_layers = transition_layers(config)
    per_sample, first = [], {}
    layers: dict[str, Any] = {}
    for name, (index, transition) in gdn_layers.items():
        module = build_mixer(config, index, name=None)
        log_alpha, beta, keys = transition(module, params[name]["mixer"], inputs[name])
        spectra = [transition_spectrum(log_alpha[b], beta[b], keys[b], start=needle_position,
                                       distances=distances) for b in range(tokens.shape[0])]
        first[name] = spectra[0]
        per_sample.append(spectra)
        energy = np.stack([np.asarray(write_energy(s, keys[b, needle_position]))
                           for b, s in enumerate(spectra)])                       # [N, L, HV]
        gamma = np.stack([np.sort(np.asarray(s.gamma), axis=-1) for s in spectra])
        layers[name] = {
            "gamma": np.mean(gamma, axis=0).tolist(),                              # [L, HV, K]
            "gamma_alpha": np.mean([np.asarray(s.gamma_alpha) for s in spectra], axis=0).tolist(),
            "slow_band_width": np.mean([np.asarray(s.slow_band_width) for s in spectra],
                                       axis=0).tolist(),                           # [L, HV]
            "e_write": np.mean(energy, axis=0).tolist(),                           # [L, HV]
        }
    summaries = [slow_mode_summary([spectra[b] for spectra in per_sample])
                 for b in range(tokens.shape[0])]
    e_write = np.concatenate([np.asarray(layers[n]["e_write"]) for n in gdn_layers], axis=1)
    return {
        "distances": [int(d) for d in sorted(set(distances))],
        "m_slow": np.mean([np.asarray(s.m_slow) for s in summaries], axis=0).tolist(),
        "h_slow": np.mean([np.asarray(s.h_slow) for s in summaries], axis=0).tolist(),
        "e_write_mean": e_write.mean(axis=1).tolist(),
        "layer_heads": int(e_write.shape[1]),
        "layers": layers,
    }, first


def spectra(run_dir: str | Path, *, step: int | None = None,
            lengths: Sequence[int] = DEFAULT_LENGTHS, needle_position: int = DEFAULT_NEEDLE_POSITION,
            num_samples: int = 4, tokens: np.ndarray | None = None) -> tuple[dict, dict, np.ndarray]:
    """(summary, first-sample spectra per layer, tokens) of a run's checkpoint (module doc).
    `tokens` [N, max(lengths)] reuses another run's needle inputs (for a comparison)."""
    # deferred: `python -m train --help` imports this module (the spectra defaults); the
    # trainer's orbax, optax and grain load only when a spectrum is measured
    from train.core.runs import load_run, restore_run_state
    from train.core.session import build_session

    lengths = sorted({int(length) for length in lengths})
    if not lengths or lengths[0] <= needle_position + 1:
        raise ValueError(f"--lengths: every length must exceed needle_position + 1 = "
                         f"{needle_position + 1}, got {lengths}")
    if num_samples < 1:
        raise ValueError(f"num_samples: expected >= 1, got {num_samples}")
    config, tokenizer = load_run(run_dir)
    if not transition_layers(config):
        raise ValueError(f"{run_dir}: the model has no GatedDeltaNet layers "
                         f"(model.pattern={config.model.pattern!r})")
    session = build_session(config, tokenizer.vocab_size)
    restored = restore_run_state(run_dir, session, step)
    if tokens is None:
        tokens = needle_tokens(run_dir, lengths[-1], num_samples, needle_position)
    distances = [length - 1 - needle_position for length in lengths]
    summary, first = run_spectra(config, restored.state["params"], tokens,
                                 needle_position=needle_position, distances=distances)
    return ({"run": str(run_dir), "step": restored.step, "seq_len": config.data.seq_len,
             "lengths": lengths, "needle_position": needle_position,
             "num_samples": int(tokens.shape[0]), **summary}, first, tokens)


def write_report(results: Sequence[dict], first_spectra: Sequence[dict], out_dir: str | Path
                 ) -> list[Path]:
    """spectra.json and the PNGs (module doc) for one run, or two (before, after)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "spectra.json"]
    written[0].write_text(json.dumps({"runs": list(results)}, indent=1) + "\n")
    for layer, spectrum in first_spectra[0].items():
        written.append(Path(plot_decay_spectra(spectrum, str(out_dir / f"spectrum_{layer}.png"),
                                               title=f"{results[0]['run']} {layer}")))
    written.append(_plot_slow_band(results, out_dir / "slow_band.png"))
    if len(results) == 2:
        for layer in results[0]["layers"]:
            if layer in results[1]["layers"]:
                written.append(_plot_comparison(results, layer, out_dir / f"compare_{layer}.png"))
    return written


def _figure(width: float, height: float, panels: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * panels, height), constrained_layout=True)
    FigureCanvasAgg(figure)
    return figure, figure.subplots(1, panels, squeeze=False)[0]


def _label(result: dict) -> str:
    return f"{os.path.basename(str(result['run']).rstrip('/'))} (step {result['step']})"


def _plot_slow_band(results: Sequence[dict], path: Path) -> Path:
    figure, axes = _figure(4.0, 3.2, 3)
    for style, result in zip(("-", "--"), results):
        for axis, key, name in zip(axes, ("m_slow", "h_slow", "e_write_mean"),
                                   ("M_slow (slow modes)", "H_slow (layer-heads)",
                                    "E_write (mean over layer-heads)")):
            axis.plot(result["distances"], result[key], style, marker="o", label=_label(result))
            axis.set_xscale("log", base=2)
            axis.set_xlabel("distance ell (tokens)")
            axis.set_title(name)
    axes[0].legend(fontsize="x-small")
    figure.savefig(path, format="png", dpi=100)
    return path


def _plot_comparison(results: Sequence[dict], layer: str, path: Path) -> Path:
    distances = results[0]["distances"]
    figure, axes = _figure(4.0, 3.2, len(distances))
    for panel, (axis, distance) in enumerate(zip(axes, distances)):
        for style, result in zip(("-", "--"), results):
            gamma = np.maximum(np.asarray(result["layers"][layer]["gamma"])[panel], 1e-6)
            for head, rates in enumerate(gamma):
                axis.plot(rates, style, color=f"C{head % 10}", linewidth=1,
                          label=_label(result) if head == 0 else None)
        axis.axhline(1.0 / distance, color="black", linestyle=":", linewidth=1)
        axis.set_yscale("log")
        axis.set_xlabel("mode r (sorted)")
        axis.set_ylabel("decay rate gamma_r")
        axis.set_title(f"{layer}, ell = {distance}")
    axes[0].legend(fontsize="x-small")
    figure.savefig(path, format="png", dpi=100)
    return path
