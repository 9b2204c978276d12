"""The blocked separable-bias attention (fpa_jax/baselines/flash_xla.py, flash_attention)
against its dense oracle (dense_attention): the output, the log-sum-exp and the gradients of q,
k, v and both biases, with packed documents, T not a multiple of the block and chunks of blocks
(explicit or by default); in bf16 it keeps the dtype and matches the float32 oracle."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.baselines import dense_attention, flash_attention
from tests.fpa_jax.baselines.attention_cases import (_close, _normal, _out_and_grads, _qkv,
                                                    _segments)


def _separable_dense_bias(row_bias, col_bias):
    """[B, T, H] row/col -> [B, H, T, T] dense row_t - col_s."""
    return (jnp.moveaxis(row_bias, 1, 2)[..., :, None] - jnp.moveaxis(col_bias, 1, 2)[..., None, :])


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
