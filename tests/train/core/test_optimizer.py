"""Optimizer groups, learning-rate schedules, clipping outside the groups, Muon."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from train.core.config import OptimConfig
from train.core.model import build_model
from train.core.optimizer import build_optimizer, learning_rate_schedule, param_labels
from train.core.presets import load_config


@functools.cache
def hybrid_shapes():
    config = load_config(None, ["model.d_model=32", "model.pattern=GA", "attention.num_heads=2",
                                "attention.head_dim=16", "gdn.num_heads=2", "gdn.head_dim=16"])
    model = build_model(config, 257)
    tokens = jnp.zeros((1, 8), jnp.int32)
    return nn.meta.unbox(jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), tokens, jnp.ones_like(tokens)))["params"])


def hybrid_params(seed):
    """Random params with the real tree of a GDN + FPA model (no compile: eval_shape + random)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), hybrid_shapes())


def first_update(tx, grads, params):
    return jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)


def flat_labels(params, freeze=False):
    labels = param_labels(params, freeze)
    return {jax.tree_util.keystr(path): label
            for path, label in jax.tree_util.tree_leaves_with_path(labels)}


def test_labels_from_parameter_paths():
    labels = flat_labels(hybrid_params(0))
    gdn, fpa = "['layers_0']['mixer']", "['layers_1']['mixer']"
    assert labels[f"{gdn}['a_proj']['kernel']"] == "alpha"
    assert [k for k, v in labels.items() if v == "alpha"] == [f"{gdn}['a_proj']['kernel']"]
    for name in ("['A_log']", "['dt_bias']", "['o_norm']['scale']"):
        assert labels[gdn + name] == "no_decay"
    for name in ("['rho']", "['delta_proj']['bias']", "['field_proj']['bias']"):
        assert labels[fpa + name] == "no_decay"
    assert labels["['final_norm']['scale']"] == "no_decay"
    assert labels["['layers_0']['mlp_norm']['scale']"] == "no_decay"
    for name in ("['embed']['embedding']", f"{gdn}['b_proj']['kernel']",
                 f"{gdn}['q_proj']['kernel']", f"{fpa}['query']['kernel']",
                 f"{fpa}['delta_proj']['kernel']", "['layers_1']['mlp']['down']['kernel']"):
        assert labels[name] == "default"
    frozen = flat_labels(hybrid_params(0), freeze=True)
    assert {k for k, v in frozen.items() if v == "frozen"} == {gdn + "['A_log']", gdn + "['dt_bias']"}


@pytest.mark.parametrize("scale", [0.25, 0.3])
def test_alpha_scale_is_a_group_learning_rate_under_sgd(scale):
    params, grads = hybrid_params(1), hybrid_params(2)
    base = OptimConfig(name="sgd", lr=0.1, schedule="constant", warmup_steps=0, weight_decay=0.0,
                       clip_norm=0.0)

    def updates(alpha_lr_scale):
        tx = build_optimizer(OptimConfig(**{**base.__dict__, "alpha_lr_scale": alpha_lr_scale}), 10)
        return first_update(tx, grads, params)

    unscaled, scaled = updates(1.0), updates(scale)
    labels = param_labels(params)
    checked = 0
    for label, u, s in zip(jax.tree.leaves(labels), jax.tree.leaves(unscaled), jax.tree.leaves(scaled)):
        if label == "alpha":
            np.testing.assert_allclose(s, scale * u, rtol=1e-6, atol=0)
            if scale == 0.25:  # a power of two: exact
                np.testing.assert_array_equal(s, scale * u)
            assert float(jnp.max(jnp.abs(u))) > 0
            checked += 1
        else:
            np.testing.assert_array_equal(s, u)
    assert checked == 1


def test_frozen_decay_params_and_no_decay_group_under_adamw():
    params = hybrid_params(3)
    zero_grads = jax.tree.map(lambda p: np.zeros(p.shape, p.dtype), params)   # no compilation
    optim = OptimConfig(name="adamw", lr=0.01, schedule="constant", warmup_steps=0,
                        weight_decay=0.5, alpha_lr_scale=0.5, freeze_gdn_decay=True)
    tx = build_optimizer(optim, 10)
    updates = first_update(tx, hybrid_params(4), params)
    decay_only = first_update(tx, zero_grads, params)
    for label, p, u, d in zip(jax.tree.leaves(param_labels(params, True)), jax.tree.leaves(params),
                              jax.tree.leaves(updates), jax.tree.leaves(decay_only)):
        if label == "frozen":
            np.testing.assert_array_equal(u, 0.0)
        elif label == "no_decay":
            np.testing.assert_array_equal(d, 0.0)
            assert float(np.max(np.abs(u))) > 0
        elif label == "default":
            np.testing.assert_allclose(d, -0.01 * 0.5 * p, rtol=1e-5)
        else:  # alpha: decayed with the scaled learning rate
            np.testing.assert_allclose(d, -0.005 * 0.5 * p, rtol=1e-5)


def test_clipping_is_global_across_groups():
    params = hybrid_params(5)
    grads = jax.tree.map(lambda g: jnp.asarray(100.0 * np.asarray(g)), hybrid_params(6))
    optim = OptimConfig(name="sgd", lr=1.0, schedule="constant", warmup_steps=0,
                        weight_decay=0.0, clip_norm=0.5)
    tx = build_optimizer(optim, 10)
    updates = first_update(tx, grads, params)

    @jax.jit   # one program (op by op, each leaf's small ops compiled on their own)
    def norms_and_ratios(updates, grads):
        ratio = jax.tree.map(lambda u, g: -u / g, updates, grads)
        return (optax.tree.norm(updates), optax.tree.norm(grads),
                jnp.concatenate([r.ravel() for r in jax.tree.leaves(ratio)]))

    updates_norm, grads_norm, ratios = norms_and_ratios(updates, grads)
    np.testing.assert_allclose(updates_norm, 0.5, rtol=1e-5)
    # every group is scaled by the same factor (clip before the groups)
    np.testing.assert_allclose(ratios, 0.5 / grads_norm, rtol=1e-4)


def test_schedules():
    cosine = learning_rate_schedule(
        OptimConfig(lr=1.0, schedule="cosine", warmup_steps=10, min_lr_ratio=0.1), 110)
    np.testing.assert_allclose([cosine(0), cosine(5), cosine(10), cosine(60), cosine(110)],
                               [0.0, 0.5, 1.0, 0.55, 0.1], atol=1e-6)
    constant = learning_rate_schedule(OptimConfig(lr=2.0, schedule="constant", warmup_steps=4), 100)
    np.testing.assert_allclose([constant(0), constant(2), constant(4), constant(99)],
                               [0.0, 1.0, 2.0, 2.0], atol=1e-6)
    no_warmup = learning_rate_schedule(OptimConfig(lr=3.0, schedule="constant", warmup_steps=0), 9)
    assert float(no_warmup(0)) == 3.0


@pytest.mark.slow
def test_muon_orthogonalises_matrices_and_adams_the_rest():
    params, grads = hybrid_params(7), hybrid_params(8)
    optim = OptimConfig(name="muon", lr=0.02, schedule="constant", warmup_steps=0,
                        weight_decay=0.0, clip_norm=0.0, alpha_lr_scale=0.5)
    tx = build_optimizer(optim, 10)
    # on the host from here (op by op, each leaf's small ops compiled on their own)
    updates = jax.tree.map(np.asarray, first_update(tx, grads, params))
    params, grads = jax.tree.map(np.asarray, params), jax.tree.map(np.asarray, grads)
    assert all(bool(np.all(np.isfinite(u))) for u in jax.tree.leaves(updates))
    mlp = updates["layers_1"]["mlp"]["gate"]["kernel"]            # [32, 96] -> orthogonalised
    singular = np.asarray(jnp.linalg.svd(mlp, compute_uv=False))
    assert float(singular.max() / singular.min()) < 2.0           # Newton-Schulz flattens the spectrum
    # 3-D head kernels are orthogonalised as matrices: query [32, 2, 16] as [32, 32] (model
    # width is the reduction axis), out [2, 16, 32] as [32, 32] (heads x head_dim reduce)
    mixer_params, mixer_grads = params["layers_1"]["mixer"], grads["layers_1"]["mixer"]
    plain_muon = optax.contrib.muon(0.02, beta=optim.momentum, eps=optim.eps)
    for name in ("query", "out"):
        matrix = {"w": mixer_params[name]["kernel"].reshape(32, 32)}
        expected = first_update(plain_muon, {"w": mixer_grads[name]["kernel"].reshape(32, 32)},
                                matrix)["w"]
        got = updates["layers_1"]["mixer"][name]["kernel"].reshape(32, 32)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)
    # the embedding goes through Muon's (Nesterov) AdamW: the first update is c * lr * sign(g)
    embedding_update = np.abs(updates["embed"]["embedding"])
    np.testing.assert_allclose(embedding_update, embedding_update[0, 0], rtol=1e-3)
    assert 0.02 <= float(embedding_update[0, 0]) <= 0.04
    # the alpha group is the same transform at half the learning rate
    a_update = updates["layers_0"]["mixer"]["a_proj"]["kernel"]
    unscaled = build_optimizer(OptimConfig(**{**optim.__dict__, "alpha_lr_scale": 1.0}), 10)
    a_unscaled = first_update(unscaled, grads, params)["layers_0"]["mixer"]["a_proj"]["kernel"]
    np.testing.assert_allclose(a_update, 0.5 * np.asarray(a_unscaled), rtol=1e-5, atol=1e-8)


def test_groups_follow_the_one_rule_of_gdn_jax():
    """train's groups are gdn_jax.optimizer_labels (one rule for both), on a real model tree."""
    from gdn_jax import optimizer_labels

    params = hybrid_params(7)
    for freeze in (False, True):
        assert jax.tree.leaves(param_labels(params, freeze)) == jax.tree.leaves(
            optimizer_labels(params, freeze))
    tx = build_optimizer(OptimConfig(freeze_gdn_decay=True), 10)
    labels = tx.init(params)[1].inner_states   # clip, then multi_transform's per-group states
    assert set(labels) == {"default", "no_decay", "alpha", "frozen"}
