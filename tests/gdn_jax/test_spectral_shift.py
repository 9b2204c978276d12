"""SpectralShift transform, its scale, and optimizer group labels."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import FrozenDict

from gdn_jax import GatedDeltaNet, optimizer_labels, spectral_shift, spectralshift_scale

MODULE = GatedDeltaNet(num_heads=2, head_dim=4, num_v_heads=4, v_head_dim=3)


def _gdn_variables(seed, param_dtype=jnp.float32):
    """Boxed GatedDeltaNet variables filled with noise, built without compiling init."""
    module = MODULE.clone(param_dtype=param_dtype)
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((1, 3, 6)))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape) + 0.3, s.dtype), shapes)


def _model_tree(seed):
    """Two GDN layers (one with an a_proj bias), an attention layer with norms, embeddings."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape) + 0.5, jnp.float32)  # noqa: E731
    return {
        "embed": {"embedding": normal(11, 6)},
        "layer_0": {"mixer": {"a_proj": {"kernel": normal(6, 4), "bias": normal(4)},
                              "b_proj": {"kernel": normal(6, 4)}, "A_log": normal(4), "dt_bias": normal(4),
                              "q_conv": {"kernel": normal(4, 8)}, "o_norm": {"scale": normal(3)}},
                    "pre_norm": {"scale": normal(6)}},
        "layer_1": {"mixer": {"a_proj": {"kernel": normal(6, 4)}, "rho": normal(2),
                              "q_proj": {"kernel": normal(6, 8), "bias": normal(8)}},
                    "pre_norm": {"weight": normal(6)},
                    "mlp": {"fc": {"kernel": normal(6, 12)}}},
    }


def _numpy_shift(weight, s, mode):
    w = np.asarray(weight, np.float64)
    mean = w.mean(axis=(-2, -1), keepdims=True) if mode == "matrix" else w.mean(axis=-2, keepdims=True)
    return mean + s * (w - mean)


def _paths(tree):
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_spectralshift_scale():
    assert spectralshift_scale(8192, 32768) == pytest.approx(0.5)
    assert spectralshift_scale(8192, 32768, k=1.0) == pytest.approx(0.25)
    assert spectralshift_scale(4096, 131072, k=0.5) == pytest.approx(np.sqrt(1 / 32))
    assert spectralshift_scale(1000, 3000, k=0.0) == 1.0
    assert spectralshift_scale(2048, 2048) == 1.0
    assert spectralshift_scale(np.int64(1024), np.float32(4096.0)) == pytest.approx(0.5)
    for bad in [dict(l_ref=0, l_tar=10), dict(l_ref=-4, l_tar=10), dict(l_ref=4, l_tar=float("nan")),
                dict(l_ref=True, l_tar=10), dict(l_ref=4, l_tar=10, k=-0.5), dict(l_ref="4", l_tar=10)]:
        with pytest.raises(ValueError):
            spectralshift_scale(**bad)
    with pytest.raises(ValueError, match="swapped"):
        spectralshift_scale(32768, 8192)


@pytest.mark.parametrize("mode", ["matrix", "row"])
@pytest.mark.parametrize("s", [0.5, 0.25, 1.7])
def test_shift_matches_formula_and_touches_only_alpha_kernels(mode, s):
    params = _model_tree(seed=int(10 * s) + len(mode))
    shifted = spectral_shift(params, s=s, mode=mode)
    before, after = _paths(params), _paths(shifted)
    assert before.keys() == after.keys()
    alpha_paths = [p for p in before if p.endswith("['a_proj']['kernel']")]
    assert len(alpha_paths) == 2
    for path in before:
        if path in alpha_paths:
            np.testing.assert_allclose(after[path], _numpy_shift(before[path], s, mode), rtol=1e-6, atol=1e-6)
            assert after[path].dtype == before[path].dtype
        else:
            assert after[path] is before[path], path  # untouched leaves are the same objects
    # the defining properties: the mean is kept and the centred deviation scales by s
    w, w_new = (np.asarray(t[alpha_paths[0]], np.float64) for t in (before, after))
    axes = (0, 1) if mode == "matrix" else (0,)
    np.testing.assert_allclose(w_new.mean(axis=axes), w.mean(axis=axes), atol=1e-6)
    np.testing.assert_allclose(w_new - w_new.mean(axis=axes, keepdims=True),
                               s * (w - w.mean(axis=axes, keepdims=True)), atol=1e-5)


def test_row_mode_is_one_mean_per_alpha_output_unit():
    """For a Dense kernel [D_in, HV] each column (one alpha output) keeps its own mean."""
    kernel = jnp.asarray([[1.0, 10.0], [3.0, 30.0]])
    shifted = spectral_shift({"a_proj": {"kernel": kernel}}, s=0.5, mode="row")["a_proj"]["kernel"]
    np.testing.assert_allclose(shifted, [[1.5, 15.0], [2.5, 25.0]])
    shifted = spectral_shift({"a_proj": {"kernel": kernel}}, s=0.5, mode="matrix")["a_proj"]["kernel"]
    np.testing.assert_allclose(shifted, [[6.0, 10.5], [7.0, 20.5]])  # mean 11


def test_stacked_layers_are_shifted_independently():
    rng = np.random.default_rng(3)
    stacked = jnp.asarray(rng.standard_normal((3, 5, 4)) + np.arange(3)[:, None, None], jnp.float32)
    for mode in ("matrix", "row"):
        shifted = spectral_shift({"layers": {"a_proj": {"kernel": stacked}}}, s=0.3, mode=mode)
        for layer in range(3):
            np.testing.assert_allclose(shifted["layers"]["a_proj"]["kernel"][layer],
                                       _numpy_shift(stacked[layer], 0.3, mode), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("boxed", [True, False])
def test_real_layer_params_boxed_unboxed_and_frozen(boxed):
    variables = _gdn_variables(seed=4)
    if not boxed:
        variables = nn.meta.unbox(variables)
    for tree in (variables, FrozenDict(variables)):
        shifted = spectral_shift(tree, s=0.5)
        assert type(shifted) is type(tree)
        assert jax.tree_util.tree_structure(shifted, is_leaf=lambda n: isinstance(n, nn.Partitioned)) == \
            jax.tree_util.tree_structure(tree, is_leaf=lambda n: isinstance(n, nn.Partitioned))
        alpha_before = tree["params"]["a_proj"]["kernel"]
        alpha_after = shifted["params"]["a_proj"]["kernel"]
        if boxed:
            assert isinstance(alpha_after, nn.Partitioned) and alpha_after.names == alpha_before.names
            alpha_before, alpha_after = alpha_before.value, alpha_after.value
        np.testing.assert_allclose(alpha_after, _numpy_shift(alpha_before, 0.5, "matrix"), rtol=1e-6, atol=1e-6)
        changed = [path for path, (a, b) in
                   zip(_paths(tree), zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shifted)))
                   if not np.array_equal(a, b)]
        assert changed == ["['params']['a_proj']['kernel']" + (".value" if boxed else "")]


def test_identity_at_one():
    params = _model_tree(seed=5)
    for mode, one in (("matrix", 1.0), ("row", np.float32(1.0))):
        for before, after in zip(jax.tree_util.tree_leaves(params),
                                 jax.tree_util.tree_leaves(spectral_shift(params, s=one, mode=mode))):
            np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


def test_bfloat16_params_keep_their_dtype():
    variables = nn.meta.unbox(_gdn_variables(seed=6, param_dtype=jnp.bfloat16))
    shifted = spectral_shift(variables, s=0.25, mode="row")
    kernel, new_kernel = variables["params"]["a_proj"]["kernel"], shifted["params"]["a_proj"]["kernel"]
    assert new_kernel.dtype == jnp.bfloat16
    expected = _numpy_shift(np.asarray(kernel, np.float32), 0.25, "row").astype(np.float32)
    np.testing.assert_array_equal(np.asarray(new_kernel), np.asarray(jnp.asarray(expected).astype(jnp.bfloat16)))
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree_util.tree_leaves(shifted))


def test_errors():
    params = _model_tree(seed=7)
    with pytest.raises(ValueError, match="no alpha projection"):
        spectral_shift({"mixer": {"b_proj": {"kernel": jnp.ones((3, 2))}}}, s=0.5)
    for bad in (0.0, -0.5, float("inf"), float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="s must be a finite number > 0"):
            spectral_shift(params, s=bad)
    with pytest.raises(ValueError, match="mode"):
        spectral_shift(params, s=0.5, mode="column")
    with pytest.raises(ValueError, match="rank"):
        spectral_shift({"a_proj": {"kernel": jnp.ones(3)}}, s=0.5)
    with pytest.raises(TypeError, match="floating"):
        spectral_shift({"a_proj": {"kernel": jnp.ones((3, 2), jnp.int32)}}, s=0.5)


def test_optimizer_labels():
    labels = _paths(optimizer_labels(_model_tree(seed=8)))
    expected = {
        "['embed']['embedding']": "default",
        "['layer_0']['mixer']['a_proj']['kernel']": "alpha",
        "['layer_0']['mixer']['a_proj']['bias']": "no_decay",
        "['layer_0']['mixer']['b_proj']['kernel']": "default",
        "['layer_0']['mixer']['A_log']": "no_decay",
        "['layer_0']['mixer']['dt_bias']": "no_decay",
        "['layer_0']['mixer']['q_conv']['kernel']": "default",
        "['layer_0']['mixer']['o_norm']['scale']": "no_decay",
        "['layer_0']['pre_norm']['scale']": "no_decay",
        "['layer_1']['mixer']['a_proj']['kernel']": "alpha",
        "['layer_1']['mixer']['rho']": "no_decay",
        "['layer_1']['mixer']['q_proj']['kernel']": "default",
        "['layer_1']['mixer']['q_proj']['bias']": "no_decay",
        "['layer_1']['pre_norm']['weight']": "no_decay",
        "['layer_1']['mlp']['fc']['kernel']": "default",
    }
    assert labels == expected


@pytest.mark.parametrize("boxed", [False, True])
def test_multi_transform_scales_only_the_alpha_update(boxed):
    variables = _gdn_variables(seed=9)
    params = variables["params"] if boxed else nn.meta.unbox(variables)["params"]
    grads = jax.tree_util.tree_map(lambda p: -0.7 * p + 0.1, params)
    labels = optimizer_labels(params)
    label_leaves = jax.tree_util.tree_leaves(labels)
    assert label_leaves.count("alpha") == 1 and label_leaves.count("no_decay") == 3
    s, lr = 0.5, 0.1
    scaled = optax.multi_transform({"alpha": optax.sgd(s * lr), "no_decay": optax.sgd(lr), "default": optax.sgd(lr)},
                                   labels)
    plain = optax.sgd(lr)
    scaled_updates, _ = scaled.update(grads, scaled.init(params), params)
    plain_updates, _ = plain.update(grads, plain.init(params), params)
    for path, new, old in zip(_paths(plain_updates), jax.tree_util.tree_leaves(scaled_updates),
                              jax.tree_util.tree_leaves(plain_updates)):
        if "['a_proj']['kernel']" in path:
            np.testing.assert_allclose(new, s * np.asarray(old), rtol=1e-6)
            assert np.any(np.asarray(old) != 0)
        else:
            np.testing.assert_array_equal(new, old)


def test_optimizer_labels_freeze_and_low_rank_leaves():
    """freeze_gdn_decay moves A_log and dt_bias (only) to "frozen"; any 0-/1-D leaf, whatever
    its name, skips weight decay; a 2-D leaf inside a module named like a norm does not."""
    tree = _model_tree(seed=10)
    tree["layer_1"]["mixer"]["mask_offset"] = jnp.float32(0.3)
    tree["layer_1"]["pre_norm"]["kernel"] = jnp.ones((6, 6))
    plain, frozen = _paths(optimizer_labels(tree)), _paths(optimizer_labels(tree, True))
    assert plain["['layer_1']['mixer']['mask_offset']"] == "no_decay"
    assert plain["['layer_1']['pre_norm']['kernel']"] == "default"
    changed = {path for path in plain if plain[path] != frozen[path]}
    assert changed == {"['layer_0']['mixer']['A_log']", "['layer_0']['mixer']['dt_bias']"}
    assert {frozen[path] for path in changed} == {"frozen"}


def test_boxed_leaves_are_labelled_by_their_value():
    variables = _gdn_variables(seed=11)
    boxed = optimizer_labels(variables["params"], True)
    unboxed = optimizer_labels(nn.meta.unbox(variables)["params"], True)
    leaves = jax.tree_util.tree_leaves(boxed)
    assert leaves == jax.tree_util.tree_leaves(unboxed)
    assert set(leaves) == {"alpha", "frozen", "no_decay", "default"}
