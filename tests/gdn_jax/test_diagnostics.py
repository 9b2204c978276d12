"""Spectral diagnostics on transitions with known spectra, long products, and a real layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import (GatedDeltaNet, gdn_transition_inputs, plot_decay_spectra, slow_mode_summary,
                     transition_spectrum, write_energy)
from gdn_jax.diagnostics import LOG_SIGMA_FLOOR


def _orthonormal_basis(seed, dim):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))
    return q  # columns


def _designed_sequence(length, heads, dim, writes, log_alpha_per_head, seed):
    """Transitions whose key part is known: at steps 1, 2, ... head h writes key basis[:, r] with
    strength beta (writes[h] = [(r, beta), ...]); every other step has beta = 0 (identity).
    Then R = Q diag(prod over the writes to r of (1 - beta)) Q^T."""
    basis = np.stack([_orthonormal_basis(seed + h, dim) for h in range(heads)])  # [HV, K, K]
    keys = np.zeros((length, heads, dim))
    keys[:] = basis[:, :, 0]  # harmless filler keys (beta = 0)
    beta = np.zeros((length, heads))
    for h, head_writes in enumerate(writes):
        for step, (mode, strength) in enumerate(head_writes, start=1):
            keys[step, h] = basis[h, :, mode]
            beta[step, h] = strength
    log_alpha = np.broadcast_to(np.asarray(log_alpha_per_head), (length, heads))
    return log_alpha, beta, keys, basis


def test_known_spectrum_rates_and_singular_vectors():
    heads, dim = 2, 4
    writes = [[(0, 0.5), (0, 0.5), (1, 0.9), (3, 0.2)], [(2, 0.6)]]
    log_alpha_per_head = [np.log(0.99), np.log(0.9)]
    log_alpha, beta, keys, basis = _designed_sequence(60, heads, dim, writes, log_alpha_per_head, seed=1)
    key_part = [np.log([0.25, 0.1, 1.0, 0.8]), np.log([1.0, 1.0, 0.4, 1.0])]
    distances = [50, 5, 20]
    spectrum = transition_spectrum(log_alpha, beta, keys, start=0, distances=distances)
    np.testing.assert_array_equal(spectrum.distances, [5, 20, 50])
    for index, ell in enumerate([5, 20, 50]):
        for h in range(heads):
            expected = np.sort(key_part[h] + ell * log_alpha_per_head[h])[::-1]
            np.testing.assert_allclose(spectrum.log_sigma[index, h], expected, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(spectrum.gamma_alpha[index, h], -log_alpha_per_head[h], rtol=1e-5)
            np.testing.assert_allclose(spectrum.gamma[index, h], -expected / ell, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(spectrum.gamma_keys[index, h], -np.sort(key_part[h])[::-1] / ell,
                                       rtol=1e-5, atol=1e-6)
    # head 0's singular values are distinct: its right singular vectors are the basis vectors
    order = np.argsort(-key_part[0])
    for r, mode in enumerate(order):
        overlap = abs(float(np.dot(spectrum.right_vectors[0, 0, :, r], basis[0, :, mode])))
        np.testing.assert_allclose(overlap, 1.0, atol=1e-5)


def test_start_position_and_random_keys_match_direct_product():
    rng = np.random.default_rng(2)
    length, heads, dim, start = 40, 3, 5, 7
    keys = rng.standard_normal((length, heads, dim))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    beta = rng.uniform(0.0, 1.0, (length, heads))
    log_alpha = -rng.uniform(0.0, 0.1, (length, heads))
    distances = [3, 17, 32]
    spectrum = transition_spectrum(jnp.asarray(log_alpha, jnp.float32), jnp.asarray(beta, jnp.float32),
                                   jnp.asarray(keys, jnp.float32), start=start, distances=distances)
    for index, ell in enumerate(distances):
        for h in range(heads):
            phi = np.eye(dim)
            for t in range(start + 1, start + ell + 1):
                step = np.exp(log_alpha[t, h]) * (np.eye(dim) - beta[t, h] * np.outer(keys[t, h], keys[t, h]))
                phi = step @ phi
            _, sigma, right_t = np.linalg.svd(phi)
            reliable = np.log(sigma) > np.log(sigma[0]) - 8   # well above float32 rounding
            np.testing.assert_allclose(spectrum.log_sigma[index, h][reliable], np.log(sigma)[reliable],
                                       rtol=1e-4, atol=2e-3)
            slow = np.log(sigma) >= -1
            np.testing.assert_array_equal(spectrum.slow_mask[index, h], slow)
            # the slow subspace (a projector, free of sign and ordering ambiguity) matches
            v_slow = np.asarray(spectrum.right_vectors[index, h])[:, slow]
            np.testing.assert_allclose(v_slow @ v_slow.T, right_t[slow].T @ right_t[slow], atol=1e-4)


def test_long_product_does_not_underflow():
    length, heads, dim = 5001, 2, 4
    rng = np.random.default_rng(3)
    keys = np.zeros((length, heads, dim))
    keys[:, 0, 0] = 1.0                       # head 0: always e_0 with beta = 1e-3 -> (0.999)^5000
    keys[:, 1] = rng.standard_normal((length, dim))
    keys[:, 1] /= np.linalg.norm(keys[:, 1], axis=-1, keepdims=True)   # head 1: random keys
    beta = np.stack([np.full(length, 1e-3), rng.uniform(0.0, 1.0, length)], axis=1)
    log_alpha = np.full((length, heads), np.log(0.9))
    spectrum = transition_spectrum(log_alpha.astype(np.float32), beta.astype(np.float32),
                                   keys.astype(np.float32), start=0, distances=[100, 5000])
    for field in ("log_sigma", "gamma", "gamma_alpha", "gamma_keys", "right_vectors"):
        assert np.all(np.isfinite(np.asarray(getattr(spectrum, field)))), field
    np.testing.assert_allclose(spectrum.gamma_alpha, -np.log(0.9), rtol=1e-5)
    expected_head0 = 5000 * np.log(0.9) + np.array([0.0, 0.0, 0.0, 5000 * np.log1p(-1e-3)])
    np.testing.assert_allclose(spectrum.log_sigma[1, 0], expected_head0, rtol=1e-4)
    assert np.all(np.asarray(spectrum.log_sigma[1, 1]) < -500)   # everything is fast, still finite
    assert np.all(np.asarray(spectrum.slow_band_width) == 0)


def test_slow_band_width_and_exact_zero_singular_value():
    # log sigma(R) per mode: 0, -0.3, -0.6 and -inf (beta = 1 projects mode 3 out exactly)
    writes = [[(1, 1 - np.exp(-0.3)), (2, 1 - np.exp(-0.6)), (3, 1.0)]] * 2
    log_alpha, beta, keys, _ = _designed_sequence(300, 2, 4, writes, [-0.01, -0.001], seed=4)
    spectrum = transition_spectrum(log_alpha, beta, keys, start=0, distances=[10, 50, 200])
    # head 0: alpha part -0.1, -0.5, -2 ; head 1: -0.01, -0.05, -0.2
    np.testing.assert_array_equal(spectrum.slow_band_width, [[3, 3], [2, 3], [0, 3]])
    assert np.all(np.asarray(spectrum.log_sigma[:, :, -1]) < -10)
    # an exactly singular transition (standard-basis key, beta = 1) is floored, not -inf / NaN
    exact = transition_spectrum(np.full((3, 1), -0.1), np.ones((3, 1)), np.tile([[[1.0, 0.0]]], (3, 1, 1)),
                                start=0, distances=[2])
    np.testing.assert_allclose(exact.log_sigma[0, 0], [-0.2, LOG_SIGMA_FLOOR - 0.2], rtol=1e-6)
    np.testing.assert_array_equal(exact.slow_band_width, [[1]])
    second_layer = spectrum._replace(slow_band_width=jnp.asarray([[0, 1], [0, 0], [4, 0]]))
    summary = slow_mode_summary([spectrum, second_layer])
    np.testing.assert_array_equal(summary.distances, [10, 50, 200])
    np.testing.assert_array_equal(summary.m_slow, [7, 5, 7])
    np.testing.assert_array_equal(summary.h_slow, [3, 2, 2])
    with pytest.raises(ValueError, match="distances"):
        slow_mode_summary([spectrum, transition_spectrum(log_alpha, beta, keys, start=0, distances=[10])])


def test_write_energy_inside_and_outside_the_slow_subspace():
    writes = [[(1, 1 - np.exp(-0.3)), (2, 1 - np.exp(-0.6)), (3, 1.0)]]
    log_alpha, beta, keys, basis = _designed_sequence(60, 1, 4, writes, [-0.01], seed=5)
    spectrum = transition_spectrum(log_alpha, beta, keys, start=0, distances=[50])   # slow: modes 0, 1
    inside = basis[0, :, 0] + 2 * basis[0, :, 1]
    outside = basis[0, :, 2] - basis[0, :, 3]
    mixed = basis[0, :, 0] + basis[0, :, 3]
    np.testing.assert_allclose(write_energy(spectrum, inside), [[1.0]], atol=1e-5)
    np.testing.assert_allclose(write_energy(spectrum, 3.0 * outside), [[0.0]], atol=1e-5)
    np.testing.assert_allclose(write_energy(spectrum, mixed[None]), [[0.5]], atol=1e-5)
    with pytest.raises(ValueError, match="key must be"):
        write_energy(spectrum, np.ones(3))


def test_layer_transition_inputs_and_plot(tmp_path):
    module = GatedDeltaNet(num_heads=2, head_dim=4, num_v_heads=4, v_head_dim=3)
    x = jnp.asarray(np.random.default_rng(6).standard_normal((2, 24, 8)), jnp.float32)
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)["params"]
    rng = np.random.default_rng(7)
    unboxed = jax.tree_util.tree_map(lambda b: rng.standard_normal(b.value.shape).astype(np.float32), shapes,
                                     is_leaf=lambda b: hasattr(b, "names"))
    params = jax.tree_util.tree_map(jnp.asarray, unboxed)
    log_alpha, beta, keys = jax.jit(lambda p, x: gdn_transition_inputs(module, p, x))(params, x)
    assert log_alpha.shape == beta.shape == (2, 24, 4) and keys.shape == (2, 24, 4, 4)
    a = np.asarray(x) @ unboxed["a_proj"]["kernel"]
    expected_log_alpha = -np.exp(unboxed["A_log"]) * np.logaddexp(0.0, a + unboxed["dt_bias"])
    np.testing.assert_allclose(log_alpha, expected_log_alpha, rtol=1e-5, atol=1e-7)
    expected_beta = 1 / (1 + np.exp(-(np.asarray(x) @ unboxed["b_proj"]["kernel"])))
    np.testing.assert_allclose(beta, expected_beta, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(keys, axis=-1), 1.0, atol=1e-3)
    np.testing.assert_array_equal(keys[:, :, 0], keys[:, :, 1])   # value heads 0, 1 read key head 0
    assert not np.allclose(keys[:, :, 1], keys[:, :, 2])
    spectrum = transition_spectrum(log_alpha[0], beta[0], keys[0], start=2, distances=[4, 20])
    assert np.all(np.isfinite(np.asarray(spectrum.log_sigma)))
    path = plot_decay_spectra(spectrum, str(tmp_path / "plots" / "decay.png"), title="layer 0")
    with open(path, "rb") as handle:
        header = handle.read(8)
    assert header == b"\x89PNG\r\n\x1a\n" and (tmp_path / "plots" / "decay.png").stat().st_size > 5000


def test_argument_errors():
    log_alpha, beta, keys = np.zeros((10, 2)), np.zeros((10, 2)), np.ones((10, 2, 3)) / np.sqrt(3)
    with pytest.raises(ValueError, match="keys must be"):
        transition_spectrum(log_alpha, beta, keys[:, 0], start=0, distances=[2])
    with pytest.raises(ValueError, match="beta must be"):
        transition_spectrum(log_alpha, beta[:, :1], keys, start=0, distances=[2])
    with pytest.raises(ValueError, match="distances"):
        transition_spectrum(log_alpha, beta, keys, start=3, distances=[7])   # 3 + 7 > 9
    with pytest.raises(ValueError, match="distances"):
        transition_spectrum(log_alpha, beta, keys, start=0, distances=[0])
    with pytest.raises(ValueError, match="start"):
        transition_spectrum(log_alpha, beta, keys, start=10, distances=[1])
    with pytest.raises(TypeError, match="beta"):
        transition_spectrum(log_alpha, beta.astype(int), keys, start=0, distances=[1])
