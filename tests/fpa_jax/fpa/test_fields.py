"""Packed documents and the FPA walk: the fields of a packed row are those of each document
computed alone (the walk restarts at every document start), and a constant added to the walk
inside one document (to phi and psi alike) leaves the bias and the attention output unchanged,
so no document's numbers leak into another's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax import fields, fpa_attention, fpa_bias
from tests.seeds import case_seed

HEADS, DIM = 2, 8


def packed_documents(seed, lengths):
    """delta, g, h [1, T, H] and contiguous segment ids [1, T] (document d has id d + 3)."""
    rng = np.random.default_rng(seed)   # NumPy: jax.random would compile per shape
    shape = (1, sum(lengths), HEADS)
    delta = jnp.asarray(rng.standard_normal(shape, np.float32) - np.float32(0.2))
    g, h = (jnp.asarray(rng.standard_normal(shape, np.float32)) for _ in range(2))
    segment_ids = jnp.asarray(np.repeat(np.arange(len(lengths)) + 3, lengths)[None], jnp.int32)
    return delta, g, h, segment_ids


def random_lengths(seed, count=3):
    return [int(n) for n in np.random.default_rng(seed).integers(1, 12, count)]


def test_packed_fields_equal_each_document_alone():
    seed = case_seed(2931)
    lengths = random_lengths(seed) + [1]       # a one-token document at the end
    delta, g, h, segment_ids = packed_documents(seed, lengths)
    phi, psi = fields(delta, g, h, segment_ids=segment_ids)
    # a restart subtracts the running sum at the document start, so float32 rounding is
    # relative to the row's whole walk, not to the document's own values
    walk = np.abs(np.asarray(fields(delta, g, h))).max()
    tolerance = dict(rtol=1e-6, atol=8 * np.finfo(np.float32).eps * (1 + walk))
    start = 0
    for length in lengths:
        part = slice(start, start + length)
        alone_phi, alone_psi = fields(delta[:, part], g[:, part], h[:, part])
        message = f"seed {seed}, lengths {lengths}, at {start}"
        np.testing.assert_allclose(phi[:, part], alone_phi, **tolerance, err_msg=message)
        np.testing.assert_allclose(psi[:, part], alone_psi, **tolerance, err_msg=message)
        start += length
    # one document: the same as no segment ids
    one = jnp.zeros_like(segment_ids)
    for got, want in zip(fields(delta, g, h, segment_ids=one), fields(delta, g, h)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implementation", ["reference", "xla"])
def test_a_constant_walk_offset_per_document_changes_nothing(implementation):
    seed = case_seed(2932 + (implementation == "xla"))
    lengths = random_lengths(seed) + [20]      # with block_size 8 blocks span documents
    delta, g, h, segment_ids = packed_documents(seed, lengths)
    phi, psi = fields(delta, g, h, segment_ids=segment_ids)
    # a different large constant per document, the same for phi and psi (and both heads)
    offsets = jnp.asarray(np.repeat([40.0, -35.0, 25.0, -50.0], lengths)[None, :, None],
                          jnp.float32)
    rng = np.random.default_rng(seed + 1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, sum(lengths), HEADS, DIM), np.float32))
               for _ in range(3))
    beta = jnp.array([0.5, 2.0])
    options = dict(segment_ids=segment_ids, implementation=implementation)
    if implementation == "xla":
        options["block_size"] = 8
    attend = jax.jit(lambda phi, psi: fpa_attention(q, k, v, phi, psi, beta, **options))
    out = attend(phi, psi)
    np.testing.assert_allclose(attend(phi + offsets, psi + offsets), out, rtol=1e-4, atol=1e-5,
                               err_msg=f"seed {seed}, lengths {lengths}")
    # the same walk without restarts (one running sum over the row) is also just an offset
    # per document: fields without segment ids give the same attention
    np.testing.assert_allclose(attend(*fields(delta, g, h)), out, rtol=1e-4, atol=1e-5)
    if implementation == "reference":
        bias = jax.jit(lambda phi, psi, ids: fpa_bias(phi, psi, beta, segment_ids=ids))
        np.testing.assert_allclose(bias(phi + offsets, psi + offsets, segment_ids),
                                   bias(phi, psi, segment_ids), atol=1e-4)
        # and the offset is not a no-op without the document mask: a cross-document pair
        # would see it (guards against a bias that ignores phi altogether)
        one = jnp.zeros_like(segment_ids)
        assert not np.allclose(bias(phi + offsets, psi + offsets, one), bias(phi, psi, one),
                               atol=1e-3)
    # gradients w.r.t. q, k, v are unchanged too
    grad = jax.jit(jax.grad(lambda q, k, v, phi, psi: jnp.sum(
        fpa_attention(q, k, v, phi, psi, beta, **options) * v), argnums=(0, 1, 2)))
    grads = grad(q, k, v, phi, psi)
    moved_grads = grad(q, k, v, phi + offsets, psi + offsets)
    for name, got, want in zip("qkv", moved_grads, grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")
