"""The Mosaic GPU attention forward kernel (GPU interpret mode, races detected) against the dense
reference (out and lse): softmax, ALiBi, FoX, FPA with each switch, segments, drift, ties,
ragged T, bf16, head dim 128, and pruning on == off."""

import math

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from fpa_jax.baselines.flash_xla import dense_attention
from fpa_jax.fpa.reference import fpa_bias
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.attention.bias import FPABias, NoBias, SeparableBias
from mixer_kernels.mosaic_gpu.attention.forward import attention_forward
from tests.seeds import case_seed


def _qkv(rng, shape, dtype):
    return tuple(jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(3))


def _per_token(rng, shape):
    return jnp.asarray(rng.standard_normal(shape[:3]), jnp.float32)


def _dense_bias(bias, segment_ids):
    """[B, H, T, T] float32 bias of the reference (None for NoBias)."""
    if isinstance(bias, SeparableBias):
        row, col = jnp.moveaxis(bias.row, 1, 2), jnp.moveaxis(bias.col, 1, 2)
        return row[..., :, None] - col[..., None, :]
    if isinstance(bias, FPABias):
        return fpa_bias(bias.phi, bias.psi, bias.beta, segment_ids=segment_ids,
                        query_level=bias.query_level)
    return None


def _split(bias):
    """A bias's arrays (arguments of a jitted call) and its static fields."""
    arrays = {name: x for name, x in bias._asdict().items() if isinstance(x, jax.Array)}
    return arrays, {name: x for name, x in bias._asdict().items() if name not in arrays}


def _run(q, k, v, bias, scale, segment_ids=None, prune=True, stats=False):
    """The kernel's call compiled whole (op by op, its XLA preprocessing would compile each
    small op on its own); the bias's arrays and the segment ids are arguments, not constants,
    so the cases of one shape and the same static options compile one program."""
    arrays, static = _split(bias)

    def run(arrays, segment_ids, q, k, v):
        return attention_forward(q, k, v, type(bias)(**arrays, **static), scale=scale,
                                 segment_ids=segment_ids, prune=prune, return_stats=stats)

    interpret.reset()
    with interpret.gpu_interpret():
        result = jax.block_until_ready(jax.jit(run)(arrays, segment_ids, q, k, v))
    assert not interpret.races_found()
    return result


def _check(q, k, v, bias, segment_ids, out_tol, lse_tol, prune=True):
    scale = q.shape[-1] ** -0.5
    out, lse = _run(q, k, v, bias, scale, segment_ids, prune)

    arrays, static = _split(bias)

    @jax.jit
    def reference(arrays, segment_ids, q, k, v):
        bias_ = type(bias)(**arrays, **static)
        dense_q = q if not isinstance(bias_, FPABias) or bias_.content else jnp.zeros_like(q)
        return dense_attention(dense_q.astype(jnp.float32), k.astype(jnp.float32),
                               v.astype(jnp.float32), _dense_bias(bias_, segment_ids),
                               scale=scale, segment_ids=segment_ids)

    ref_out, ref_lse = reference(arrays, segment_ids, q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == jnp.float32
    assert np.isfinite(np.asarray(lse)).all()
    out32 = np.asarray(out, np.float64)
    err = np.linalg.norm(out32 - np.asarray(ref_out, np.float64)) / np.linalg.norm(ref_out)
    assert err < out_tol, err
    np.testing.assert_allclose(np.asarray(lse), np.swapaxes(np.asarray(ref_lse), 1, 2),
                               atol=lse_tol, rtol=lse_tol)
    return out, lse


def _segments(length, cuts):
    return jnp.asarray(np.searchsorted(np.asarray(cuts), np.arange(length), side="right")[None],
                       jnp.int32)


@pytest.mark.parametrize("case, length, dim, dtype, segmented", [
    (0, 1, 64, jnp.float32, False),        # T = 1
    (1, 70, 64, jnp.bfloat16, True),        # ragged T, two documents, bf16
    (2, 64, 128, jnp.float32, False),       # head dim 128
    (3, 64, 64, jnp.float16, False),        # fp16
])
def test_softmax_matches_reference(case, length, dim, dtype, segmented):
    rng = np.random.default_rng(case_seed(900 + case))
    q, k, v = _qkv(rng, (1, length, 1, dim), dtype)
    segment_ids = _segments(length, [length // 2]) if segmented else None
    tol = {jnp.bfloat16: 2e-2, jnp.float16: 3e-3}.get(dtype, 1e-5)
    _check(q, k, v, NoBias(), segment_ids, tol, tol)


def test_alibi_matches_reference():
    rng = np.random.default_rng(case_seed(910))
    length, heads = 130, 2
    q, k, v = _qkv(rng, (1, length, heads, 64), jnp.float32)
    slopes = jnp.asarray([0.5, 0.0625], jnp.float32)
    position = -jnp.arange(length, dtype=jnp.float32)[None, :, None] * slopes
    _check(q, k, v, SeparableBias(position, position), None, 1e-5, 1e-4)


def test_fox_drift_matches_reference():
    """log_forget drifting to about -1000 over the sequence: bias down to -1000 nats."""
    rng = np.random.default_rng(case_seed(920))
    length = 130
    q, k, v = _qkv(rng, (1, length, 1, 64), jnp.float32)
    log_forget = -jnp.asarray(rng.uniform(0.0, 15.0, (1, length, 1)), jnp.float32)
    c = jnp.cumsum(log_forget, axis=1)
    _check(q, k, v, SeparableBias(c, c), None, 1e-5, 1e-3)


@pytest.mark.parametrize("case, drift, query_level, content", [
    (0, 1000.0, False, True),     # walk rising to +1000, integer steps -> ties
    (1, -1000.0, True, True),     # walk falling to -1000, query level
    (2, 0.0, False, False),       # content off
])
def test_fpa_matches_reference(case, drift, query_level, content):
    """T = 200 (four blocks, ragged) as the next test: cases 0 and 2 share its programs."""
    rng = np.random.default_rng(case_seed(930 + case))
    length, heads = 200, 1
    q, k, v = _qkv(rng, (1, length, heads, 64), jnp.float32)
    steps = rng.integers(-2, 3, (1, length, heads)).astype(np.float32) + drift / length
    walk = np.cumsum(steps, axis=1)
    phi = jnp.asarray(walk + rng.integers(-1, 2, walk.shape), jnp.float32)  # ties
    psi = jnp.asarray(walk + rng.integers(-1, 2, walk.shape), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.2, 2.0, (heads,)), jnp.float32)
    bias = FPABias(phi, psi, beta, query_level=query_level, content=content)
    _check(q, k, v, bias, None, 1e-5, 1e-3 * (1 + abs(drift) / 100))


@pytest.mark.parametrize("content", [True, False])
def test_fpa_tiles_without_dead_keys_match_reference(content):
    """One row (T = 200, four blocks) with a flat stretch (no key dies: those off-diagonal
    tiles skip the bias), a small walk (keys die) and a 300-nat cliff; with and without the
    content term (then the unbiased tiles' logits are all 0)."""
    rng = np.random.default_rng(case_seed(945 + content))
    length = 200
    q, k, v = _qkv(rng, (1, length, 1, 64), jnp.float32)
    steps = np.concatenate([np.zeros((1, 70, 1)), 0.3 * rng.standard_normal((1, 80, 1)),
                            np.full((1, 1, 1), -300.0), 0.3 * rng.standard_normal((1, 49, 1))],
                           axis=1)
    phi = jnp.asarray(np.cumsum(steps, axis=1), jnp.float32)
    psi = phi + jnp.where(jnp.arange(length)[None, :, None] < 70, 0.0, 0.5)
    bias = FPABias(phi, psi, jnp.array([0.8], jnp.float32), content=content)
    _check(q, k, v, bias, None, 1e-5, 1e-3)


def test_fpa_segments_bf16_matches_reference():
    rng = np.random.default_rng(case_seed(940))
    length = 150
    q, k, v = _qkv(rng, (1, length, 1, 64), jnp.bfloat16)
    phi = jnp.cumsum(_per_token(rng, q.shape), axis=1)
    psi = phi + _per_token(rng, q.shape)
    bias = FPABias(phi, psi, jnp.asarray([0.8], jnp.float32))
    _check(q, k, v, bias, _segments(length, [20, 90]), 2e-2, 2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("kind, cut, tiles", [("fpa", None, 6), ("fox", 100, 4)])
def test_pruning_on_equals_off(kind, cut, tiles):
    """Strongly decaying biases prune most off-diagonal tiles without changing the result
    (FoX with two documents: tiles before a block's first document start are not visited)."""
    rng = np.random.default_rng(case_seed(950 + (kind == "fox")))
    length = 256
    q, k, v = _qkv(rng, (1, length, 1, 64), jnp.float32)
    if kind == "fpa":
        walk = jnp.cumsum(-0.5 + 0.1 * _per_token(rng, q.shape), axis=1)
        bias = FPABias(walk + 0.1 * _per_token(rng, q.shape), walk, jnp.asarray([1.0]))
    else:
        c = jnp.cumsum(-0.5 + 0.1 * _per_token(rng, q.shape), axis=1)
        bias = SeparableBias(c, c)
    scale = 64 ** -0.5
    segment_ids = None if cut is None else _segments(length, [cut])
    out_on, lse_on, stats = _run(q, k, v, bias, scale, segment_ids, prune=True, stats=True)
    out_off, lse_off = _run(q, k, v, bias, scale, segment_ids, prune=False)
    assert float(stats["pruned_tiles"]) > 0
    assert float(stats["pruned_tiles"]) <= float(stats["tiles"]) == tiles
    np.testing.assert_allclose(np.asarray(out_on), np.asarray(out_off), atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse_on), np.asarray(lse_off), atol=1e-5)


def test_pruning_margin_bound_is_stated():
    from mixer_kernels.mosaic_gpu.attention.forward import pruning_margin
    assert pruning_margin(4096) == pytest.approx(10.0 + math.log(4096))


@pytest.mark.parametrize("dim, block, match", [(96, 64, "head dim"), (64, 128, "block")])
def test_unsupported_arguments_raise(dim, block, match):
    q = jnp.zeros((1, 8, 1, dim), jnp.bfloat16)
    with pytest.raises(ValueError, match=match):
        attention_forward(q, q, q, scale=1.0, block=block)
