"""The attention backward kernels with prune=True and packed documents, in the GPU interpreter:
tiles whose query and key blocks share no document are skipped (the dkv kernel stops at the
key block's last document, the dq kernel starts at the query block's first), and the FPA
gradients still match the dense oracle's autodiff.

T = 130 in blocks of 64 (the last one ragged) with documents [0, 66), [66, 100), [100, 130):
query block 2 shares no document with key block 0, so tile (2, 0) is skipped by both
kernels, while tile (1, 0) (queries 64 and 65 of document 0) must not be."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fpa_jax.fpa.reference import fpa_attention_reference, fpa_bias
from mixer_core import interpret
from mixer_kernels.mosaic_gpu.attention.backward import FPABias, attention_backward
from tests.seeds import case_seed

LENGTH, DIM = 130, 64
CUTS = (66, 100)


def _close(got, want, rtol, name):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), f"{name}: non-finite"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-2 * np.sqrt(want.size))
    assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


@pytest.mark.slow
def test_fpa_gradients_with_document_skipping_match_the_dense_oracle():
    seed = case_seed(2941)
    rng = np.random.default_rng(seed)   # NumPy: jax.random would compile a program per shape
    q, k, v, dout = (jnp.asarray(rng.standard_normal((1, LENGTH, 1, DIM), np.float32))
                     for _ in range(4))
    segment_ids = jnp.asarray(np.searchsorted(CUTS, np.arange(LENGTH), side="right")[None]
                              .astype(np.int32))
    phi = np.cumsum(rng.standard_normal((1, LENGTH, 1), np.float32), axis=1)
    phi, psi = jnp.asarray(phi), jnp.asarray(phi + rng.standard_normal(phi.shape, np.float32))
    beta = jnp.asarray(np.float32(0.3) + rng.uniform(size=1).astype(np.float32))
    scale = DIM ** -0.5

    def oracle(q, k, v, phi, psi, beta, dout):
        """out, lse [B, H, T] and the gradients of the dense reference (one program), in
        float64: dbeta is one sum over every pair, and a float32 oracle's rounding of it
        (4e-6 against the kernel's 6e-7, seed 459314190) was above the 1e-4 bar."""
        fn = lambda *a: fpa_attention_reference(*a, scale=scale, segment_ids=segment_ids)
        out, vjp = jax.vjp(fn, q, k, v, phi, psi, beta)
        logits = fpa_bias(phi, psi, beta, segment_ids=segment_ids) + \
            scale * jnp.einsum("bthd,bshd->bhts", q, k)
        return out, jax.nn.logsumexp(logits, axis=-1), vjp(dout)

    with jax.enable_x64(True):
        wide = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, phi, psi, beta, dout)]
        out, lse, want = jax.tree.map(np.asarray, jax.jit(oracle)(*wide))
    out, lse = jnp.asarray(out, jnp.float32), jnp.asarray(lse, jnp.float32)
    interpret.reset()
    with interpret.gpu_interpret():
        run = jax.jit(lambda *a: attention_backward(*a, bias=FPABias(phi, psi, beta),
                                                    scale=scale, segment_ids=segment_ids,
                                                    prune=True))
        dq, dk, dv, (dphi, dpsi, dbeta) = jax.block_until_ready(run(q, k, v, out, lse, dout))
    assert not interpret.races_found()
    names = ("dq", "dk", "dv", "dphi", "dpsi", "dbeta")
    for name, g, w in zip(names, (dq, dk, dv, dphi, dpsi, dbeta), want):
        _close(g, w, 1e-4, f"{name} (seed {seed})")
