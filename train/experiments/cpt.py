"""SpectralShift continued pretraining from a reference run (docs/gdn.md, "SpectralShift").

    reference     cpt.reference (a run directory) at step cpt.reference_step, default its
                  final step (its train.steps); no such run or checkpoint -> refused (missing);
                  a run whose final checkpoint does not exist (unfinished) -> refused
                  (ambiguous: which of its checkpoints is meant?)
    s = (l_ref / l_tar) ** k              l_ref: cpt.l_ref or the reference run's seq_len,
                                          l_tar: cpt.l_tar or this run's seq_len
    fresh run     params = spectral_shift(reference params, s)   (if cpt.reparameterize)
                  alpha projection learning rate x s             (if cpt.scale_lr)
    attention     cpt.positions (r = l_tar / l_ref), from the reference run's attention section:
                  keep   this config's own attention section, unchanged
                  abf    rope_base = cpt.rope_base or reference base * r ** (D / (D - 2))
                  yarn   yarn_factor = r x the reference's factor (1 if none), original length
                         = the reference's (or l_ref); softmax RoPE only
                  drope  position = "nope" (the rotation is dropped; same parameters)
                  the run's config.json keeps the result, so eval and later stages see it
    checkpoints   record["extra"]["spectral_shift_applied"] = the reference's markers + this
                  stage's marker {reference, reference_step, l_ref, l_tar, k, mode, s,
                  reparameterize, scale_lr, positions}
    resumed run   its checkpoint's last marker must be this stage's (then it does not shift
                  again); a run directory without it is refused
    stderr        a fresh run says in one line what it did: s, l_ref -> l_tar, k, mode, the
                  reference and its step, the alpha learning rate (spectral_shift_line)

A staged extension (train/experiments/stages.py) is a chain of such runs, each naming the
previous one as its reference. Everything else is `fit` (train/core/fit.py), adapted through
its hooks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from fpa_jax.baselines.rope_scaling import abf_base
from gdn_jax.spectral_shift import spectral_shift, spectralshift_scale
from train.checkpoint.manager import RestoredCheckpoint
from train.core.config import Config, ConfigError
from train.core.fit import FitHooks, FitResult, RunSetupError, fit
from train.core.metrics import progress_line
from train.core.mixers import MIXERS
from train.core.presets import config_from_dict
from train.core.runs import checkpoint_steps, load_run, restore_run_state
from train.core.session import Session, build_session
from train.data.tokenizer import Tokenizer, load_tokenizer

MARKERS_KEY = "spectral_shift_applied"
STAGE_KEYS = ("l_ref", "l_tar", "k", "mode", "reparameterize", "scale_lr", "positions")
POSITION_FIELDS = ("position", "rope_base", "yarn_factor", "yarn_original_length")


def applied_markers(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The SpectralShift markers of a checkpoint record (older trainers kept them at the top
    level of the record rather than in its "extra")."""
    extra = record.get("extra") or {}
    return list(extra.get(MARKERS_KEY, record.get(MARKERS_KEY, [])))


def load_reference(reference: str | Path) -> tuple[Config, Tokenizer]:
    """The reference run's config and tokenizer; RunSetupError when it is not a run."""
    if not (Path(reference) / "config.json").is_file():
        raise RunSetupError(f"cpt.reference: {reference} is not a run directory (no "
                            f"config.json); train the reference run first")
    return load_run(reference)


def reference_checkpoint_step(reference: str | Path, reference_config: Config, step: int = 0) -> int:
    """The checkpoint a stage extends: `step`, or (0) the run's final step (its train.steps).
    RunSetupError when that checkpoint is missing, or the run is unfinished (ambiguous)."""
    steps = checkpoint_steps(reference)
    if not steps:
        raise RunSetupError(f"cpt.reference: {reference} has no checkpoint; train it first")
    wanted = step or reference_config.train.steps
    if wanted in steps:
        return wanted
    if step:
        raise RunSetupError(f"cpt.reference_step={step}: {reference} has no checkpoint at that "
                            f"step (steps: {steps})")
    raise RunSetupError(
        f"cpt.reference: ambiguous: {reference} is unfinished (newest checkpoint step "
        f"{steps[-1]} of train.steps={reference_config.train.steps}), so it has no final "
        f"checkpoint; finish it (re-run its command) or name one with cpt.reference_step")


def extended_attention(config: Config, reference_config: Config, ratio: float) -> Config:
    """`config` with its attention position fields set for cpt.positions (module doc)."""
    c, ref = config.cpt, reference_config.attention
    method = c.positions
    if c.rope_base and method != "abf":
        raise ConfigError(f"cpt.rope_base applies to cpt.positions=abf only, got "
                          f"positions={method!r}")
    if method == "keep":
        return config
    if "attention" not in config.layer_sections():
        raise ConfigError(f"cpt.positions={method}: the model has no attention layers "
                          f"(model.pattern={config.model.pattern!r}); use keep")
    allowed = ("rope", "nope") if method == "drope" else ("rope",)
    # the kinds that can rotate by RoPE (and, for yarn, read attention.yarn_factor)
    rope_kinds = tuple(kind for kind, spec in MIXERS.items() if "rope" in spec.positions
                       and (method != "yarn" or "yarn_factor" in spec.options))
    if ref.kind not in rope_kinds or ref.position not in allowed:
        raise ConfigError(
            f"cpt.positions={method}: needs the reference run's attention to use RoPE "
            f"({' or '.join(rope_kinds)} with position=rope), "
            f"got kind={ref.kind!r}, position={ref.position!r}")
    fields = {name: getattr(ref, name) for name in POSITION_FIELDS}
    if method == "abf":
        fields["rope_base"] = c.rope_base or abf_base(ref.rope_base, ratio, ref.head_dim)
        if fields["rope_base"] <= ref.rope_base:
            raise ConfigError(f"cpt.rope_base={c.rope_base} must exceed the reference's "
                              f"attention.rope_base={ref.rope_base}")
    elif method == "yarn":
        fields["yarn_factor"] = (ref.yarn_factor or 1.0) * ratio
        fields["yarn_original_length"] = (ref.yarn_original_length
                                          or reference_config.data.seq_len)
    else:
        fields.update(position="nope", yarn_factor=0.0, yarn_original_length=0)
    raw = config.to_dict()
    raw["attention"].update(fields)
    return config_from_dict(raw)


def checked_reference(config: Config,
                      run_dir: str | Path) -> tuple[Config, Tokenizer, int | None, Tokenizer]:
    """cpt.reference checked (ConfigError / RunSetupError) without loading any parameters, so
    `python -m train cpt` refuses a missing or unusable reference before it prints anything:
    (reference config, reference tokenizer, reference step or None for a resumed run, this
    run's tokenizer)."""
    c = config.cpt
    if not c.reference:
        raise ConfigError("cpt.reference: set it to the reference run directory")
    if config.optim.alpha_lr_scale != 1.0:
        raise ConfigError("optim.alpha_lr_scale: cpt sets it to s; leave it at 1.0 "
                          "(use cpt.scale_lr=false to keep the alpha learning rate unscaled)")
    if Path(c.reference).resolve() == Path(run_dir).resolve():
        raise RunSetupError(f"cpt.reference: {c.reference} is this run's own directory")
    reference_config, reference_tokenizer = load_reference(c.reference)
    reference_step = None   # a resumed run does not read the reference's checkpoints
    if not checkpoint_steps(run_dir):
        reference_step = reference_checkpoint_step(c.reference, reference_config, c.reference_step)
    tokenizer = load_tokenizer(config.data.tokenizer)
    if reference_tokenizer.fingerprint != tokenizer.fingerprint:
        raise RunSetupError(f"data.tokenizer: differs from the reference run's tokenizer "
                            f"({tokenizer!r} vs {reference_tokenizer!r})")
    return reference_config, reference_tokenizer, reference_step, tokenizer


def continued_pretraining(config: Config, run_dir: str | Path) -> FitResult:
    """Continue training `cpt.reference` with SpectralShift applied once (see module doc)."""
    c = config.cpt
    reference_config, _, reference_step, tokenizer = checked_reference(config, run_dir)
    l_ref = c.l_ref or reference_config.data.seq_len
    l_tar = c.l_tar or config.data.seq_len
    try:
        s = spectralshift_scale(l_ref, l_tar, c.k)
    except ValueError as error:
        raise ConfigError(f"cpt: {error} (cpt.l_ref / cpt.l_tar, or the two runs' "
                          f"data.seq_len)") from None
    config = extended_attention(config, reference_config, l_tar / l_ref)
    if c.scale_lr:
        config = dataclasses.replace(
            config, optim=dataclasses.replace(config.optim, alpha_lr_scale=s))
    marker = {"reference": str(Path(c.reference).resolve()), "l_ref": l_ref, "l_tar": l_tar,
              "k": c.k, "mode": c.mode, "s": s, "reparameterize": c.reparameterize,
              "scale_lr": c.scale_lr, "positions": c.positions}

    def initial(session: Session) -> tuple[Any, dict[str, Any]]:
        reference_session = build_session(reference_config, tokenizer.vocab_size, session.mesh)
        step = reference_step or reference_checkpoint_step(c.reference, reference_config,
                                                           c.reference_step)
        restored = restore_run_state(c.reference, reference_session, step=step)
        marker["reference_step"] = restored.step
        params = restored.state["params"]
        _check_same_parameters(params, session.abstract_state["params"], c.reference)
        if c.reparameterize:
            params = spectral_shift(params, s=s, mode=c.mode)
        progress_line(spectral_shift_line(marker))
        return params, {MARKERS_KEY: applied_markers(restored.record) + [marker]}

    def resume(restored: RestoredCheckpoint) -> dict[str, Any]:
        markers = applied_markers(restored.record)
        if not markers or not _same_stage(markers[-1], marker):
            raise RunSetupError(
                f"{run_dir}: its checkpoint (step {restored.step}) has no record of the "
                f"SpectralShift this run applies ({marker}); use a fresh run directory")
        return {**(restored.record.get("extra") or {}), MARKERS_KEY: markers}

    return fit(config, run_dir, hooks=FitHooks(initial=initial, resume=resume))


def spectral_shift_line(marker: dict[str, Any]) -> str:
    """One line on what a stage's marker records: s from l_ref -> l_tar, the reparameterisation
    (or that it is off), the reference checkpoint and the alpha learning rate."""
    l_ref, l_tar, s = marker["l_ref"], marker["l_tar"], marker["s"]
    what = (f"W_alpha <- mu + s (W_alpha - mu) ({marker['mode']} mode)"
            if marker["reparameterize"] else "weights unchanged (cpt.reparameterize=false)")
    lr = (f"alpha learning rate x {s:.4g}" if marker["scale_lr"]
          else "alpha learning rate unscaled (cpt.scale_lr=false)")
    return (f"SpectralShift: l_ref {l_ref} -> l_tar {l_tar}, s = ({l_ref} / {l_tar}) ** "
            f"{marker['k']:g} = {s:.4g}; {what} on {marker['reference']} step "
            f"{marker['reference_step']}; {lr}")


def _same_stage(a: dict[str, Any], b: dict[str, Any]) -> bool:
    defaults = {"positions": "keep"}    # markers written before cpt.positions existed
    return all(a.get(k, defaults.get(k)) == b.get(k, defaults.get(k)) for k in STAGE_KEYS)


def _check_same_parameters(params: Any, expected: Any, reference: str) -> None:
    """The reference run's params must fit this run's model (same paths and shapes)."""
    got = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}
    want = {jax.tree_util.keystr(p): x.shape
            for p, x in jax.tree_util.tree_leaves_with_path(expected)}
    if got != want:
        difference = sorted(set(got.items()) ^ set(want.items()))[:4]
        raise ValueError(f"cpt.reference: the parameters of {reference} do not fit this model "
                         f"(model/attention/gdn sections differ); first differences: {difference}")
