"""FPA's soft-minimum numerics (mixer_core/soft_min.py): BIG, a finite stand-in for +inf in
minima, and decay(excess, tau) = exp(-excess / tau) for excess >= 0, 1 for negative excess,
against numpy and scipy's logsumexp (the soft minimum written through a hard minimum), at
extreme values and on masked entries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_core.soft_min import BIG, decay
from tests.seeds import case_seed


def assert_decay_close(got, excess, tau):
    """float32 rounds the exponent x = excess / tau relatively, so exp(-x) is good to about
    x ulps; below float32's smallest normal number XLA may flush to zero."""
    x = np.asarray(excess, np.float64) / np.asarray(tau, np.float64)
    expected = np.exp(-x)
    error = np.abs(np.asarray(got, np.float64) - expected)
    bound = 3e-7 * (1 + x) * expected + np.finfo(np.float32).tiny
    assert np.all(error <= bound), np.max(error / bound)


def test_decay_is_exp_of_minus_excess_over_tau():
    rng = np.random.default_rng(case_seed(5300))
    excess = rng.exponential(3.0, (4, 33)).astype(np.float32)
    tau = rng.uniform(0.05, 4.0, (4, 1)).astype(np.float32)       # one per row, broadcast
    got = decay(jnp.asarray(excess), jnp.asarray(tau))
    assert got.shape == (4, 33) and got.dtype == jnp.float32
    assert_decay_close(got, excess, tau)
    for scalar_tau in (0.25, 1.0, 7.0):                              # a Python float tau
        assert_decay_close(decay(jnp.asarray(excess), scalar_tau), excess, scalar_tau)
    assert float(decay(0.0, 0.3)) == 1.0
    assert float(decay(1.0, 1.0)) == pytest.approx(np.exp(-1.0), rel=1e-6)
    assert float(decay(2.0, 0.5)) == pytest.approx(np.exp(-4.0), rel=1e-6)    # not exp(-1)


def test_negative_excess_and_masked_garbage_give_one_and_extremes_stay_finite():
    excess = jnp.asarray([-1e-3, -1.0, -1000.0, -BIG, -jnp.inf, 1000.0, BIG, jnp.inf, 0.0],
                         jnp.float32)
    for tau in (1e-3, 1.0, 5.0):
        got = np.asarray(decay(excess, tau))
        np.testing.assert_array_equal(got, [1, 1, 1, 1, 1, 0, 0, 0, 1])
        grad = np.asarray(jax.vmap(jax.grad(decay), in_axes=(0, None))(excess, tau))
        assert np.all(np.isfinite(grad)), (tau, grad)
        np.testing.assert_array_equal(grad[:5], 0.0)       # clamped: no dependence on garbage
    # bf16 and fp16 stay in their dtype and do not overflow
    for dtype in (jnp.bfloat16, jnp.float16):
        got = decay(excess.astype(dtype), 0.5)
        assert got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), [1, 1, 1, 1, 1, 0, 0, 0, 1])


def test_decay_gradient_away_from_the_clamp():
    rng = np.random.default_rng(case_seed(5301))
    excess = jnp.asarray(rng.uniform(0.01, 5.0, 16), jnp.float32)
    tau = float(rng.uniform(0.2, 3.0))
    grad = jax.vmap(jax.grad(decay), in_axes=(0, None))(excess, tau)
    np.testing.assert_allclose(grad, -np.exp(-np.asarray(excess, np.float64) / tau) / tau,
                               rtol=2e-5)
    grad = jax.vmap(jax.grad(decay), in_axes=(0, None))(-excess, tau)
    np.testing.assert_array_equal(grad, 0.0)


def soft_min(phi, tau):
    """-tau log sum exp(-phi / tau) through the hard minimum, as FPA's passes write it; BIG
    marks masked entries."""
    hard = jnp.min(phi, axis=-1, keepdims=True)
    return hard[..., 0] - tau * jnp.log(jnp.sum(decay(phi - hard, tau), axis=-1))


@pytest.mark.parametrize("drift", [0.0, 1000.0, -1000.0])
def test_soft_minimum_through_the_hard_minimum_matches_logsumexp(drift):
    """Drifted by +-1000, -phi / tau would overflow exp; the weights relative to the hard
    minimum do not."""
    from scipy.special import logsumexp

    rng = np.random.default_rng(case_seed(5302))
    tau = 0.1
    phi = rng.standard_normal((5, 17)) + drift
    phi[1, :] = phi[1, 0]                                   # ties: -tau log 17 below them
    got = soft_min(jnp.asarray(phi, jnp.float32), tau)
    expected = -tau * logsumexp(-np.asarray(phi, np.float32).astype(np.float64) / tau, axis=-1)
    atol = 4 * float(np.spacing(np.float32(abs(drift) + 8))) + 1e-6      # a few float32 ulps
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)
    np.testing.assert_allclose(got[1], np.float32(phi[1, 0]) - tau * np.log(17), rtol=0,
                               atol=atol)
    assert np.all(np.asarray(got) <= np.asarray(phi, np.float32).min(-1) + atol)


def test_big_masks_entries_without_inf_minus_inf():
    """BIG entries weigh nothing beside a real one; a row of BIG alone has soft minimum BIG (no
    nan, as inf - inf would give); one entry (T = 1) is its own soft minimum."""
    phi = jnp.asarray([[0.5, BIG, 2.0, BIG], [BIG, BIG, BIG, BIG], [3.0, BIG, BIG, BIG]],
                      jnp.float32)
    got = np.asarray(soft_min(phi, 0.7))
    expected = 0.5 - 0.7 * np.log(1 + np.exp(-1.5 / 0.7))
    np.testing.assert_allclose(got[0], expected, rtol=1e-6)
    assert got[1] == np.float32(BIG) and got[2] == 3.0
    assert np.isfinite(np.float32(BIG)) and BIG - BIG == 0.0
    np.testing.assert_array_equal(decay(phi - phi.min(-1, keepdims=True), 0.7)[1], 1.0)
    one = jnp.asarray([[-1000.0], [1000.0], [0.0]], jnp.float32)
    np.testing.assert_array_equal(soft_min(one, 0.3), [-1000.0, 1000.0, 0.0])
