"""FPA's XLA field passes (mixer_kernels/mosaic_gpu/attention/fields.py) against
float64 loops over their definitions: the per-level prefix / suffix minima and masses, and the
spreading of per-level shares back over the positions."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from mixer_kernels.mosaic_gpu.attention import fields
from mixer_kernels.mosaic_gpu.attention.common import BIG
from tests.seeds import case_seed

# the passes compiled whole (op by op, each of their small ops would compile on its own)
level_stats = jax.jit(fields.level_stats, static_argnums=(1, 2))
spread_suffix = jax.jit(fields.spread_suffix, static_argnums=(3, 4))
spread_prefix = jax.jit(fields.spread_prefix, static_argnums=(3, 4))


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


@pytest.mark.parametrize("drift, tau", [(0.0, 1.0), (-40.0, 0.5), (25.0, 2.0)])
def test_level_stats_match_their_definition(drift, tau):
    rng = np.random.default_rng(case_seed(int(1000 + drift * 10 + tau * 100)))
    block = 16
    phi = _walk(rng, (2, 3, 48), drift)
    got = level_stats(jnp.asarray(phi, jnp.float32), block, tau)
    want = _direct_stats(phi, block, tau)
    for name, g, w in zip(("pre_min", "pre_mass", "suf_min", "suf_mass"), got, want):
        g = np.asarray(g, np.float64)
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-5 * (1 + abs(drift) * 48),
                                   err_msg=name)


@pytest.mark.parametrize("side", ["suffix", "prefix"])
def test_spreads_match_their_definition(side):
    rng = np.random.default_rng(case_seed(1 if side == "suffix" else 2))
    block, tau = 16, 0.7
    phi = _walk(rng, (2, 32), -3.0)
    pre_min, _, suf_min, _ = (np.asarray(x, np.float64) for x in
                              level_stats(jnp.asarray(phi, jnp.float32), block, tau))
    for level in range(fields.num_levels(block)):
        group = 1 << level
        share = rng.normal(size=phi.shape)
        want = np.zeros_like(phi)
        for u in range(phi.shape[-1]):
            start = u - u % group
            if side == "suffix":   # s < u in the group of u
                for s in range(start, u):
                    want[:, u] += share[:, s] * np.exp(-(phi[:, u] - suf_min[:, level, s]) / tau)
            else:                  # t >= u in the group of u
                for t in range(u, start + group):
                    want[:, u] += share[:, t] * np.exp(-(phi[:, u] - pre_min[:, level, t]) / tau)
        spread = spread_suffix if side == "suffix" else spread_prefix
        minima = suf_min if side == "suffix" else pre_min
        got = spread(jnp.asarray(share, jnp.float32), jnp.asarray(minima[:, level], jnp.float32),
                     jnp.asarray(phi, jnp.float32), group, tau)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"level {level}")
