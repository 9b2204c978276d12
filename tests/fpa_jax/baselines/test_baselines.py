"""Attention baselines: blocked path vs dense oracle, closed forms, causality, checks."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines import (alibi_slopes, apply_rope, dcp_attention, dense_attention,
                               dipsum_attention, flash_attention, fox_attention,
                               selective_attention, softmax_attention)
from fpa_jax.baselines.dcp import keep_log_mask
from fpa_jax.baselines.dipsum import dip_sum_bias
from fpa_jax.baselines.selective import selection_penalty
from tests.seeds import case_seed


def _normal(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.PRNGKey(case_seed(seed)), shape, dtype)


def _qkv(seed, shape, dtype=jnp.float32):
    return tuple(_normal(seed * 10 + i, shape, dtype) for i in range(3))


def _segments(seed, batch, length, count=3):
    """Sorted random document ids [B, T] int32 (contiguous documents)."""
    ids = jax.random.randint(jax.random.PRNGKey(case_seed(seed)), (batch, length), 0, count)
    return jnp.sort(ids, axis=1).astype(jnp.int32)


def _close(actual, expected, tol):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=tol, atol=tol)


def _out_and_grads(fn, weight, *args):
    """One compile: out = fn(*args) and d/d args of sum(out * weight)."""
    def loss(*args):
        out = fn(*args)
        return jnp.sum(out.astype(jnp.float32) * weight), out

    grads, out = jax.jit(jax.grad(loss, argnums=tuple(range(len(args))), has_aux=True))(*args)
    return out, grads


def _separable_dense_bias(row_bias, col_bias):
    """[B, T, H] row/col -> [B, H, T, T] dense row_t - col_s."""
    return (jnp.moveaxis(row_bias, 1, 2)[..., :, None] - jnp.moveaxis(col_bias, 1, 2)[..., None, :])


# ------------------------------------------------------------------ blocked path vs dense oracle


@pytest.mark.parametrize("length,block,chunk,segmented,seed", [
    (1, 16, None, False, 1),
    (37, 16, None, True, 2),     # T not a multiple of the block; 3 chunks of 1 block
    (100, 16, 48, True, 3),      # explicit chunks of 3 blocks, last chunk shorter
    (300, 32, None, False, 4),   # longer T: 10 blocks, chunks of 3
])
def test_flash_matches_dense_values_and_all_gradients(length, block, chunk, segmented, seed):
    batch, heads, dim = 2, 2, 8
    q, k, v = _qkv(seed, (batch, length, heads, dim))
    row_bias = 3 * _normal(seed + 100, (batch, length, heads))
    col_bias = 3 * _normal(seed + 101, (batch, length, heads))
    out_weight = _normal(seed + 102, (batch, length, heads, dim))
    lse_weight = _normal(seed + 103, (batch, length, heads))
    segment_ids = _segments(seed, batch, length) if segmented else None

    def loss(blocked, q, k, v, row_bias, col_bias):
        if blocked:
            out, lse = flash_attention(q, k, v, row_bias=row_bias, col_bias=col_bias, scale=0.7,
                                       segment_ids=segment_ids, block_size=block,
                                       query_chunk_size=chunk)
        else:
            out, lse = dense_attention(q, k, v, _separable_dense_bias(row_bias, col_bias),
                                       scale=0.7, segment_ids=segment_ids)
        return jnp.sum(out * out_weight) + jnp.sum(lse * lse_weight), (out, lse)

    grad_fn = lambda blocked: jax.jit(jax.value_and_grad(
        functools.partial(loss, blocked), argnums=(0, 1, 2, 3, 4), has_aux=True))
    (_, (out, lse)), grads = grad_fn(True)(q, k, v, row_bias, col_bias)
    (_, (out_ref, lse_ref)), grads_ref = grad_fn(False)(q, k, v, row_bias, col_bias)
    _close(out, out_ref, 2e-5)
    _close(lse, lse_ref, 2e-5)
    for name, grad, grad_ref in zip(["q", "k", "v", "row_bias", "col_bias"], grads, grads_ref):
        assert np.abs(np.asarray(grad_ref)).max() > 1e-3, name  # the check is not vacuous
        _close(grad, grad_ref, 5e-5)


def test_flash_bf16_keeps_dtype_and_matches_float32_oracle():
    shape = (2, 50, 2, 16)
    q, k, v = _qkv(5, shape, jnp.bfloat16)
    cumulative = jnp.cumsum(-jax.nn.softplus(_normal(6, shape[:3])), axis=1)
    weight = _normal(7, shape)
    blocked = lambda q, k, v: flash_attention(q, k, v, row_bias=cumulative, col_bias=cumulative,
                                              block_size=32)[0]
    bias = _separable_dense_bias(cumulative, cumulative)
    dense = lambda q, k, v: dense_attention(q, k, v, bias)[0]
    out, grads = _out_and_grads(blocked, weight, q, k, v)
    out_ref, grads_ref = _out_and_grads(dense, weight, *(x.astype(jnp.float32) for x in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    _close(out, out_ref, 2e-2)
    for grad, grad_ref in zip(grads, grads_ref):
        assert grad.dtype == jnp.bfloat16
        _close(grad, grad_ref, 5e-2)


# ------------------------------------------------------------------------------------- FoX


def test_fox_reference_is_the_explicit_path_sum():
    batch, length, heads, dim = 2, 9, 3, 4
    q, k, v = _qkv(7, (batch, length, heads, dim))
    log_forget = -jax.nn.softplus(_normal(8, (batch, length, heads)))
    # b_ts = sum over s < u <= t of log f_u, written as an explicit masked sum (no cumsum).
    u, s, t = np.meshgrid(np.arange(length), np.arange(length), np.arange(length), indexing="ij")
    on_path = ((s < u) & (u <= t)).astype(np.float32)  # [u, s, t]
    bias = jnp.einsum("buh,ust->bhts", log_forget, on_path)
    expected, _ = jax.jit(dense_attention)(q, k, v, bias)
    ours = jax.jit(functools.partial(fox_attention, implementation="reference"))
    _close(ours(q, k, v, log_forget), expected, 1e-6)


def test_fox_blocked_matches_reference_with_log_forget_gradient():
    batch, length, heads, dim = 2, 45, 2, 8
    q, k, v = _qkv(9, (batch, length, heads, dim))
    log_forget = -jax.nn.softplus(_normal(10, (batch, length, heads)))
    segment_ids = _segments(11, batch, length)
    weight = _normal(12, (batch, length, heads, dim))
    fox = lambda impl: functools.partial(fox_attention, segment_ids=segment_ids,
                                         implementation=impl, block_size=16)
    out, grads = _out_and_grads(fox("xla"), weight, q, k, v, log_forget)
    out_ref, grads_ref = _out_and_grads(fox("reference"), weight, q, k, v, log_forget)
    _close(out, out_ref, 2e-5)
    for grad, grad_ref in zip(grads, grads_ref):
        _close(grad, grad_ref, 5e-5)
    assert np.abs(np.asarray(grads_ref[3])).max() > 1e-3


def test_fox_large_drift_stays_finite_and_keeps_only_the_diagonal():
    batch, length, heads, dim = 1, 256, 2, 8
    q, k, v = _qkv(13, (batch, length, heads, dim))
    log_forget = -50.0 + 0.1 * _normal(14, (batch, length, heads))  # c_T ~ -12800

    fox = functools.partial(fox_attention, block_size=128)
    out, grads = _out_and_grads(fox, _normal(15, v.shape), q, k, v, log_forget)
    _close(out, v, 1e-5)  # every older key is suppressed by at least exp(-50 + |logit| gap)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


# ------------------------------------------------------------------------- softmax / ALiBi


@pytest.mark.parametrize("implementation", ["reference", "xla"])
def test_alibi_equals_explicit_distance_bias(implementation):
    batch, length, heads, dim = 2, 40, 3, 8
    q, k, v = _qkv(15, (batch, length, heads, dim))
    slopes = alibi_slopes(heads)
    positions = np.arange(length)
    bias = -np.asarray(slopes)[None, :, None, None] * (positions[:, None] - positions[None, :])
    weight = _normal(16, (batch, length, heads, dim))
    ours = lambda q, k, v: softmax_attention(q, k, v, alibi_slopes=slopes,
                                             implementation=implementation, block_size=16)
    explicit = lambda q, k, v: dense_attention(q, k, v, bias)[0]
    out, grads = _out_and_grads(ours, weight, q, k, v)
    out_ref, grads_ref = _out_and_grads(explicit, weight, q, k, v)
    _close(out, out_ref, 2e-5)
    for grad, grad_ref in zip(grads, grads_ref):
        _close(grad, grad_ref, 5e-5)


def test_softmax_without_bias_is_plain_causal_softmax():
    q, k, v = _qkv(17, (1, 6, 1, 4))
    logits = np.einsum("td,sd->ts", q[0, :, 0], k[0, :, 0]) / 2.0
    logits = np.where(np.tril(np.ones((6, 6), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ np.asarray(v[0, :, 0])
    for implementation in ("reference", "xla"):
        ours = jax.jit(functools.partial(softmax_attention, implementation=implementation))
        _close(ours(q, k, v)[0, :, 0], expected, 1e-5)


def test_alibi_slopes_values():
    _close(alibi_slopes(8), [2.0 ** -i for i in range(1, 9)], 0)
    _close(alibi_slopes(1), [2.0 ** -8], 0)
    twelve = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i - 0.5) for i in range(1, 5)]
    _close(alibi_slopes(12), twelve, 1e-7)
    assert alibi_slopes(12).dtype == jnp.float32


# -------------------------------------------------------------------------------------- RoPE


def test_rope_scores_depend_only_on_relative_position():
    dim = 16
    q_vec, k_vec = _normal(18, (dim,)), _normal(19, (dim,))

    def score(t, s):
        q = apply_rope(q_vec.reshape(1, 1, 1, dim), jnp.array([[t]]))
        k = apply_rope(k_vec.reshape(1, 1, 1, dim), jnp.array([[s]]))
        return float(jnp.sum(q * k))

    for t, s, shift in [(5, 2, 11), (40, 3, 900), (7, 7, 123)]:
        assert score(t, s) == pytest.approx(score(t + shift, s + shift), rel=1e-4, abs=1e-4)
    by_distance = [score(9, 9 - d) for d in range(8)]
    assert max(by_distance) - min(by_distance) > 1e-3  # it does depend on t - s


def test_rope_rotates_half_pairs_by_position_times_frequency():
    x = _normal(20, (2, 5, 3, 8), jnp.bfloat16)
    positions = jnp.array([[0, 1, 2, 3, 4], [10, 20, 30, 40, 50]])
    rope = jax.jit(apply_rope, static_argnames="base")
    out = rope(x, positions, base=100.0)
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape
    xf = np.asarray(x, np.float64)
    angle = np.asarray(positions, np.float64)[:, :, None, None] * 100.0 ** (-np.arange(4) / 4)
    x1, x2 = xf[..., :4], xf[..., 4:]
    expected = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                               x2 * np.cos(angle) + x1 * np.sin(angle)], axis=-1)
    _close(out, expected, 2e-2)
    _close(rope(x, jnp.zeros((2, 5), jnp.int32)), x, 0)  # position 0: identity


# ------------------------------------------------------- Selective Attention, DCP, dip sum


def _uniform_content(length):
    """q = k = 0 (all content logits 0), v = one-hot of the position: out rows = weights."""
    q = jnp.zeros((1, length, 1, 2))
    v = jnp.eye(length).reshape(1, length, 1, length)
    return q, q, v


def test_selective_hand_computed_case():
    q, k, v = _uniform_content(4)
    selection = np.full((1, 4, 4), -1.0, np.float32)  # negative: relu gives 0
    selection[0, 2, 1] = 2.0   # token 2 selects token 1: hidden from query 3 on (not from 2)
    selection[0, 1, 0] = 9.0   # token 0 is the document start: never selected
    selection[0, 3, 2] = 5.0   # acts only on queries after 3: none
    selection[0, 1, 2] = 7.0   # s > u: ignored
    out = np.asarray(selective_attention(q, k, v, jnp.asarray(selection)))[0, :, 0]
    expected = np.tril(np.ones((4, 4)))
    expected[3, 1] = np.exp(-2.0)
    expected /= expected.sum(-1, keepdims=True)
    _close(out, expected, 1e-6)


def test_dcp_hand_computed_case():
    q, k, v = _uniform_content(3)
    mask_logits = jnp.asarray(_normal(21, (1, 3, 3)))
    m = np.asarray(mask_logits[0], np.float64)
    sig = 1 / (1 + np.exp(-m))
    expected = np.array([[1, 0, 0],
                         [sig[1, 0], 1, 0],
                         [sig[1, 0] * sig[2, 0], sig[2, 1], 1]])
    expected /= expected.sum(-1, keepdims=True)
    _close(np.asarray(dcp_attention(q, k, v, mask_logits))[0, :, 0], expected, 1e-6)


def test_dipsum_bias_equals_loops_and_hand_case():
    batch, length, heads = 2, 6, 3
    phi = 2 * _normal(22, (batch, length, heads))
    psi = 2 * _normal(23, (batch, length, heads))
    beta = jnp.array([0.5, 1.0, 2.0])
    bias = np.asarray(dip_sum_bias(phi, psi, beta))
    p, s_, b = np.asarray(phi), np.asarray(psi), np.asarray(beta)
    for i in range(batch):
        for h in range(heads):
            for t in range(length):
                for s in range(t + 1):
                    dips = sum(min(0.0, p[i, u, h] - s_[i, s, h]) for u in range(s + 1, t + 1))
                    assert bias[i, h, t, s] == pytest.approx(b[h] * dips, rel=1e-5, abs=1e-5)
    # Hand case: field 0, -1, -1 after a key of level 0 -> b_20 = beta * (-1 - 1).
    q, k, v = _uniform_content(3)
    field = jnp.array([0.0, -1.0, -1.0]).reshape(1, 3, 1)
    out = np.asarray(dipsum_attention(q, k, v, field, jnp.zeros((1, 3, 1)), jnp.array([1.5])))
    # b_10 = 1.5 * -1, b_20 = 1.5 * -2, b_21 = 1.5 * min(0, -1 - 0) = -1.5
    expected = np.array([[1, 0, 0], [np.exp(-1.5), 1, 0], [np.exp(-3.0), np.exp(-1.5), 1]])
    expected /= expected.sum(-1, keepdims=True)
    _close(out[0, :, 0], expected, 1e-6)


def test_layer_shared_masks_match_their_formulas():
    length = 5
    logits = _normal(24, (2, length, length))
    x = np.asarray(logits, np.float64)
    log_sig = -np.log1p(np.exp(-x))
    mask = np.asarray(keep_log_mask(logits))
    penalty = np.asarray(selection_penalty(logits))
    for t in range(length):
        for s in range(t + 1):
            assert mask[:, t, s] == pytest.approx(log_sig[:, s + 1:t + 1, s].sum(1), abs=1e-5)
            chosen = np.maximum(x[:, s + 1:t, s], 0).sum(1) if s > 0 else 0.0
            assert penalty[:, t, s] == pytest.approx(chosen, abs=1e-5)


# ------------------------------------------------------------ causality, segments, transforms


@functools.partial(jax.jit, static_argnums=0)
def _call(op, q, k, v, extras, segment_ids=None):
    """Uniform call of every op; extras: dict of per-op arrays."""
    if op == "softmax":
        return softmax_attention(q, k, v, segment_ids=segment_ids, alibi_slopes=extras["slopes"],
                                 block_size=8)
    if op == "fox":
        return fox_attention(q, k, v, extras["log_forget"], segment_ids=segment_ids, block_size=8)
    if op == "selective":
        return selective_attention(q, k, v, extras["pair"], segment_ids=segment_ids)
    if op == "dcp":
        return dcp_attention(q, k, v, extras["pair"], segment_ids=segment_ids)
    return dipsum_attention(q, k, v, extras["phi"], extras["psi"], extras["beta"],
                            segment_ids=segment_ids)


def _extras(seed, batch, length, heads):
    return {"slopes": alibi_slopes(heads),
            "log_forget": -jax.nn.softplus(_normal(seed, (batch, length, heads))),
            "pair": 2 * _normal(seed + 1, (batch, length, length)),
            "phi": _normal(seed + 2, (batch, length, heads)),
            "psi": _normal(seed + 3, (batch, length, heads)),
            "beta": jnp.full((heads,), 0.8)}


OPS = ["softmax", "fox", "selective", "dcp", "dipsum"]


@pytest.mark.parametrize("op", OPS)
def test_future_tokens_do_not_change_earlier_outputs(op):
    batch, length, heads, dim, cut = 1, 13, 2, 4, 7
    q, k, v = _qkv(25, (batch, length, heads, dim))
    extras = _extras(26, batch, length, heads)
    noisy = lambda x, seed: x.at[:, cut:].add(3 * _normal(seed, x[:, cut:].shape))
    perturbed = {name: noisy(x, 30 + i) if name != "slopes" and name != "beta" else x
                 for i, (name, x) in enumerate(extras.items())}
    perturbed["pair"] = perturbed["pair"].at[:, :, cut:].add(5.0)  # keys s >= cut too
    out = _call(op, q, k, v, extras)
    out_perturbed = _call(op, noisy(q, 40), noisy(k, 41), noisy(v, 42), perturbed)
    _close(out[:, :cut], out_perturbed[:, :cut], 1e-6)
    assert np.abs(np.asarray(out[:, cut:] - out_perturbed[:, cut:])).max() > 1e-3


@pytest.mark.parametrize("op", OPS)
def test_packed_documents_equal_separate_runs(op):
    heads, dim, first = 2, 4, 5
    q, k, v = _qkv(43, (1, 12, heads, dim))
    extras = _extras(44, 1, 12, heads)
    segment_ids = jnp.array([[3] * first + [8] * (12 - first)], jnp.int32)
    packed = _call(op, q, k, v, extras, segment_ids)
    for lo, hi in ((0, first), (first, 12)):
        piece = {name: (x[:, lo:hi, lo:hi] if name == "pair" else x[:, lo:hi])
                 if name not in ("slopes", "beta") else x for name, x in extras.items()}
        alone = _call(op, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], piece)
        _close(packed[:, lo:hi], alone, 2e-5)


def test_jit_vmap_grad_compose():
    seeds, batch, length, heads, dim = 3, 1, 20, 2, 4
    q, k, v = _qkv(45, (seeds, batch, length, heads, dim))
    log_forget = -jax.nn.softplus(_normal(46, (seeds, batch, length, heads)))
    pair = _normal(47, (seeds, batch, length, length))

    def loss(q, k, v, log_forget, pair):
        fox = fox_attention(q, k, v, log_forget)  # one block of 20
        return jnp.sum(fox ** 2) + jnp.sum(selective_attention(q, k, v, pair) ** 2)

    batched = jax.jit(jax.vmap(jax.grad(loss, argnums=(3, 4))))(q, k, v, log_forget, pair)
    single_fn = jax.jit(jax.grad(loss, argnums=(3, 4)))
    for seed in range(seeds):
        single = single_fn(q[seed], k[seed], v[seed], log_forget[seed], pair[seed])
        for got, want in zip(batched, single):
            _close(got[seed], want, 1e-5)


# ------------------------------------------------------------------------------ bad inputs


def _bad_calls():
    q = jnp.zeros((2, 5, 3, 4))
    lf = jnp.zeros((2, 5, 3))
    pair = jnp.zeros((2, 5, 5))
    beta = jnp.ones((3,))
    return [
        ("q", ValueError, lambda: softmax_attention(q[0], q[0], q[0])),
        ("k", ValueError, lambda: softmax_attention(q, q[:, :4], q)),
        ("v", ValueError, lambda: fox_attention(q, q, q[:, :, :2], lf)),
        ("q", TypeError, lambda: softmax_attention(q.astype(jnp.int32), q, q)),
        ("q, k, v", TypeError, lambda: softmax_attention(q, q.astype(jnp.bfloat16), q)),
        ("segment_ids", TypeError, lambda: fox_attention(q, q, q, lf, segment_ids=lf[..., 0])),
        ("segment_ids", ValueError,
         lambda: softmax_attention(q, q, q, segment_ids=jnp.zeros((2, 4), jnp.int32))),
        ("log_forget", ValueError, lambda: fox_attention(q, q, q, lf[:, :, :2])),
        ("log_forget", TypeError, lambda: fox_attention(q, q, q, lf.astype(jnp.int32))),
        ("alibi_slopes", ValueError, lambda: softmax_attention(q, q, q, alibi_slopes=beta[:2])),
        ("selection_logits", ValueError, lambda: selective_attention(q, q, q, pair[:, :4])),
        ("mask_logits", ValueError, lambda: dcp_attention(q, q, q, pair[0])),
        ("psi", ValueError, lambda: dipsum_attention(q, q, q, lf, lf[:1], beta)),
        ("beta", ValueError, lambda: dipsum_attention(q, q, q, lf, lf, beta[:1])),
        ("beta", ValueError, lambda: dipsum_attention(q, q, q, lf, lf, -beta)),
        ("scale", ValueError, lambda: softmax_attention(q, q, q, scale=math.inf)),
        ("block_size", ValueError, lambda: fox_attention(q, q, q, lf, block_size=0)),
        ("row_bias", ValueError, lambda: flash_attention(q, q, q, row_bias=lf[:, :3])),
        ("bias", ValueError, lambda: dense_attention(q, q, q, jnp.zeros((3, 3)))),
        ("x", ValueError, lambda: apply_rope(q[..., :3], jnp.zeros((2, 5)))),
        ("positions", ValueError, lambda: apply_rope(q, jnp.zeros((5,)))),
        ("num_heads", ValueError, lambda: alibi_slopes(0)),
        ("implementation: softmax_attention has no implementation 'fast'", ValueError,
         lambda: softmax_attention(q, q, q, implementation="fast")),
        ("implementation: fox_attention has no implementation 'cudnn'", ValueError,
         lambda: fox_attention(q, q, q, lf, implementation="cudnn")),
        ("implementation: selective_attention has no implementation 'xla'", ValueError,
         lambda: selective_attention(q, q, q, pair, implementation="xla")),
        ("implementation: dcp_attention has no implementation 'xla'", ValueError,
         lambda: dcp_attention(q, q, q, pair, implementation="xla")),
        ("implementation: dipsum_attention has no implementation 'xla'", ValueError,
         lambda: dipsum_attention(q, q, q, lf, lf, beta, implementation="xla")),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_inputs_raise_naming_the_argument(index):
    prefix, error, call = _bad_calls()[index]  # every message starts with the argument's name
    with pytest.raises(error, match="^" + re.escape(prefix)):
        call()
