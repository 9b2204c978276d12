"""Tests for fpa_jax.layers: every layer inits and runs under jit, gets gradient in every
parameter, is causal, isolates packed documents and runs in bf16; FPAAttention's switches
match an independent NumPy computation of the layer (projections, walk, path-minimum bias,
softmax, output projection), and its initialisation is FoX's bias."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import fpa_jax
from fpa_jax.layers import (
    DCPAttention,
    FoXAttention,
    FPAAttention,
    SelectiveAttention,
    SoftmaxAttention,
    per_head_forget_values,
    positions_within_segments,
)
from mixer_core.registry import UnsupportedImplementationError

BATCH, LENGTH, MODEL_DIM, HEADS, HEAD_DIM = 2, 11, 12, 3, 4

LAYERS = {
    "fpa": lambda **kw: FPAAttention(HEADS, HEAD_DIM, **kw),
    "fpa_stack": lambda **kw: FPAAttention(HEADS, HEAD_DIM, stack_form=True, **kw),
    "fpa_no_key_level": lambda **kw: FPAAttention(HEADS, HEAD_DIM, key_level=False, **kw),
    "fpa_query_level": lambda **kw: FPAAttention(HEADS, HEAD_DIM, query_level=True, **kw),
    "fpa_no_content": lambda **kw: FPAAttention(HEADS, HEAD_DIM, content=False, **kw),
    "fpa_dip_sum": lambda **kw: FPAAttention(HEADS, HEAD_DIM, dip_sum=True, **kw),
    "fpa_no_bias": lambda **kw: FPAAttention(HEADS, HEAD_DIM, use_bias=False, **kw),
    "fox": lambda **kw: FoXAttention(HEADS, HEAD_DIM, **kw),
    "softmax_rope": lambda **kw: SoftmaxAttention(HEADS, HEAD_DIM, position="rope", **kw),
    "softmax_nope": lambda **kw: SoftmaxAttention(HEADS, HEAD_DIM, position="nope", **kw),
    "softmax_alibi": lambda **kw: SoftmaxAttention(HEADS, HEAD_DIM, position="alibi", **kw),
    "selective_rope": lambda **kw: SelectiveAttention(HEADS, HEAD_DIM, position="rope", **kw),
    "selective_nope": lambda **kw: SelectiveAttention(HEADS, HEAD_DIM, position="nope", **kw),
    "dcp": lambda **kw: DCPAttention(HEADS, HEAD_DIM, **kw),
}

PROJECTIONS = {"query", "key", "value", "out"}
EXPECTED_PARAMS = {
    "fpa": PROJECTIONS | {"delta_proj", "field_proj", "level_proj", "rho"},
    "fpa_stack": PROJECTIONS | {"delta_proj", "rho"},
    "fpa_no_key_level": PROJECTIONS | {"delta_proj", "field_proj", "rho"},
    "fpa_query_level": PROJECTIONS | {"delta_proj", "field_proj", "level_proj", "rho"},
    "fpa_no_content": {"value", "out", "delta_proj", "field_proj", "level_proj", "rho"},
    "fpa_dip_sum": PROJECTIONS | {"delta_proj", "field_proj", "level_proj", "rho"},
    "fpa_no_bias": PROJECTIONS,
    "fox": PROJECTIONS | {"forget_proj"},
    "softmax_rope": PROJECTIONS,
    "softmax_nope": PROJECTIONS,
    "softmax_alibi": PROJECTIONS,
    "selective_rope": PROJECTIONS,
    "selective_nope": PROJECTIONS,
    "dcp": PROJECTIONS | {"mask_query", "mask_key", "mask_offset"},
}


def _normal(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _inputs(seed, batch=BATCH, length=LENGTH):
    return jnp.asarray(_normal(seed, (batch, length, MODEL_DIM)))


def _max_gap(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# Compiling is most of this file's cost: each layer class is initialised once under jit, and each
# (configuration, dtype) gets one jitted apply, reused by every test at the shape [BATCH, LENGTH].
# Flax derives a parameter's random init from its path, so a configuration whose parameters are a
# subset of "fpa"'s (an FPA switch, softmax, selective) starts with exactly that subset.
JIT_INITIALISED = ["fpa", "fpa_query_level", "fox", "softmax_rope", "selective_rope", "dcp"]
INIT_SEED = 5


@functools.lru_cache(maxsize=None)
def _initial_params(name):
    if name not in JIT_INITIALISED:
        return {key: _initial_params("fpa")[key] for key in EXPECTED_PARAMS[name]}
    module = LAYERS[name]()
    return nn.unbox(jax.jit(module.init)(jax.random.PRNGKey(INIT_SEED), _inputs(0)))["params"]


@functools.lru_cache(maxsize=None)
def _jitted_apply(name, dtype=jnp.float32):
    module = LAYERS[name](dtype=dtype)
    return jax.jit(lambda params, x, segment_ids, positions: module.apply(
        {"params": params}, x, segment_ids=segment_ids, positions=positions))


def _apply(name, params, x, segment_ids=None, positions=None, dtype=jnp.float32):
    return _jitted_apply(name, dtype)(params, x, segment_ids, positions)


def _perturb(params, seed, scale=0.5):
    """Every parameter plus noise, so zero-initialised maps (fields, levels, gates) matter."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    noisy = [np.asarray(leaf) + scale / math.sqrt(leaf.shape[0] if leaf.ndim >= 2 else 1)
             * _normal(seed * 1000 + i, leaf.shape) for i, leaf in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def _segments(*rows):
    """segment_ids [len(rows), T] from per-row document lengths."""
    return jnp.asarray([np.repeat(np.arange(len(lengths)), lengths) for lengths in rows], jnp.int32)


# ----------------------------------------------------------------------------------------------
# Independent NumPy computation of the FPA / FoX layers
# ----------------------------------------------------------------------------------------------


def _numpy_layer(params, x, bias_fn, segment_ids=None, content=True):
    """y = out(softmax(scale q.k + bias) v) with bias_fn(t, s) -> [B, H] and causal/document masks."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(x, np.float64)
    batch, length, _ = x.shape
    v = np.einsum("btd,dhk->bthk", x, p["value"]["kernel"])
    logits = np.zeros((batch, HEADS, length, length))
    if content:
        q = np.einsum("btd,dhk->bthk", x, p["query"]["kernel"])
        k = np.einsum("btd,dhk->bthk", x, p["key"]["kernel"])
        logits += np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(HEAD_DIM)
    segments = np.zeros((batch, length)) if segment_ids is None else np.asarray(segment_ids)
    for t in range(length):
        for s in range(length):
            visible = (s <= t) & (segments[:, s] == segments[:, t])
            bias = bias_fn(t, s) if s < t else 0.0
            logits[:, :, t, s] = np.where(visible[:, None], logits[:, :, t, s] + bias, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads_out = np.einsum("bhts,bshk->bthk", weights, v)
    return np.einsum("bthk,hkd->btd", heads_out, p["out"]["kernel"])


def _scalar_map(params, name, x):
    p = params[name]
    kernel, bias = np.asarray(p["kernel"], np.float64), np.asarray(p["bias"], np.float64)
    return np.einsum("btd,dh->bth", np.asarray(x, np.float64), kernel) + bias


def _numpy_fpa(params, x, module, segment_ids=None):
    delta = _scalar_map(params, "delta_proj", x)
    zeros = np.zeros_like(delta)
    g = _scalar_map(params, "field_proj", x) if "field_proj" in params else zeros
    h = _scalar_map(params, "level_proj", x) if "level_proj" in params else zeros
    walk = np.cumsum(delta, axis=1)  # no restart: the bias only compares values of one document
    phi, psi = walk + g, walk + h
    beta = np.log1p(np.exp(np.asarray(params["rho"], np.float64)))

    def bias(t, s):
        level = psi[:, t] if module.query_level else psi[:, s]
        if module.dip_sum:
            return beta * np.minimum(0.0, phi[:, s + 1:t + 1] - level[:, None]).sum(1)
        return beta * np.minimum(0.0, phi[:, s + 1:t + 1].min(1) - level)

    return _numpy_layer(params, x, bias, segment_ids, content=module.content)


FPA_SWITCHES = ["fpa", "fpa_stack", "fpa_no_key_level", "fpa_query_level", "fpa_no_content", "fpa_dip_sum"]


# ----------------------------------------------------------------------------------------------
# Every layer
# ----------------------------------------------------------------------------------------------

# Configurations whose gradients are checked: each FPA switch that changes which terms carry
# gradient, and every other class (stack_form and key_level=False only drop parameters).
GRADIENT_CHECKED = ["fpa", "fpa_query_level", "fpa_no_content", "fpa_dip_sum", "fox", "softmax_rope",
                    "selective_rope", "dcp"]


SCALAR_MAPS = ("delta_proj", "field_proj", "level_proj", "forget_proj")
LOGICAL_AXES = {
    **{(proj, "kernel"): ("embed", "heads", "head_dim") for proj in ("query", "key", "value")},
    ("out", "kernel"): ("heads", "head_dim", "embed"),
    **{(proj, "kernel"): ("embed", "heads") for proj in SCALAR_MAPS},
    **{(proj, "bias"): ("heads",) for proj in SCALAR_MAPS},
    ("rho",): ("heads",),
    ("mask_query", "kernel"): ("embed", "mask_rank"),
    ("mask_key", "kernel"): ("embed", "mask_rank"),
    ("mask_offset",): (),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_init_creates_the_expected_params_with_logical_axes(name):
    shapes = jax.eval_shape(LAYERS[name]().init, jax.random.PRNGKey(0), _inputs(0))["params"]
    assert set(shapes) == EXPECTED_PARAMS[name]
    is_boxed = lambda leaf: isinstance(leaf, nn.LogicallyPartitioned)  # noqa: E731
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes, is_leaf=is_boxed):
        keys = tuple(entry.key for entry in path)
        assert is_boxed(leaf), f"{name}{keys}: no logical axis names"
        assert leaf.names == LOGICAL_AXES[keys], f"{name}{keys}: {leaf.names}"
        assert leaf.value.dtype == jnp.float32


def test_shared_parameter_names_start_equal():
    """The premise of _initial_params: same name and seed -> same initial value across layers."""
    fpa = _initial_params("fpa")
    for name in ("fpa_query_level", "fox", "softmax_rope", "selective_rope", "dcp"):
        for key in PROJECTIONS:
            np.testing.assert_array_equal(_initial_params(name)[key]["kernel"], fpa[key]["kernel"])


@pytest.mark.parametrize("name", GRADIENT_CHECKED)
def test_layer_runs_under_jit_and_every_param_gets_gradient(name):
    module = LAYERS[name]()
    x = _inputs(seed=100 + sorted(LAYERS).index(name))
    params = _initial_params(name)
    cotangent = jnp.asarray(_normal(7, x.shape))

    def loss(p):
        y = module.apply({"params": p}, x)
        return jnp.sum(y * cotangent), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(y)))
    for path, grad in jax.tree_util.tree_leaves_with_path(grads):
        label = jax.tree_util.keystr(path)
        grad = np.asarray(grad)
        assert np.all(np.isfinite(grad)), f"{name}{label}: non-finite gradient"
        assert np.max(np.abs(grad)) > 1e-7, f"{name}{label}: zero gradient"


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_is_causal(name):
    x = _inputs(seed=11)
    params = _perturb(_initial_params(name), seed=3)
    cut = 6
    x_changed = jnp.concatenate([x[:, :cut], _inputs(seed=12)[:, cut:]], axis=1)
    y = _apply(name, params, x)
    y_changed = _apply(name, params, x_changed)
    np.testing.assert_allclose(y[:, :cut], y_changed[:, :cut], rtol=1e-5, atol=1e-5)
    assert _max_gap(y[:, cut:], y_changed[:, cut:]) > 1e-3


@pytest.mark.parametrize("name", ["fpa", "fpa_query_level", "fpa_dip_sum", "fox", "softmax_rope",
                                  "softmax_alibi", "selective_rope", "dcp"])
def test_segment_ids_isolate_documents(name):
    """Document 2 of a packed row gives the same output as document 2 at the start of a row
    without segment_ids (what follows it there cannot matter: the layers are causal)."""
    params = _perturb(_initial_params(name), seed=5)
    x = _inputs(seed=21)
    middle = slice(4, 9)
    packed = _apply(name, params, x, segment_ids=_segments((4, 5, 2), (11,)))
    x_alone = jnp.asarray(np.concatenate([np.asarray(x)[:, middle], np.asarray(x)[:, 5:]], axis=1))
    alone = _apply(name, params, x_alone)
    np.testing.assert_allclose(packed[0, middle], alone[0, :5], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed[1], _apply(name, params, x)[1], rtol=1e-5, atol=1e-5)
    # Without segment_ids the middle document sees the first one.
    unpacked = _apply(name, params, x)
    assert _max_gap(unpacked[0, middle], alone[0, :5]) > 1e-3


@pytest.mark.parametrize("name", ["fpa", "fpa_dip_sum", "fox", "softmax_alibi", "selective_rope", "dcp"])
def test_single_token_attends_to_itself(name):
    """T = 1: the only key is the token itself, so y = (x W_value) W_out whatever the bias."""
    params = _perturb(_initial_params(name), seed=6)
    x = _inputs(seed=33, length=1)
    value = np.einsum("btd,dhk->bthk", np.asarray(x), np.asarray(params["value"]["kernel"]))
    expected = np.einsum("bthk,hkd->btd", value, np.asarray(params["out"]["kernel"]))
    np.testing.assert_allclose(_apply(name, params, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["fpa", "fpa_no_content", "fox", "softmax_rope", "selective_rope", "dcp"])
def test_bf16_compute_dtype(name):
    params = _initial_params(name)
    x = _inputs(seed=31)
    y16 = _apply(name, params, x.astype(jnp.bfloat16), dtype=jnp.bfloat16)
    assert y16.dtype == jnp.bfloat16
    y32 = _apply(name, params, x)
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, rtol=0.05, atol=0.05)


# ----------------------------------------------------------------------------------------------
# FPA: switches against the NumPy layer, initialisation, the no-bias layer
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FPA_SWITCHES)
def test_fpa_switches_match_numpy_layer(name):
    x = _inputs(seed=41 + FPA_SWITCHES.index(name))
    params = _perturb(_initial_params(name), seed=9)
    segment_ids = _segments((5, 6), (11,))
    y = _apply(name, params, x, segment_ids=segment_ids)
    np.testing.assert_allclose(y, _numpy_fpa(params, x, LAYERS[name](), segment_ids), rtol=2e-4, atol=2e-4)


def test_fpa_switches_change_the_output():
    x = _inputs(seed=51)
    params = _perturb(_initial_params("fpa"), seed=11)
    outputs = {name: _apply(name, {key: params[key] for key in EXPECTED_PARAMS[name]}, x)
               for name in FPA_SWITCHES}
    for i, first in enumerate(FPA_SWITCHES):
        for second in FPA_SWITCHES[i + 1:]:
            gap = _max_gap(outputs[first], outputs[second])
            assert gap > 1e-3, f"{first} and {second} give the same output"


def test_fpa_content_off_ignores_queries_and_keys():
    x = _inputs(seed=52)
    params = _perturb(_initial_params("fpa"), seed=13)
    no_content = {key: params[key] for key in EXPECTED_PARAMS["fpa_no_content"]}
    y_off = _apply("fpa_no_content", no_content, x)
    assert _max_gap(y_off, _apply("fpa", params, x)) > 1e-3
    zero_queries = dict(params, query={"kernel": jnp.zeros_like(params["query"]["kernel"])})
    np.testing.assert_allclose(y_off, _apply("fpa", zero_queries, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["fpa", "fpa_stack"])
def test_fpa_at_init_is_fox_with_constant_gates(name):
    x = _inputs(seed=61)
    params = _initial_params(name)
    log_forget = np.log(per_head_forget_values(HEADS))
    np.testing.assert_allclose(params["delta_proj"]["bias"], log_forget, rtol=1e-6)
    np.testing.assert_allclose(jax.nn.softplus(params["rho"]), 1.0, rtol=1e-6)
    y = _apply(name, params, x)
    expected = _numpy_layer(params, x, lambda t, s: log_forget * (t - s))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    # FoXAttention starts as the same function: its gates are sigmoid(b_f) = f_h, W_f = 0.
    fox_params = dict(_initial_params("fox"), **{n: params[n] for n in PROJECTIONS})
    np.testing.assert_allclose(_apply("fox", fox_params, x), y, rtol=1e-4, atol=1e-5)


def test_fpa_stack_form_with_decreasing_walk_is_fox():
    """Any data-dependent walk that never rises gives FoX's bias: sum of delta over (s, t]."""
    x = _inputs(seed=62)
    params = _perturb(_initial_params("fpa_stack"), seed=19)
    params["delta_proj"] = {"kernel": 0.3 * params["delta_proj"]["kernel"], "bias": jnp.full((HEADS,), -4.0)}
    delta = _scalar_map(params, "delta_proj", x)
    assert np.all(delta < 0)
    beta = np.log1p(np.exp(np.asarray(params["rho"], np.float64)))
    y = _apply("fpa_stack", params, x)
    expected = _numpy_layer(params, x, lambda t, s: beta * delta[:, s + 1:t + 1].sum(1))
    np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-4)


def test_fpa_query_level_init_is_fox_one_step_later():
    x = _inputs(seed=63)
    params = _initial_params("fpa_query_level")
    log_forget = np.log(per_head_forget_values(HEADS))
    y = _apply("fpa_query_level", params, x)
    expected = _numpy_layer(params, x, lambda t, s: log_forget * (t - s - 1))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_fpa_without_bias_is_nope_softmax():
    x = _inputs(seed=71)
    params = _perturb(_initial_params("fpa_no_bias"), seed=23)
    segment_ids = _segments((7, 4), (11,))
    y = _apply("fpa_no_bias", params, x, segment_ids=segment_ids)
    y_softmax = _apply("softmax_nope", params, x, segment_ids=segment_ids)
    np.testing.assert_allclose(y, y_softmax, rtol=1e-6, atol=1e-6)
    expected = _numpy_layer(params, x, lambda t, s: 0.0, segment_ids)
    np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-4)


def test_fox_matches_numpy_layer():
    x = _inputs(seed=81)
    params = _perturb(_initial_params("fox"), seed=25)
    log_forget = -np.log1p(np.exp(-_scalar_map(params, "forget_proj", x)))
    segment_ids = _segments((3, 8), (11,))
    y = _apply("fox", params, x, segment_ids=segment_ids)
    expected = _numpy_layer(params, x, lambda t, s: log_forget[:, s + 1:t + 1].sum(1), segment_ids)
    np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-4)


def test_forget_init_spread():
    forget = per_head_forget_values(4)
    np.testing.assert_allclose([forget[0], forget[-1]], [0.95, 0.99], rtol=1e-12)
    rates = -np.log(forget)
    np.testing.assert_allclose(rates[1:] / rates[:-1], rates[1] / rates[0], rtol=1e-12)  # geometric
    single = per_head_forget_values(1)
    assert 0.95 < single[0] < 0.99


# ----------------------------------------------------------------------------------------------
# Positions, ALiBi, constructor and input checks
# ----------------------------------------------------------------------------------------------


def test_default_positions_restart_per_document():
    segment_ids = jnp.asarray([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]], jnp.int32)
    np.testing.assert_array_equal(positions_within_segments(segment_ids, 2, 6),
                                  [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(positions_within_segments(None, 1, 3), [[0, 1, 2]])
    x = _inputs(seed=91)
    params = _initial_params("softmax_rope")
    segment_ids = _segments((3, 6, 2), (11,))
    y_default = _apply("softmax_rope", params, x, segment_ids=segment_ids)
    y_explicit = _apply("softmax_rope", params, x, segment_ids=segment_ids,
                        positions=positions_within_segments(segment_ids, BATCH, LENGTH))
    np.testing.assert_allclose(y_default, y_explicit, rtol=1e-6, atol=1e-6)
    # Positions reach RoPE: a stretched position grid changes the output.
    y_stretched = _apply("softmax_rope", params, x, segment_ids=segment_ids,
                         positions=3 * positions_within_segments(segment_ids, BATCH, LENGTH))
    assert _max_gap(y_stretched, y_default) > 1e-3


def test_position_choices_differ():
    x = _inputs(seed=92)
    params = _initial_params("softmax_rope")
    names = ("softmax_rope", "softmax_nope", "softmax_alibi")
    outputs = [_apply(name, params, x) for name in names]
    for i in range(3):
        for j in range(i + 1, 3):
            assert _max_gap(outputs[i], outputs[j]) > 1e-3, (names[i], names[j])


@pytest.mark.parametrize("make, error, message", [
    (lambda: FPAAttention(0, 4), ValueError, "num_heads"),
    (lambda: FPAAttention(2.0, 4), TypeError, "num_heads"),
    (lambda: FoXAttention(2, -1), ValueError, "head_dim"),
    (lambda: FPAAttention(2, 4, tau=0.0), ValueError, "tau"),
    (lambda: FPAAttention(2, 4, dip_sum=True, query_level=True), ValueError, "dip_sum"),
    (lambda: FPAAttention(2, 4, use_bias=False, content=False), ValueError, "content"),
    (lambda: FPAAttention(2, 4, forget_init_range=(0.99, 0.95)), ValueError, "forget_init_range"),
    (lambda: SoftmaxAttention(2, 4, position="learned"), ValueError, "position"),
    (lambda: SoftmaxAttention(2, 3), ValueError, "even head_dim"),
    (lambda: SelectiveAttention(2, 4, position="alibi"), ValueError, "position"),
    (lambda: DCPAttention(2, 4, mask_rank=0), ValueError, "mask_rank"),
    (lambda: DCPAttention(2, 4, keep_init=1.0), ValueError, "keep_init"),
    (lambda: SoftmaxAttention(2, 4, dtype=jnp.int32), TypeError, "dtype"),
    (lambda: SelectiveAttention(2, 4, implementation="xla"), ValueError, "implementation"),
    (lambda: DCPAttention(2, 4, implementation="pallas"), ValueError, "implementation"),
    (lambda: FPAAttention(2, 4, dip_sum=True, implementation="xla"), ValueError, "implementation"),
    (lambda: FPAAttention(2, 4, implementation="cudnn"), ValueError, "implementation"),
    (lambda: FPAAttention(2, 4, use_bias=False, implementation="cudnn"), UnsupportedImplementationError,
     "cannot run 'cudnn' here: needs a GPU"),
    (lambda: SoftmaxAttention(2, 4, implementation="cudnn"), UnsupportedImplementationError,
     "cannot run 'cudnn' here: needs a GPU"),
    (lambda: FoXAttention(2, 4, implementation="fast"), ValueError, "implementation"),
    (lambda: FPAAttention(2, 4, block_size=12), ValueError, "block_size must be a multiple of 8"),
    (lambda: FoXAttention(2, 4, block_size=0), ValueError, "block_size"),
    (lambda: SoftmaxAttention(2, 4, block_size=16.0), TypeError, "block_size"),
    (lambda: FPAAttention(2, 4, dip_sum=True, block_size=16), ValueError, "dip_sum"),
])
def test_bad_constructor_arguments_raise(make, error, message):
    with pytest.raises(error, match=message):
        jax.eval_shape(make().init, jax.random.PRNGKey(0), _inputs(seed=0, length=3))


def test_each_layer_names_the_op_its_implementation_is_checked_against():
    expected = {"fpa_dip_sum": "dipsum_attention", "fpa_no_bias": "softmax_attention",
                "fox": "fox_attention", "dcp": "dcp_attention"}
    for name, make in LAYERS.items():
        op_name = make().op_name
        assert op_name in fpa_jax.REGISTRIES
        want = expected.get(name, "fpa_attention" if name.startswith("fpa") else
                            name.split("_")[0] + "_attention")
        assert op_name == want, name


def test_bad_inputs_raise():
    module = FPAAttention(HEADS, HEAD_DIM)
    x = _inputs(seed=1, length=5)
    with pytest.raises(ValueError, match="x must have shape"):
        jax.eval_shape(module.init, jax.random.PRNGKey(0), x[0])
    with pytest.raises(ValueError, match="segment_ids"):
        jax.eval_shape(lambda key: module.init(key, x, segment_ids=jnp.zeros((BATCH, 4), jnp.int32)),
                       jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="positions"):
        float_positions = jnp.zeros((BATCH, 5))
        jax.eval_shape(lambda key: SoftmaxAttention(HEADS, HEAD_DIM).init(key, x, positions=float_positions),
                       jax.random.PRNGKey(0))
