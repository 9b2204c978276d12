"""Bias descriptions of the causal attention kernel family (shared by forward and backward).

    logit_ts = scale <q_t, k_s> + b_ts,   s <= t (and same document)

    NoBias()                    b_ts = 0                               causal softmax (NoPE / RoPE)
    SeparableBias(row, col)     b_ts = row_t - col_s                   FoX: row = col = cumsum(log f)
                                                                       ALiBi: row = col = -slope * t
    FPABias(phi, psi, beta, tau, query_level, content)
                                b_ts = beta min(0, min_{s<u<=t} phi_u - level),  b_tt = 0
                                level = psi_s (psi_t with query_level); content=False drops <q, k>

row, col, phi, psi [B, T, H] float (used as float32); beta [H] > 0; tau > 0 only shapes the
backward's soft minimum.
"""

from typing import NamedTuple

import jax.numpy as jnp


class NoBias(NamedTuple):
    pass


class SeparableBias(NamedTuple):
    row: jnp.ndarray
    col: jnp.ndarray


class FPABias(NamedTuple):
    phi: jnp.ndarray
    psi: jnp.ndarray
    beta: jnp.ndarray
    tau: float = 1.0
    query_level: bool = False
    content: bool = True
