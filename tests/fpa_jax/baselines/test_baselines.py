"""Attention baselines side by side: the masks the Selective Attention and DCP layers share
against their formulas; for every op, causality, packed documents equal to separate runs, and
arguments named in the error; jit, vmap and grad composed. Each op's own checks are in the file
named after its module (test_fox.py, test_softmax.py, ...)."""

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
from fpa_jax.baselines.selective import selection_penalty
from tests.fpa_jax.baselines.attention_cases import _close, _normal, _qkv


# ---------------------------------------------------------- Selective Attention and DCP masks


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
