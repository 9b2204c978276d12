"""FPA's diagonal tiles' per-level shares formed in XLA from the dk/dv sweep's coefficients
(backward.DIAGONAL_SHARES = "dkv": the sweep writes beta [dead] dS of each diagonal tile,
fields.diagonal_shares sums them by level) give the gradients of the diagonal-shares kernel, in
the GPU interpreter (key and query levels, documents, a ragged last block); and the sweep that
writes them lowers for Hopper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_kernels.mosaic_gpu.attention import backward
from mixer_kernels.mosaic_gpu.attention.backward import FPABias, attention_backward
from tests.mixer_kernels.mosaic_gpu.attention.schedule_cases import (backward_case,
                                                                      interpreted_gradients)
from tests.seeds import case_seed


@pytest.mark.parametrize("case, kind", [(0, "fpa"), (1, "fpa_query")])
def test_diagonal_shares_from_the_sweep_match_the_kernel(case, kind, monkeypatch):
    args, bias, segment_ids = backward_case(case_seed(40 + case), kind)
    grads = {}
    for form in ("kernel", "dkv"):
        monkeypatch.setattr(backward, "DIAGONAL_SHARES", form)
        grads[form] = interpreted_gradients(args, bias, segment_ids, prune=True)
    assert len(grads["kernel"]) == len(grads["dkv"]) == 6
    for a, b in zip(grads["kernel"], grads["dkv"]):
        a, b = np.asarray(a), np.asarray(b)
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * max(float(np.abs(a).max()), 1e-6))


def test_the_sweep_writing_the_diagonal_keeps_heads_rows_beta_and_tau_apart(monkeypatch):
    """Two rows and two heads with their own beta (0.6, 1.7) at tau = 0.5: a coefficient
    written to the wrong (b, h), or beta / tau applied twice or not at all, moves the
    gradients off the kernel's."""
    rng = np.random.default_rng(case_seed(47))
    shape = (2, 130, 2, 64)
    q, k, v, out, dout = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(5))
    lse = jnp.asarray(rng.standard_normal((2, 2, 130)) + 4.0, jnp.float32)
    walk = np.cumsum(rng.normal(-0.3, 1.0, (2, 130, 2)), axis=1)
    walk[1] *= 3.0                                    # the second row's field moves faster
    phi = jnp.asarray(walk, jnp.float32)
    psi = phi + jnp.asarray(rng.normal(0, 1, phi.shape), jnp.float32)
    bias = FPABias(phi, psi, jnp.asarray([0.6, 1.7], jnp.float32), tau=0.5)
    segment_ids = jnp.asarray(np.stack([np.arange(130) >= 90, np.arange(130) >= 40])
                              .astype(np.int32))
    args = (q, k, v, out, lse, dout)
    grads = {}
    for form in ("kernel", "dkv"):
        monkeypatch.setattr(backward, "DIAGONAL_SHARES", form)
        grads[form] = interpreted_gradients(args, bias, segment_ids, prune=True)
    for a, b in zip(grads["kernel"], grads["dkv"]):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * max(float(np.abs(a).max()), 1e-6))


def test_the_sweep_writing_the_diagonal_lowers_for_hopper(monkeypatch):
    monkeypatch.setattr(backward, "DIAGONAL_SHARES", "dkv")
    args, bias, segment_ids = backward_case(0, "fpa")
    args = tuple(x.astype(jnp.bfloat16) if x.ndim == 4 else x for x in args)
    text = jax.jit(lambda *a: attention_backward(*a, bias=bias, scale=0.125,
                                                 segment_ids=segment_ids)).trace(
        *args).lower(lowering_platforms=("cuda",)).as_text()
    assert "attention_diagonal_shares" not in text and "attention_dkv_fpa" in text


def test_a_bad_switch_is_named(monkeypatch):
    monkeypatch.setattr(backward, "DIAGONAL_SHARES", "xla")
    args, bias, segment_ids = backward_case(0, "fpa")
    with pytest.raises(ValueError, match="DIAGONAL_SHARES"):
        backward.kernel_config(bias, 0.125, segment_ids, args[0].shape[1])
