"""FoX attention (fpa_jax/baselines/fox.py): the reference equals the explicit sum of the log
forget gates along each path, the blocked path matches the reference with the gradient of
log_forget, and a walk falling by 50 per token stays finite and keeps only the diagonal."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fpa_jax.baselines import dense_attention, fox_attention
from tests.fpa_jax.baselines.attention_cases import (_close, _normal, _out_and_grads, _qkv,
                                                    _segments)


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
