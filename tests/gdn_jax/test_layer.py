"""GatedDeltaNet layer: against an independent float64 NumPy implementation, decoding, documents."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import GatedDeltaNet


# One configuration shared by most tests (grouped value heads, V != K, T not a multiple of the
# chunk) so that each jitted function compiles once.
MODULE = GatedDeltaNet(num_heads=2, head_dim=4, num_v_heads=4, v_head_dim=3, chunk_size=8, norm_eps=1e-5)
APPLY = jax.jit(MODULE.apply)
STEP = jax.jit(lambda variables, x_t, cache: MODULE.apply(variables, x_t, cache, method=GatedDeltaNet.step))
LENGTH, WIDTH = 20, 10


def _inputs(seed, shape=(2, LENGTH, WIDTH)):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _random_variables(module, x, seed, scale=0.5):
    """Fresh normal noise for every parameter (no init compile; no init value hides a bug)."""
    shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(0), x))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda s: jnp.asarray(scale * rng.standard_normal(s.shape), s.dtype), shapes)


@pytest.fixture(scope="module")
def initialised():
    """MODULE.init on real inputs (boxed variables)."""
    return jax.jit(MODULE.init)(jax.random.PRNGKey(3), _inputs(0))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def numpy_gated_deltanet(params, x, *, num_heads, head_dim, num_v_heads, v_head_dim, norm_eps):
    """Token-by-token float64 reference of the whole layer, written from the spec."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(x, np.float64)
    batch, length, _ = x.shape
    group = num_v_heads // num_heads

    def conv(u, kernel):
        width = kernel.shape[0]
        out = np.zeros_like(u)
        for t in range(length):
            for j in range(width):
                source = t - (width - 1) + j
                if source >= 0:
                    out[:, t] += kernel[j] * u[:, source]
        return _silu(out)

    def l2(u):
        return u / np.sqrt(np.sum(u * u, -1, keepdims=True) + 1e-6)

    q = l2(conv(x @ p["q_proj"]["kernel"], p["q_conv"]["kernel"]).reshape(batch, length, num_heads, head_dim))
    k = l2(conv(x @ p["k_proj"]["kernel"], p["k_conv"]["kernel"]).reshape(batch, length, num_heads, head_dim))
    v = conv(x @ p["v_proj"]["kernel"], p["v_conv"]["kernel"]).reshape(batch, length, num_v_heads, v_head_dim)
    z = (x @ p["z_proj"]["kernel"]).reshape(batch, length, num_v_heads, v_head_dim)
    g = -np.exp(p["A_log"]) * _softplus(x @ p["a_proj"]["kernel"] + p["dt_bias"])
    beta = 1.0 / (1.0 + np.exp(-(x @ p["b_proj"]["kernel"])))
    state = np.zeros((batch, num_v_heads, head_dim, v_head_dim))
    out = np.zeros((batch, length, num_v_heads, v_head_dim))
    for t in range(length):
        for h in range(num_v_heads):
            key, query = k[:, t, h // group], q[:, t, h // group] * head_dim ** -0.5
            state[:, h] *= np.exp(g[:, t, h])[:, None, None]
            error = beta[:, t, h, None] * (v[:, t, h] - np.einsum("bkv,bk->bv", state[:, h], key))
            state[:, h] += key[:, :, None] * error[:, None, :]
            out[:, t, h] = np.einsum("bkv,bk->bv", state[:, h], query)
    normed = out / np.sqrt(np.mean(out * out, -1, keepdims=True) + norm_eps) * p["o_norm"]["scale"]
    gated = normed * _silu(z)
    return gated.reshape(batch, length, -1) @ p["o_proj"]["kernel"]


def test_matches_numpy_reference_grouped_heads():
    x = _inputs(1)
    variables = _random_variables(MODULE, x, seed=2)
    y = APPLY(variables, x)
    expected = numpy_gated_deltanet(variables["params"], x, num_heads=2, head_dim=4, num_v_heads=4,
                                    v_head_dim=3, norm_eps=1e-5)
    assert y.shape == x.shape and y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_matches_numpy_reference_single_token_short_conv():
    module = GatedDeltaNet(num_heads=3, head_dim=4, conv_size=2, norm_eps=1e-5)
    x = _inputs(4, (3, 1, 7))
    variables = _random_variables(module, x, seed=5)
    expected = numpy_gated_deltanet(variables["params"], x, num_heads=3, head_dim=4, num_v_heads=3,
                                    v_head_dim=4, norm_eps=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(module.apply)(variables, x)), expected, rtol=2e-4, atol=2e-5)


def test_parameter_tree_shapes_and_logical_axes(initialised):
    boxes = jax.tree_util.tree_leaves(initialised, is_leaf=lambda n: isinstance(n, nn.Partitioned))
    assert all(isinstance(b, nn.Partitioned) for b in boxes)
    expected = {
        ("q_proj", "kernel"): ((WIDTH, 8), ("embed", "heads_x_dim")),
        ("k_proj", "kernel"): ((WIDTH, 8), ("embed", "heads_x_dim")),
        ("v_proj", "kernel"): ((WIDTH, 12), ("embed", "heads_x_dim")),
        ("z_proj", "kernel"): ((WIDTH, 12), ("embed", "heads_x_dim")),
        ("a_proj", "kernel"): ((WIDTH, 4), ("embed", "v_heads")),
        ("b_proj", "kernel"): ((WIDTH, 4), ("embed", "v_heads")),
        ("q_conv", "kernel"): ((4, 8), ("conv", "heads_x_dim")),
        ("k_conv", "kernel"): ((4, 8), ("conv", "heads_x_dim")),
        ("v_conv", "kernel"): ((4, 12), ("conv", "heads_x_dim")),
        ("o_norm", "scale"): ((3,), ("v_head_dim",)),
        ("o_proj", "kernel"): ((12, WIDTH), ("heads_x_dim", "embed")),
        ("A_log",): ((4,), ("v_heads",)),
        ("dt_bias",): ((4,), ("v_heads",)),
    }
    flat = {tuple(k.key for k in path): box for path, box in jax.tree_util.tree_flatten_with_path(
        initialised["params"], is_leaf=lambda n: isinstance(n, nn.Partitioned))[0]}
    assert set(flat) == set(expected)
    for path, (shape, names) in expected.items():
        assert flat[path].value.shape == shape, path
        assert tuple(flat[path].names) == names, path
    conv_bound = 1 / np.sqrt(4)
    assert np.all(np.abs(np.asarray(flat[("q_conv", "kernel")].value)) <= conv_bound)
    np.testing.assert_array_equal(flat[("o_norm", "scale")].value, np.ones(3))


def test_initial_gate_parameters(initialised):
    """A = exp(A_log) in [1e-4, 16], softplus(dt_bias) in [1e-3, 0.1] (log-uniform)."""
    from gdn_jax.layer import _a_log_init, _dt_bias_init

    params = nn.meta.unbox(initialised["params"])
    a_log = np.concatenate([np.asarray(params["A_log"]), np.asarray(jax.jit(_a_log_init, static_argnums=1)(
        jax.random.PRNGKey(1), (4096,)))])
    dt_bias = np.concatenate([np.asarray(params["dt_bias"]), np.asarray(jax.jit(_dt_bias_init, static_argnums=1)(
        jax.random.PRNGKey(2), (4096,)))])
    a, dt = np.exp(a_log.astype(np.float64)), _softplus(dt_bias.astype(np.float64))
    assert np.all((a >= 1e-4 * (1 - 1e-6)) & (a <= 16.0 * (1 + 1e-6)))
    assert abs(np.mean(a) - 8.0) < 0.5 and a.min() < 0.1 and a.max() > 15.9   # U(0, 16)
    assert np.all((dt >= 1e-3 * (1 - 1e-4)) & (dt <= 0.1 * (1 + 1e-4)))
    assert abs(np.mean(np.log(dt)) - np.log(1e-2)) < 0.1                       # log-uniform


def test_gradients_reach_every_parameter_and_match_finite_differences(initialised):
    x = _inputs(6)
    variables = nn.meta.unbox(initialised)
    target = _inputs(7)

    def loss(v):
        return jnp.sum(APPLY(v, x) * target)

    grads = jax.jit(jax.grad(lambda v: jnp.sum(MODULE.apply(v, x) * target)))(variables)
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
        assert np.all(np.isfinite(leaf)), path
        assert np.any(np.asarray(leaf) != 0), f"no gradient reaches {jax.tree_util.keystr(path)}"
    direction = _random_variables(MODULE, x, seed=8, scale=1.0)
    eps = 1e-3
    plus, minus = (jax.tree_util.tree_map(lambda p, d, sign=sign: p + sign * eps * d, variables, direction)
                   for sign in (1.0, -1.0))
    finite_difference = (loss(plus) - loss(minus)) / (2 * eps)
    analytic = sum(jnp.vdot(g, d) for g, d in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(direction)))
    np.testing.assert_allclose(analytic, finite_difference, rtol=1e-2)


def test_step_decoding_reproduces_parallel_forward():
    x = _inputs(11)
    variables = _random_variables(MODULE, x, seed=12)
    y = APPLY(variables, x)
    cache = MODULE.init_cache(2)  # unbound call: needs no parameters
    assert cache["state"].shape == (2, 4, 4, 3) and cache["state"].dtype == jnp.float32
    assert cache["v_conv"].shape == (2, 3, 12) and cache["q_conv"].shape == (2, 3, 8)
    outputs = []
    for t in range(LENGTH):
        y_t, cache = STEP(variables, x[:, t], cache)
        outputs.append(y_t)
    np.testing.assert_allclose(np.stack(outputs, 1), y, rtol=1e-4, atol=1e-5)


def test_segment_ids_isolate_documents():
    x = _inputs(21)
    variables = _random_variables(MODULE, x, seed=22)
    boundaries = (6, 13)  # document 2 starts at a different place in each row
    segment_ids = jnp.asarray([[7] * b + [2] * (LENGTH - b) for b in boundaries], jnp.int32)
    segmented = jax.jit(lambda v, x, s: MODULE.apply(v, x, segment_ids=s))
    y = segmented(variables, x, segment_ids)
    # the layer is causal, so rolling document 2 to the front gives "document 2 alone" in the
    # first LENGTH - b outputs; document 1 alone is the first b outputs of the plain run
    rolled = jnp.stack([jnp.roll(x[row], -b, axis=0) for row, b in enumerate(boundaries)])
    y_plain, y_rolled = APPLY(variables, x), APPLY(variables, rolled)
    for row, b in enumerate(boundaries):
        np.testing.assert_allclose(y[row, :b], y_plain[row, :b], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y[row, b:], y_rolled[row, :LENGTH - b], rtol=1e-4, atol=1e-5)
        # without segment ids document 2 does see document 1 (so this test can fail)
        assert np.max(np.abs(y_plain[row, b:] - y_rolled[row, :LENGTH - b])) > 1e-3


def test_mixer_signature_positions_are_ignored():
    """__call__(x, *, segment_ids=None, positions=None), like every attention mixer."""
    x = _inputs(25)
    variables = _random_variables(MODULE, x, seed=26)
    positions = jnp.asarray(np.random.default_rng(27).integers(0, 100, (2, LENGTH)), jnp.int32)
    np.testing.assert_array_equal(APPLY(variables, x, positions=positions), APPLY(variables, x))
    assert MODULE.op_name == "gated_delta_rule"


def test_bfloat16_compute_dtype():
    module16 = GatedDeltaNet(num_heads=2, head_dim=4, num_v_heads=4, v_head_dim=3, chunk_size=8,
                             norm_eps=1e-5, dtype=jnp.bfloat16)
    x = _inputs(31)
    variables = _random_variables(MODULE, x, seed=32, scale=0.3)
    y32 = APPLY(variables, x)
    y16 = jax.jit(module16.apply)(variables, x.astype(jnp.bfloat16))
    assert y16.dtype == jnp.bfloat16
    error = np.abs(np.asarray(y16, np.float32) - np.asarray(y32))
    assert error.max() < 0.05 * np.abs(np.asarray(y32)).max()


def test_errors():
    x = _inputs(0)
    variables = _random_variables(MODULE, x, seed=0)
    with pytest.raises(ValueError, match="x must have shape"):
        MODULE.apply(variables, x[0])
    with pytest.raises(ValueError, match="segment_ids"):
        MODULE.apply(variables, x, segment_ids=jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(TypeError, match="segment_ids"):
        MODULE.apply(variables, x, segment_ids=jnp.zeros((2, LENGTH), jnp.float32))
    with pytest.raises(ValueError, match="num_v_heads"):
        jax.eval_shape(GatedDeltaNet(num_heads=2, head_dim=4, num_v_heads=3).init, jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="^GatedDeltaNet: implementation: gated_delta_rule has no "
                                         "implementation 'cudnn'"):
        jax.eval_shape(GatedDeltaNet(num_heads=2, head_dim=4, implementation="cudnn").init,
                       jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="positions"):
        MODULE.apply(variables, x, positions=jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(TypeError, match="positions"):
        MODULE.apply(variables, x, positions=jnp.zeros((2, LENGTH), jnp.float32))
    with pytest.raises(ValueError, match="batch_size"):
        MODULE.init_cache(0)
    cache = MODULE.init_cache(2)
    with pytest.raises(ValueError, match="cache\\['q_conv'\\] must have shape \\(1, 3, 8\\)"):
        MODULE.apply(variables, x[:1, 0], cache, method=GatedDeltaNet.step)
    with pytest.raises(ValueError, match="keys"):
        MODULE.apply(variables, x[:, 0], {"state": cache["state"]}, method=GatedDeltaNet.step)
