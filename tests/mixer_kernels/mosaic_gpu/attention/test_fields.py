"""FPA's field passes (mixer_kernels/mosaic_gpu/attention/fields.py), in their XLA forms and in
the field kernels (fields_kernels.py, GPU interpreter), against float64 loops over their
definitions: the per-level prefix / suffix minima and masses, and the spreading of per-level
shares back over the positions."""

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from mixer_core.interpret import gpu_interpret
from mixer_kernels.mosaic_gpu.attention import fields, fields_kernels
from mixer_kernels.mosaic_gpu.attention.common import BIG, BLOCK
from tests.seeds import case_seed

PASSES = ("by_level", "all_levels")   # the XLA forms


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


@functools.partial(jax.jit, static_argnums=(1, 2))
def _kernel_stats(phi, tau, masses):
    stats = fields_kernels.level_stats_pack(phi, BLOCK, tau, masses)
    return [[fields_kernels.stats_from_pack(stats, kind, level, BLOCK)
             for level in range(fields.num_levels(BLOCK))]
            for kind in fields_kernels.stat_kinds(masses)]


@pytest.mark.parametrize("masses", [True, False])
@pytest.mark.parametrize("drift, tau", [(0.0, 1.0), (-1000.0, 0.5), (300.0, 2.0)])
def test_stats_kernel_matches_the_definition(drift, tau, masses):
    """Every level's minima (exact: a minimum does not round) and masses, at drifts of
    hundreds of tau (every exponent stays <= 0), with ties; without masses the minima only."""
    rng = np.random.default_rng(case_seed(int(2000 + drift + tau * 10 + masses)))
    phi = _walk(rng, (1, 2, 2 * BLOCK), drift)
    with gpu_interpret():
        got = _kernel_stats(jnp.asarray(phi, jnp.float32), tau, masses)
    want = _direct_stats(np.asarray(jnp.asarray(phi, jnp.float32), np.float64), BLOCK, tau)
    for kind, per_level in zip(fields_kernels.stat_kinds(masses), got):
        w = want[fields_kernels.KINDS.index(kind)]
        g = np.stack([np.asarray(x, np.float64) for x in per_level], axis=-2)
        if kind.endswith("min"):
            np.testing.assert_array_equal(g, w.astype(np.float32), err_msg=kind)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=kind)


def _stats_pack(phi, tau, source):
    """The stats pack the spread kernel reads: the stats kernel's with or without masses
    ("kernels"), or the XLA levels' minima ("spread_kernel")."""
    if source == "xla_minima":
        return fields.minima_pack(fields.level_stats(phi, BLOCK, tau), BLOCK)
    return fields_kernels.level_stats_pack(phi, BLOCK, tau, source == "kernel_masses")


def test_minima_pack_is_the_stats_kernels_pack_without_masses():
    """fields.minima_pack (FIELD_PASSES "spread_kernel") lays the XLA levels' minima out as the
    stats kernel does without masses, bit for bit (a minimum does not round)."""
    rng = np.random.default_rng(case_seed(35))
    phi = jnp.asarray(_walk(rng, (1, 2, 2 * BLOCK), -3.0), jnp.float32)
    want = jax.jit(lambda p: _stats_pack(p, 1.0, "xla_minima"))(phi)
    with gpu_interpret():
        got = jax.jit(lambda p: _stats_pack(p, 1.0, "kernel_minima"))(phi)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.slow   # FIELD_PASSES = "kernels" / "spread_kernel", not the default
@pytest.mark.parametrize("source", ["kernel_masses", "kernel_minima", "xla_minima"])
def test_spread_kernel_matches_the_xla_passes(source):
    """The level spreads of both sides from the shares pack equal the XLA form's (which the
    test above checks against the definition), whichever pack gives the kernel its minima;
    drift -200 keeps the exponents' clamps busy."""
    rng = np.random.default_rng(case_seed(31 + len(source)))
    tau, levels = 0.7, fields.num_levels(BLOCK)
    batch, heads, length = 1, 2, 2 * BLOCK
    phi = jnp.asarray(_walk(rng, (batch, heads, length), -200.0 / length), jnp.float32)
    col_share, row_share = (jnp.asarray(rng.normal(size=(batch, heads, levels, length)),
                                        jnp.float32) for _ in range(2))
    blocks = lambda x: jnp.moveaxis(x.reshape(batch, heads, levels, -1, BLOCK), 3, 2)
    want = np.asarray(_xla_spreads(col_share, row_share, phi, tau, fields.FIELD_PASSES))
    with gpu_interpret():
        got = jax.jit(lambda c, r, p: fields_kernels.spread_pack(
            jnp.concatenate([blocks(c), blocks(r)], axis=3), _stats_pack(p, tau, source), p,
            BLOCK, tau))(col_share, row_share, phi)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5,
                               atol=1e-5 * float(np.abs(want).max()))


# The XLA form's spreads of both sides compiled whole (op by op, its small ops compiled one by
# one: about 200 compilations); `passes` (fields.FIELD_PASSES) keys jit's cache.
@functools.partial(jax.jit, static_argnums=(3, 4))
def _xla_spreads(col_share, row_share, phi, tau, passes):
    pre_min, _, suf_min, _ = fields.level_stats(phi, BLOCK, tau)
    return (fields.spread_levels(col_share, suf_min, phi, BLOCK, tau, "suffix")
            + fields.spread_levels(row_share, pre_min, phi, BLOCK, tau, "prefix"))


@pytest.mark.slow   # the non-default forms: the full suite runs it
def test_backward_gradients_agree_under_every_field_pass_form(monkeypatch):
    """FPA's compiled-path backward (GPU interpreter) gives the same gradients whichever form
    (the field kernels or an XLA form) forms its field statistics and spreads (up to float32
    summation order)."""
    from tests.mixer_kernels.mosaic_gpu.attention.schedule_cases import (backward_case,
                                                                          interpreted_gradients)
    args, bias, segment_ids = backward_case(case_seed(7), "fpa")
    grads = {}
    for passes in fields.PASSES:
        monkeypatch.setattr(fields, "FIELD_PASSES", passes)
        grads[passes] = interpreted_gradients(args, bias, segment_ids, prune=True)
    reference = grads.pop("by_level")
    for form, got in grads.items():
        for a, b in zip(reference, got):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * max(float(np.abs(a).max()), 1e-6),
                                       err_msg=form)


@pytest.mark.parametrize("passes", ["kernels", "spread_kernel"])
def test_field_kernels_lower_for_hopper(passes, monkeypatch):
    """"kernels": the statistics (forward: minima only; backward: with masses) and the spread
    lower as Mosaic GPU kernels, three custom calls of their own in the op's forward and
    backward; "spread_kernel": the backward's spread alone."""
    from tests.mixer_kernels.mosaic_gpu.attention.schedule_cases import backward_case
    from mixer_kernels.mosaic_gpu.attention.backward import attention_backward
    from mixer_kernels.mosaic_gpu.attention.forward import attention_forward
    monkeypatch.setattr(fields, "FIELD_PASSES", passes)
    args, bias, segment_ids = backward_case(0, "fpa")
    args = tuple(x.astype(jnp.bfloat16) if x.ndim == 4 else x for x in args)
    lower = lambda fn, *a: jax.jit(fn).trace(*a).lower(lowering_platforms=("cuda",)).as_text()
    forward = lower(lambda q, k, v: attention_forward(q, k, v, bias, scale=0.125,
                                                      segment_ids=segment_ids), *args[:3])
    backward = lower(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                   segment_ids=segment_ids), *args)
    stats = passes == "kernels"
    assert ("fpa_field_stats" in forward) == stats and "fpa_field_spread" not in forward
    assert ("fpa_field_stats" in backward) == stats and "fpa_field_spread" in backward
