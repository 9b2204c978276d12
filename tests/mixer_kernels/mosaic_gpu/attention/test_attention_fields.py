"""FPA's XLA field passes (mixer_kernels/mosaic_gpu/attention/fields.py), in both of their
FIELD_PASSES forms, against float64 loops over their definitions: the per-level prefix / suffix
minima and masses, and the spreading of per-level shares back over the positions."""

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.attention import fields
from mixer_kernels.mosaic_gpu.attention.common import BIG
from tests.seeds import case_seed

PASSES = ("by_level", "all_levels")


# The passes compiled whole (op by op, each of their small ops would compile on its own).
# `passes` keys jit's cache; each test sets fields.FIELD_PASSES to it before calling.
@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def level_stats(phi, block, tau, passes):
    return fields.level_stats(phi, block, tau)


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
def spread_levels(share, minima, phi, block, tau, side, passes):
    return fields.spread_levels(share, minima, phi, block, tau, side)


def _walk(rng, shape, drift):
    steps = rng.normal(size=shape) + drift
    steps[..., 5:9] = 0.0   # ties
    return np.cumsum(steps, axis=-1)


def _direct_stats(phi, block, tau):
    """[..., Lv, T] float64 by definition: per group of 2^L positions, the inclusive prefix and
    exclusive suffix minima and their soft-min masses."""
    levels = fields.num_levels(block)
    out = np.zeros((4,) + phi.shape[:-1] + (levels, phi.shape[-1]))
    for level in range(levels):
        group = 1 << level
        for t in range(phi.shape[-1]):
            start, end = t - t % group, t - t % group + group
            pre = phi[..., start:t + 1]
            low = pre.min(-1)
            out[0, ..., level, t] = low
            out[1, ..., level, t] = np.exp(-(pre - low[..., None]) / tau).sum(-1)
            suf = phi[..., t + 1:end]
            if suf.shape[-1]:
                low = suf.min(-1)
                out[2, ..., level, t] = low
                out[3, ..., level, t] = np.exp(-(suf - low[..., None]) / tau).sum(-1)
            else:
                out[2, ..., level, t] = BIG
    return out


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("drift, tau", [(0.0, 1.0), (-40.0, 0.5), (25.0, 2.0)])
def test_level_stats_match_their_definition(drift, tau, passes, monkeypatch):
    monkeypatch.setattr(fields, "FIELD_PASSES", passes)
    rng = np.random.default_rng(case_seed(int(1000 + drift * 10 + tau * 100)))
    block = 16
    phi = _walk(rng, (2, 3, 48), drift)
    got = level_stats(jnp.asarray(phi, jnp.float32), block, tau, passes)
    want = _direct_stats(phi, block, tau)
    for name, g, w in zip(("pre_min", "pre_mass", "suf_min", "suf_mass"), got, want):
        g = np.asarray(g, np.float64)
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-5 * (1 + abs(drift) * 48),
                                   err_msg=name)


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("side", ["suffix", "prefix"])
def test_spreads_match_their_definition(side, passes, monkeypatch):
    monkeypatch.setattr(fields, "FIELD_PASSES", passes)
    rng = np.random.default_rng(case_seed(1 if side == "suffix" else 2))
    block, tau = 16, 0.7
    phi = _walk(rng, (2, 32), -3.0)
    pre_min, _, suf_min, _ = (np.asarray(x, np.float64) for x in
                              level_stats(jnp.asarray(phi, jnp.float32), block, tau, passes))
    minima = suf_min if side == "suffix" else pre_min
    levels = fields.num_levels(block)
    share = rng.normal(size=(2, levels, phi.shape[-1]))
    want = np.zeros_like(phi)
    for level in range(levels):
        group = 1 << level
        for u in range(phi.shape[-1]):
            start = u - u % group
            pieces = range(start, u) if side == "suffix" else range(u, start + group)
            for s in pieces:   # s < u (suffix) or t >= u (prefix) in the group of u
                want[:, u] += share[:, level, s] * np.exp(-(phi[:, u] - minima[:, level, s])
                                                          / tau)
    got = spread_levels(jnp.asarray(share, jnp.float32), jnp.asarray(minima, jnp.float32),
                        jnp.asarray(phi, jnp.float32), block, tau, side, passes)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow   # the non-default form: the full suite runs it
def test_backward_gradients_agree_under_both_field_passes(monkeypatch):
    """FPA's compiled-path backward (GPU interpreter) gives the same gradients whichever form
    forms its field statistics and spreads (up to float32 summation order)."""
    from tests.mixer_kernels.mosaic_gpu.attention.schedule_cases import (backward_case,
                                                                          interpreted_gradients)
    args, bias, segment_ids = backward_case(case_seed(7), "fpa")
    grads = {}
    for passes in PASSES:
        monkeypatch.setattr(fields, "FIELD_PASSES", passes)
        grads[passes] = interpreted_gradients(args, bias, segment_ids, prune=True)
    for a, b in zip(*grads.values()):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * max(float(np.abs(a).max()), 1e-6))
