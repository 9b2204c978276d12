"""Optimizer: global-norm clipping, then per-group optimizers chosen by parameter path.

    tx = chain(clip_by_global_norm(c), multi_transform({group: opt(lr_group(t))}, labels))
    lr(t)        warmup: lr * t / warmup;  then cosine from lr to min_lr_ratio * lr at `steps`
                 (schedule="cosine") or lr (schedule="constant")
    groups       gdn_jax.optimizer_labels (the one rule, stated there):
                 alpha     GDN alpha projection kernels (".../a_proj/kernel"): lr(t) * alpha_lr_scale
                 frozen    A_log, dt_bias when optim.freeze_gdn_decay (zero update)
                 no_decay  norm scales, biases, A_log, dt_bias, FPA rho, any 0-/1-D param: no decay
                 default   everything else: lr(t), weight decay
    opt          adamw | muon (optax.contrib; matrices orthogonalised, embeddings, output head,
                 conv taps and vectors by its internal AdamW) | sgd (plain, for tests and probes)

The alpha scale is a group learning rate, not a gradient multiplier, so it survives Adam's
normalisation (docs/gdn.md, "SpectralShift").
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from gdn_jax.spectral_shift import optimizer_labels
from train.core.config import OptimConfig

ADAM_ONLY_MODULES = ("embed", "lm_head")


def param_labels(params: Any, freeze_gdn_decay: bool = False) -> Any:
    """Tree of group names (default | no_decay | alpha | frozen) with the structure of `params`."""
    return optimizer_labels(params, freeze_gdn_decay)


def learning_rate_schedule(optim: OptimConfig, total_steps: int) -> optax.Schedule:
    if optim.schedule == "constant":
        if optim.warmup_steps == 0:
            return optax.constant_schedule(optim.lr)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, optim.lr, optim.warmup_steps),
             optax.constant_schedule(optim.lr)], [optim.warmup_steps])
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=optim.lr, warmup_steps=optim.warmup_steps,
        decay_steps=max(total_steps, optim.warmup_steps + 1), end_value=optim.lr * optim.min_lr_ratio)


def muon_dimension_numbers(params: Any) -> Any:
    """Which params Muon orthogonalises, and how; None leaves go to Muon's internal AdamW.

    Kernels x @ W: 2-D [in, out] -> (0, 1); 3-D head projections [D, H, d] -> (0, (1, 2));
    attention output kernels named "out" [H, d, D] -> ((0, 1), 2). Embeddings, output head,
    convolution taps and vectors are not matrices of a matmul over the model width: AdamW.
    """
    def rule(path, x):
        keys = jax.tree_util.keystr(path, simple=True, separator="/").split("/")
        if keys[-1] != "kernel" or x.ndim < 2 or any(
                k in ADAM_ONLY_MODULES or k.endswith("conv") for k in keys):
            return None
        if x.ndim == 2:
            return MuonDimensionNumbers(0, 1)
        if x.ndim == 3 and keys[-2] == "out":
            return MuonDimensionNumbers((0, 1), 2)
        if x.ndim == 3:
            return MuonDimensionNumbers(0, (1, 2))
        return None

    return jax.tree_util.tree_map_with_path(rule, params)


def _group_optimizer(optim: OptimConfig, learning_rate: optax.Schedule, weight_decay: float):
    if optim.name == "adamw":
        return optax.adamw(learning_rate, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                           weight_decay=weight_decay)
    if optim.name == "muon":
        return optax.contrib.muon(
            learning_rate, beta=optim.momentum, eps=optim.eps, weight_decay=weight_decay,
            adam_b1=optim.b1, adam_b2=optim.b2, adam_weight_decay=weight_decay,
            muon_weight_dimension_numbers=muon_dimension_numbers)
    if optim.name == "sgd":
        return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate))
    raise ValueError(f"optim.name: unknown optimizer {optim.name!r}")


def build_optimizer(optim: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(optim, total_steps)
    alpha_scale = optim.alpha_lr_scale

    def alpha_schedule(step):
        return schedule(step) * alpha_scale

    groups = {
        "default": _group_optimizer(optim, schedule, optim.weight_decay),
        "no_decay": _group_optimizer(optim, schedule, 0.0),
        "alpha": _group_optimizer(optim, alpha_schedule, optim.weight_decay),
        "frozen": optax.set_to_zero(),
    }
    grouped = optax.multi_transform(
        groups, lambda params: param_labels(params, optim.freeze_gdn_decay))
    if optim.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(optim.clip_norm), grouped)
    return grouped
