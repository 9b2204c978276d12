"""SpectralShift continued pretraining from a reference run (docs/gdn.md, "SpectralShift").

    s = (l_ref / l_tar) ** k              l_ref: cpt.l_ref or the reference run's seq_len,
                                          l_tar: cpt.l_tar or this run's seq_len
    fresh run     params = spectral_shift(reference params, s)   (if cpt.reparameterize)
                  alpha projection learning rate x s             (if cpt.scale_lr)
    checkpoints   record["extra"]["spectral_shift_applied"] = the reference's markers + this
                  stage's marker {reference, reference_step, l_ref, l_tar, k, mode, s,
                  reparameterize, scale_lr}
    resumed run   must find this stage's marker in its checkpoint (then it does not shift
                  again); a run directory without it is refused

Everything else is `fit` (train/fit.py), adapted through its hooks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from gdn_jax.spectral_shift import spectral_shift, spectralshift_scale
from train.checkpoint import RestoredCheckpoint
from train.config import Config
from train.fit import FitHooks, FitResult, fit
from train.runs import load_run, restore_run_state
from train.session import Session, build_session
from train.tokenizer import load_tokenizer

MARKERS_KEY = "spectral_shift_applied"
STAGE_KEYS = ("l_ref", "l_tar", "k", "mode", "reparameterize", "scale_lr")


def applied_markers(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The SpectralShift markers of a checkpoint record (older trainers kept them at the top
    level of the record rather than in its "extra")."""
    extra = record.get("extra") or {}
    return list(extra.get(MARKERS_KEY, record.get(MARKERS_KEY, [])))


def continued_pretraining(config: Config, run_dir: str | Path) -> FitResult:
    """Continue training `cpt.reference` with SpectralShift applied once (see module doc)."""
    c = config.cpt
    if not c.reference:
        raise ValueError("cpt.reference: set it to the reference run directory")
    if config.optim.alpha_lr_scale != 1.0:
        raise ValueError("optim.alpha_lr_scale: cpt sets it to s; leave it at 1.0 "
                         "(use cpt.scale_lr=false to keep the alpha learning rate unscaled)")
    reference_config, reference_tokenizer = load_run(c.reference)
    tokenizer = load_tokenizer(config.data.tokenizer)
    if reference_tokenizer.fingerprint != tokenizer.fingerprint:
        raise ValueError(f"data.tokenizer: differs from the reference run's tokenizer "
                         f"({tokenizer!r} vs {reference_tokenizer!r})")
    l_ref = c.l_ref or reference_config.data.seq_len
    l_tar = c.l_tar or config.data.seq_len
    s = spectralshift_scale(l_ref, l_tar, c.k)
    if c.scale_lr:
        config = dataclasses.replace(
            config, optim=dataclasses.replace(config.optim, alpha_lr_scale=s))
    marker = {"reference": str(Path(c.reference).resolve()), "l_ref": l_ref, "l_tar": l_tar,
              "k": c.k, "mode": c.mode, "s": s, "reparameterize": c.reparameterize,
              "scale_lr": c.scale_lr}

    def initial(session: Session) -> tuple[Any, dict[str, Any]]:
        reference_session = build_session(reference_config, tokenizer.vocab_size, session.mesh)
        restored = restore_run_state(c.reference, reference_session)
        marker["reference_step"] = restored.step
        params = restored.state["params"]
        _check_same_parameters(params, session.abstract_state["params"], c.reference)
        if c.reparameterize:
            params = spectral_shift(params, s=s, mode=c.mode)
        return params, {MARKERS_KEY: applied_markers(restored.record) + [marker]}

    def resume(restored: RestoredCheckpoint) -> dict[str, Any]:
        markers = applied_markers(restored.record)
        if not any(_same_stage(m, marker) for m in markers):
            raise ValueError(
                f"{run_dir}: its checkpoint (step {restored.step}) has no record of the "
                f"SpectralShift this run applies ({marker}); use a fresh run directory")
        return {**(restored.record.get("extra") or {}), MARKERS_KEY: markers}

    return fit(config, run_dir, hooks=FitHooks(initial=initial, resume=resume))


def _same_stage(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in STAGE_KEYS)


def _check_same_parameters(params: Any, expected: Any, reference: str) -> None:
    """The reference run's params must fit this run's model (same paths and shapes)."""
    got = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}
    want = {jax.tree_util.keystr(p): x.shape
            for p, x in jax.tree_util.tree_leaves_with_path(expected)}
    if got != want:
        difference = sorted(set(got.items()) ^ set(want.items()))[:4]
        raise ValueError(f"cpt.reference: the parameters of {reference} do not fit this model "
                         f"(model/attention/gdn sections differ); first differences: {difference}")
