"""Pallas Mosaic GPU attention backward kernels in the GPU interpreter vs dense autodiff.

Every case: out and lse from the dense oracle, one call of `attention_backward`, gradients
compared with jax.vjp of the dense reference (the oracle every path must match), no race
reported by the interpreter. Shapes are tiny (the interpreter is slow); float32 on CPU except
the bf16 precision test (the 5e-3 bar of docs/benchmarks.md).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines import flash_xla
from fpa_jax.fpa.reference import fpa_attention_reference, fpa_bias
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.attention.backward import (FPABias, NoBias, SeparableBias,
                                               attention_backward)
from tests.seeds import case_seed


# Inputs are drawn and formed with NumPy: jax.random and op-by-op jnp compile programs per shape.

def _qkv(seed, shape, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape, np.float32).astype(dtype))
                 for _ in range(4))


def _log_forget(seed, shape, shift):
    """log sigmoid(x + shift), x standard normal."""
    x = np.random.default_rng(seed).standard_normal(shape, np.float32)
    return jnp.asarray(-np.logaddexp(np.float32(0), -(x + np.float32(shift))))


def _oracle(fn, args, dout):
    """(out, aux) = fn(*args) and the vjp of out at dout, as one compiled program (op by op,
    the dense oracle would compile each of its many small ops on its own)."""
    def run(args, dout):
        out, vjp, aux = jax.vjp(fn, *args, has_aux=True)
        return out, aux, vjp(dout)
    return jax.jit(run)(args, dout)


def _segments(batch, length, seed):
    """Two or three contiguous documents per row, cut at random places."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, length), np.int32)
    for row in range(batch):
        for cut in sorted(rng.integers(1, max(length, 2), size=2)):
            ids[row, cut:] += 1
    return jnp.asarray(ids)


def _lse(logits):
    """Dense logits [B, H, T, T] (-inf masked) -> lse [B, H, T]."""
    return jax.nn.logsumexp(logits, axis=-1)


def _run_kernel(q, k, v, out, lse, dout, bias, scale, segment_ids):
    """The bias's arrays and the segment ids are arguments of the jitted call, not constants of
    its program: cases of one shape and the same static options compile one program."""
    arrays = {name: x for name, x in bias._asdict().items() if isinstance(x, jax.Array)}
    static = {name: x for name, x in bias._asdict().items() if name not in arrays}

    def run(arrays, segment_ids, *args):
        return attention_backward(*args, bias=type(bias)(**arrays, **static), scale=scale,
                                  segment_ids=segment_ids)

    interpret.reset()
    with interpret.gpu_interpret():
        grads = jax.block_until_ready(jax.jit(run)(arrays, segment_ids, q, k, v, out, lse,
                                                   dout))
    assert not interpret.races_found()
    return grads


def _close(got, want, rtol, name):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), f"{name}: non-finite"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-2 * np.sqrt(want.size))
    assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


def _separable_dense(q, k, v, row, col, scale, segment_ids):
    bias = jnp.moveaxis(row, 1, 2)[..., :, None] - jnp.moveaxis(col, 1, 2)[..., None, :]
    return flash_xla.dense_attention(q, k, v, bias, scale=scale, segment_ids=segment_ids)


@pytest.mark.parametrize("length, heads, segments, head_dim", [(1, 1, False, 64),
                                                               (70, 2, True, 128)])
def test_softmax_gradients(length, heads, segments, head_dim):
    seed = case_seed(100 + length)
    q, k, v, dout = _qkv(seed, (1, length, heads, head_dim))
    segment_ids = _segments(1, length, seed) if segments else None
    scale = 0.125
    fn = lambda q, k, v: flash_xla.dense_attention(q, k, v, scale=scale,
                                                   segment_ids=segment_ids)
    out, lse, want = _oracle(fn, (q, k, v), dout)
    dq, dk, dv, extra = _run_kernel(q, k, v, out, jnp.moveaxis(lse, 1, 2), dout, NoBias(),
                                    scale, segment_ids)
    assert extra == ()
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        _close(g, w, 1e-4, name)


@pytest.mark.parametrize("kind", ["fox", pytest.param("alibi", marks=pytest.mark.slow)])
def test_separable_gradients(kind):
    seed = case_seed(200 + len(kind))
    batch, length, heads = 2, 150, 2
    q, k, v, dout = _qkv(seed, (batch, length, heads, 64))
    segment_ids = _segments(batch, length, seed) if kind == "fox" else None
    if kind == "fox":
        log_forget = _log_forget(seed + 1, (batch, length, heads), 1.0)
        row = col = jnp.cumsum(log_forget, axis=1)
    else:
        slopes = jnp.array([0.5, 0.0625])
        row = col = jnp.broadcast_to(-jnp.arange(length, dtype=jnp.float32)[:, None] * slopes,
                                     (batch, length, heads))
    scale = 64 ** -0.5
    fn = lambda q, k, v, r, c: _separable_dense(q, k, v, r, c, scale, segment_ids)
    out, lse, want = _oracle(fn, (q, k, v, row, col), dout)
    dq, dk, dv, (drow, dcol) = _run_kernel(q, k, v, out, jnp.moveaxis(lse, 1, 2), dout,
                                           SeparableBias(row, col), scale, segment_ids)
    for name, g, w in zip(("dq", "dk", "dv", "dcol"), (dq, dk, dv, dcol), want[:3] + want[4:]):
        _close(g, w, 1e-4, name)
    # sum_s dS_ts is zero up to rounding: compare the total bias gradient, as FoX uses it
    _close(drow + dcol, want[3] + want[4], 1e-4, "drow + dcol")


FPA_CASES = {
    # name: (B, T, H, D, drift, ties, segments, query_level, content, tau)
    "one_step": (1, 1, 1, 64, 1.0, False, False, False, True, 1.0),
    "ragged_gap": (1, 150, 1, 64, 1.0, False, True, False, True, 1.0),
    "drift_ties_query_level_no_content": (1, 128, 1, 64, 1000.0, True, False, True, False, 0.5),
    "drift_ties_dim128": (1, 100, 1, 128, -1000.0, True, False, False, True, 1.0),
}
SLOW_FPA_CASES = ("one_step", "drift_ties_dim128")    # the local loop keeps the other two


def _fpa_inputs(seed, batch, length, heads, drift, ties):
    rng = np.random.default_rng(seed)
    steps = rng.standard_normal((batch, length, heads), np.float32)
    if ties:
        steps = np.round(steps)  # repeated field values and exact level ties
    phi = (np.cumsum(steps, axis=1)
           + np.float32(drift) * np.linspace(-1.0, 1.0, length, dtype=np.float32)[None, :, None])
    offsets = rng.standard_normal(phi.shape, np.float32)
    psi = phi + (np.round(offsets) if ties else offsets)
    beta = np.float32(0.3) + rng.uniform(size=heads).astype(np.float32)
    return jnp.asarray(phi), jnp.asarray(psi), jnp.asarray(beta)


@pytest.mark.parametrize("case", [pytest.param(name, marks=pytest.mark.slow)
                                  if name in SLOW_FPA_CASES else name for name in FPA_CASES])
def test_fpa_gradients(case):
    batch, length, heads, dim, drift, ties, segments, query_level, content, tau = FPA_CASES[case]
    seed = case_seed(300 + list(FPA_CASES).index(case))
    q, k, v, dout = _qkv(seed, (batch, length, heads, dim))
    phi, psi, beta = _fpa_inputs(seed + 7, batch, length, heads, drift, ties)
    segment_ids = _segments(batch, length, seed) if segments else None
    scale = dim ** -0.5
    options = dict(scale=scale, tau=tau, segment_ids=segment_ids, query_level=query_level,
                   content=content)

    out, lse, want, rounding = _fpa_oracle(q, k, v, phi, psi, beta, dout, **options)
    bias = FPABias(phi, psi, beta, tau=tau, query_level=query_level, content=content)
    got = _run_kernel(q, k, v, out, lse, dout, bias, scale, segment_ids)
    if not content:
        for name, g in zip(("dq", "dk"), got[:2]):
            assert np.all(np.asarray(g) == 0.0), name
    _assert_fpa_close(got[:3] + tuple(got[3]), want, rounding, skip=() if content else (0, 1))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.bfloat16])  # float16 rounds finer: bf16 is the bar
def test_fox_half_precision_log_forget(dtype):
    """The FoX backward kernels in half precision: d log_forget (the reverse cumulative sum of
    the row and column bias gradients) and dq, dk, dv within 5e-3 of float32 from the same
    rounded inputs."""
    seed = case_seed(400)
    batch, length, heads = 1, 128, 2
    q, k, v, dout = _qkv(seed, (batch, length, heads, 64), dtype)
    log_forget = _log_forget(seed + 1, (batch, length, heads), 2.0)
    scale = 64 ** -0.5

    def grads(q, k, v, dout, run):
        c = jnp.cumsum(log_forget, axis=1)
        out, lse = flash_xla.flash_attention(q, k, v, row_bias=c, col_bias=c, scale=scale)
        dq, dk, dv, (drow, dcol) = run(q, k, v, out, jnp.moveaxis(lse, 1, 2), dout,
                                       SeparableBias(c, c), scale, None)
        dlf = jnp.flip(jnp.cumsum(jnp.flip(drow + dcol, 1), 1), 1)
        return dq, dk, dv, dlf

    def dense(q, k, v, out, lse, dout, bias, scale, segment_ids):
        fn = lambda q, k, v, r, c: _separable_dense(q, k, v, r, c, scale, segment_ids)[0]
        _, vjp = jax.vjp(fn, q, k, v, bias.row, bias.col)
        dq, dk, dv, drow, dcol = vjp(dout)
        return dq, dk, dv, (drow, dcol)

    got = grads(q, k, v, dout, _run_kernel)
    f32 = tuple(x.astype(jnp.float32) for x in (q, k, v, dout))
    want = jax.jit(lambda *a: grads(*a, dense))(*f32)   # the float32 oracle: one program
    for name, g, w in zip(("dq", "dk", "dv", "dlog_forget"), got, want):
        _close(g, w, 5e-3, name)


@pytest.mark.slow
def test_pruning_skips_tiles_without_changing_gradients(monkeypatch):
    """Strong forgetting: the forward's pruning test skips far tiles; gradients stay within
    float32 rounding of the unpruned ones. With the margin forced to -inf every off-diagonal
    tile is skipped and the gradients change (the skip path is really taken)."""
    from mixer_kernels.mosaic_gpu.attention import backward as backward_module
    seed = case_seed(600)
    batch, length, heads = 1, 130, 1  # 3 blocks, ragged: tile (2, 0) lies 64+ steps back
    q, k, v, dout = _qkv(seed, (batch, length, heads, 64))
    segment_ids = _segments(batch, length, seed)
    c = jnp.cumsum(jnp.full((batch, length, heads), -0.6), axis=1)
    scale = 64 ** -0.5
    out, lse = jax.jit(lambda q, k, v, c: _separable_dense(q, k, v, c, c, scale,
                                                           segment_ids))(q, k, v, c)
    lse = jnp.moveaxis(lse, 1, 2)

    def run(prune):
        interpret.reset()
        with interpret.gpu_interpret():
            fn = jax.jit(lambda *a: attention_backward(*a, bias=SeparableBias(c, c), scale=scale,
                                                       segment_ids=segment_ids, prune=prune))
            grads = jax.block_until_ready(fn(q, k, v, out, lse, dout))
        assert not interpret.races_found()
        return grads[:3] + grads[3]

    full, pruned = run(False), run(True)
    for name, g, w in zip(("dq", "dk", "dv", "drow", "dcol"), pruned, full):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)
    monkeypatch.setattr(backward_module, "pruning_margin", lambda length: -1e30)
    everything = run(True)
    assert np.linalg.norm(everything[0] - full[0]) > 1e-2 * np.linalg.norm(full[0])


def test_bad_inputs_name_the_argument():
    q = jnp.zeros((1, 8, 1, 64))
    lse = jnp.zeros((1, 1, 8))
    with pytest.raises(ValueError, match="head dim"):
        small = jnp.zeros((1, 8, 1, 32))
        attention_backward(small, small, small, small, lse, small, scale=1.0)
    with pytest.raises(ValueError, match="lse"):
        attention_backward(q, q, q, q, jnp.zeros((1, 8, 1)), q, scale=1.0)
    with pytest.raises(ValueError, match="SeparableBias.row"):
        attention_backward(q, q, q, q, lse, q, SeparableBias(jnp.zeros((1, 7, 1)),
                                                             jnp.zeros((1, 8, 1))), scale=1.0)
    with pytest.raises(ValueError, match=r"norms: expected shape \(1, 1, 1, 3\)"):
        attention_backward(q, q, q, q, lse, q, scale=1.0, norms=jnp.zeros((1, 1, 2, 3)))


def _fpa_oracle(q, k, v, phi, psi, beta, dout, *, scale, tau=1.0, segment_ids=None,
                query_level=False, content=True):
    """The dense reference's out, lse [B, H, T] and gradients of (q, k, v, phi, psi, beta), and
    dbeta's float32 rounding scale: dbeta = sum_ts dS_ts dip_ts is one sum over every pair
    whose terms cancel (sum_s dS_ts = 0), often to 1e-4 of sum_ts |dS_ts dip_ts|, so a float32
    sum of it is exact only to eps * sum_ts |dS_ts dip_ts| per head. One compiled program."""
    options = dict(tau=tau, segment_ids=segment_ids, query_level=query_level)

    def fn(q, k, v, phi, psi, beta):
        dip = fpa_bias(phi, psi, jnp.ones_like(beta), **options)
        logits = beta[None, :, None, None] * dip
        if content:
            logits = logits + scale * jnp.einsum("bthd,bshd->bhts", q, k)
        out = fpa_attention_reference(q, k, v, phi, psi, beta, scale=scale, content=content,
                                      **options)
        return out, (_lse(logits), logits, dip)

    def run(args, dout):
        out, vjp, (lse, logits, dip) = jax.vjp(fn, *args, has_aux=True)
        weights = jax.nn.softmax(logits, axis=-1)
        dweights = jnp.einsum("bthd,bshd->bhts", dout, args[2])
        dlogits = weights * (dweights - jnp.sum(weights * dweights, -1, keepdims=True))
        terms = jnp.where(jnp.isfinite(dip), jnp.abs(dlogits * dip), 0.0)
        return out, lse, vjp(dout), jnp.finfo(jnp.float32).eps * jnp.sum(terms, (0, 2, 3))

    return jax.jit(run)((q, k, v, phi, psi, beta), dout)


def _fpa_case(seed, length, phi, psi, dim=64):
    """Kernel gradients, the dense oracle's and dbeta's rounding scale for fields phi, psi
    [1, length, 1]."""
    q, k, v, dout = _qkv(seed, (1, length, 1, dim))
    beta = jnp.array([0.7])
    scale = dim ** -0.5
    out, lse, want, rounding = _fpa_oracle(q, k, v, phi, psi, beta, dout, scale=scale)
    dq, dk, dv, (dphi, dpsi, dbeta) = _run_kernel(q, k, v, out, lse, dout,
                                                  FPABias(phi, psi, beta), scale, None)
    return (dq, dk, dv, dphi, dpsi, dbeta), want, rounding


def _assert_fpa_close(got, want, rounding, skip=()):
    """Every gradient within 1e-4 of the oracle's; dbeta may also differ by its float32 rounding
    scale (see `_fpa_oracle`) and no more."""
    names = ("dq", "dk", "dv", "dphi", "dpsi", "dbeta")
    for i, (name, g, w) in enumerate(zip(names, got, want)):
        if i in skip:
            continue
        if name == "dbeta":
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            bound = np.maximum(1e-4 * np.maximum(np.abs(w), 1e-2), np.asarray(rounding))
            assert np.all(np.abs(g - w) <= bound), f"dbeta: {g} against {w}, bound {bound}"
        else:
            _close(g, w, 1e-4, name)


@pytest.mark.slow
@pytest.mark.parametrize("forced", [1, 2])
def test_fpa_separable_and_row_referenced_shares_match_the_oracle(forced, monkeypatch):
    """Off-diagonal tiles (gaps included, T = 200: four blocks, ragged) with a small walk, so
    every tile meets the separable path's spread bound: forcing the separable path (1) or the
    row-referenced per-pair path (2) on every tile with a dead pair must both give the oracle's
    gradients."""
    from mixer_kernels.mosaic_gpu.attention import backward_kernels as kernels
    real = kernels._share_path

    def forced_path(*args):
        r, path = real(*args)
        return r, jnp.where(path == 0, 0, forced)

    monkeypatch.setattr(kernels, "_share_path", forced_path)
    seed = case_seed(700 + forced)
    rng = np.random.default_rng(seed)
    walk = np.cumsum(np.float32(0.4) * rng.standard_normal((1, 200, 1), np.float32)
                     - np.float32(0.05), axis=1)
    psi = walk + rng.standard_normal(walk.shape, np.float32)
    _assert_fpa_close(*_fpa_case(seed, 200, jnp.asarray(walk), jnp.asarray(psi)))


@pytest.mark.slow
def test_fpa_tile_paths_chosen_per_tile_match_the_oracle():
    """The paths as chosen: a flat stretch (no dead key: field work skipped), a small walk
    (separable) and a cliff of 300 nats inside the row (spread too wide: row-referenced) in one
    row."""
    seed = case_seed(710)
    rng = np.random.default_rng(seed)
    steps = np.concatenate([np.zeros((1, 70, 1), np.float32),
                            np.float32(0.3) * rng.standard_normal((1, 80, 1), np.float32),
                            np.full((1, 1, 1), -300.0, np.float32),
                            np.float32(0.3) * rng.standard_normal((1, 49, 1), np.float32)], axis=1)
    phi = np.cumsum(steps, axis=1)
    psi = phi + np.where(np.arange(200)[None, :, None] < 70, 0.0, 0.5).astype(np.float32)
    _assert_fpa_close(*_fpa_case(seed, 200, jnp.asarray(phi), jnp.asarray(psi)))


@pytest.mark.slow
def test_fpa_query_minimum_tiles_match_the_oracle():
    """FoX's fields (phi = psi = a walk of negative steps, fresh rates): every off-diagonal
    tile has its range minimum on the query side and every pair dead, the query-minimum path
    (3 of `_share_path`: u from one subtraction, coef = dS; taken by both sweeps); a rise in
    the second half puts the tiles after it back on the other paths in the same row. Then every pair dead but a dip inside the first key block
    below every later field value: those keys' range minimum is their own side, so their tiles
    must not take path 3."""
    seed = case_seed(715)
    rng = np.random.default_rng(seed)
    log_f = -rng.uniform(0.01, 0.3, (1, 200, 1)).astype(np.float32)
    phi = np.cumsum(log_f, axis=1)
    _assert_fpa_close(*_fpa_case(seed, 200, jnp.asarray(phi), jnp.asarray(phi)))
    rise = np.where(np.arange(200)[None, :, None] == 130, 4.0, 0.0).astype(np.float32)
    phi = np.cumsum(log_f + rise, axis=1)
    psi = phi + np.float32(0.1) * rng.standard_normal(phi.shape, np.float32)
    _assert_fpa_close(*_fpa_case(seed, 200, jnp.asarray(phi), jnp.asarray(psi)))
    dip = np.where(np.arange(200)[None, :, None] == 60, -10.0, 0.0).astype(np.float32)
    _assert_fpa_close(*_fpa_case(seed, 200, jnp.asarray(dip),
                                    jnp.asarray(np.full(dip.shape, 5.0, np.float32))))


def test_fpa_flat_fields_take_no_field_work():
    """phi = psi = 0: no key is ever dead, every off-diagonal tile skips the field work; the
    gradients are plain softmax attention's (dphi = dpsi = dbeta = 0). T = 200 as the tile
    paths' test above: the same compiled kernel and oracle."""
    seed = case_seed(720)
    zeros = jnp.zeros((1, 200, 1))
    got, want, rounding = _fpa_case(seed, 200, zeros, zeros)
    _assert_fpa_close(got, want, rounding)
    for name, g in zip(("dphi", "dpsi", "dbeta"), got[3:]):
        assert np.all(np.asarray(g) == 0.0), name


def test_backward_packs_the_forward_pruning_norms():
    """prepare with the forward's block norms packs what it forms itself from q and k (up to
    the rounding of a reduction compiled in another program), and reads them: other norms
    change the packed pruning rows."""
    from mixer_kernels.mosaic_gpu.attention import backward as bwd
    from mixer_core.padding import pad_time, padded_length
    from mixer_kernels.mosaic_gpu.attention.forward import block_norms
    batch, length, heads = 1, 100, 2
    q, k, v, dout = _qkv(case_seed(610), (batch, length, heads, 64), jnp.bfloat16)
    lse = jnp.zeros((batch, heads, length), jnp.float32)
    c = jnp.cumsum(jnp.full((batch, length, heads), -0.3), axis=1)
    bias = SeparableBias(c, c)
    cfg = bwd.kernel_config(bias, 0.125, None, length, prune=True, lhs_in_registers=False)
    qp, kp = (pad_time(x, padded_length(length, 64), 1) for x in (q, k))
    norms = jnp.stack(block_norms(qp, kp, 0.125, length, 64), axis=-1)
    packs = lambda norms: jax.jit(lambda: bwd.prepare(cfg, q, k, v, v, lse, dout, bias, None,
                                                      norms)[0][4:6])()
    for got, want in zip(packs(norms), packs(None)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0.0)
    other = packs(norms.at[..., 0].add(1.0))
    assert np.nanmax(np.abs(np.asarray(other[0]) - np.asarray(packs(None)[0]))) >= 0.99
