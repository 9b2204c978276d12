"""Spectral diagnostics of Gated DeltaNet transitions (what survives from position i to j).

Per value head (vectorised over heads), one sequence of length T:
    log_alpha [T, HV], beta [T, HV], keys [T, HV, K] (as the recurrence uses them, L2-normalised)
    A_t = alpha_t (I - beta_t k_t k_t^T),     Phi_{i->j} = A_j ... A_{i+1},   ell = j - i
    log sigma_r(Phi) = sum_{t=i+1..j} log alpha_t  +  log sigma_r(R),   R = prod (I - beta_t k_t k_t^T)
    gamma_r = -(1/ell) log sigma_r(Phi),   gamma_alpha = -(1/ell) sum log alpha_t,
    gamma_keys = gamma_r - gamma_alpha = -(1/ell) log sigma_r(R)
    slow band S_ell = {r : log sigma_r(Phi) >= -1};  slow-band width = |S_ell|
    over layer-heads: M_slow = sum of slow-band widths, H_slow = #(layer-heads with width >= 1)
    E_write(k_i) = ||V_S^T k_i||^2 / ||k_i||^2,  V_S = right singular vectors of the slow modes

R is accumulated step by step and renormalised by its Frobenius norm each step (the log of the
norms is tracked), then the SVD of the renormalised product gives the singular vectors and
log sigma(R) = log sigma(M) + log-scale. The alpha part is summed separately in log space, so
nothing underflows. Singular values of M that are exactly zero get log sigma(R) = LOG_SIGMA_FLOOR;
values below ~ float32 eps relative to the largest are at rounding level: their size is not
meaningful, only that they are fast.
"""

import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gdn_jax.layer import GatedDeltaNet

LOG_SIGMA_FLOOR = -1.0e4
SLOW_THRESHOLD = -1.0


class TransitionSpectrum(NamedTuple):
    """Spectra of Phi_{start -> start + ell} for each distance ell (L distances, HV heads, K modes)."""

    distances: jax.Array        # [L] int, ascending
    log_sigma: jax.Array        # [L, HV, K] log singular values of Phi, descending
    gamma: jax.Array            # [L, HV, K] decay rates -(1/ell) log sigma_r(Phi)
    gamma_alpha: jax.Array      # [L, HV] head-shared part -(1/ell) sum log alpha_t
    gamma_keys: jax.Array       # [L, HV, K] key-dependent part gamma - gamma_alpha
    slow_mask: jax.Array        # [L, HV, K] bool, log sigma_r >= -1
    slow_band_width: jax.Array  # [L, HV] int, number of slow modes
    right_vectors: jax.Array    # [L, HV, K, K]; [..., :, r] is the r-th right singular vector


class SlowModeSummary(NamedTuple):
    distances: jax.Array  # [L]
    m_slow: jax.Array     # [L] slow modes summed over layer-heads
    h_slow: jax.Array     # [L] layer-heads with at least one slow mode


def _advance(state, step_inputs):
    """One factor (I - beta k k^T) applied on the left, then Frobenius renormalisation (per head)."""
    product, log_scale = state
    beta, key = step_inputs                                   # [HV], [HV, K]
    key_times_product = jnp.einsum("hk,hkm->hm", key, product)
    product = product - beta[:, None, None] * key[:, :, None] * key_times_product[:, None, :]
    norm = jnp.sqrt(jnp.sum(product * product, axis=(1, 2)))
    norm = jnp.where(norm > 0, norm, 1.0)
    return product / norm[:, None, None], log_scale + jnp.log(norm)


@jax.jit
def _spectra(log_alpha, beta, keys, start, distances):
    heads, key_dim = keys.shape[1:]
    identity = jnp.broadcast_to(jnp.eye(key_dim, dtype=keys.dtype), (heads, key_dim, key_dim))

    def next_distance(carry, distance):
        product, log_scale, position = carry                 # position: next step to apply
        stop = start + distance + 1

        def body(t, state):
            return _advance(state, (beta[t], keys[t]))

        product, log_scale = jax.lax.fori_loop(position, stop, body, (product, log_scale))
        return (product, log_scale, stop), (product, log_scale)

    init = (identity, jnp.zeros((heads,), keys.dtype), start + 1)
    _, (products, log_scales) = jax.lax.scan(next_distance, init, distances)
    _, singular_values, right_transposed = jnp.linalg.svd(products)      # [L, HV, K], [L, HV, K, K]
    log_sigma_keys = jnp.where(singular_values > 0, jnp.log(jnp.where(singular_values > 0, singular_values, 1.0)),
                               -jnp.inf) + log_scales[..., None]
    log_sigma_keys = jnp.maximum(log_sigma_keys, LOG_SIGMA_FLOOR)
    cumulative = jnp.concatenate([jnp.zeros((1, heads), log_alpha.dtype), jnp.cumsum(log_alpha, axis=0)])
    log_alpha_sum = cumulative[start + distances + 1] - cumulative[start + 1]        # [L, HV]
    log_sigma = log_sigma_keys + log_alpha_sum[..., None]
    ell = distances.astype(log_sigma.dtype)[:, None]
    gamma_alpha = -log_alpha_sum / ell
    gamma_keys = -log_sigma_keys / ell[..., None]
    slow_mask = log_sigma >= SLOW_THRESHOLD
    return TransitionSpectrum(
        distances=distances, log_sigma=log_sigma, gamma=gamma_keys + gamma_alpha[..., None],
        gamma_alpha=gamma_alpha, gamma_keys=gamma_keys, slow_mask=slow_mask,
        slow_band_width=jnp.sum(slow_mask, axis=-1), right_vectors=jnp.swapaxes(right_transposed, -1, -2))


def transition_spectrum(log_alpha: jax.Array, beta: jax.Array, keys: jax.Array, *, start: int,
                        distances: Sequence[int]) -> TransitionSpectrum:
    """Spectra of Phi_{start -> start + ell} for every ell in `distances` (sorted, deduplicated).

    log_alpha, beta [T, HV]; keys [T, HV, K] (one sequence, one document); computed in the
    inputs' float dtype (at least float32).
    """
    log_alpha, beta, keys = (jnp.asarray(a) for a in (log_alpha, beta, keys))
    if keys.ndim != 3:
        raise ValueError(f"transition_spectrum: keys must be [T, HV, K], got shape {keys.shape}")
    for name, array in (("log_alpha", log_alpha), ("beta", beta)):
        if array.shape != keys.shape[:2]:
            raise ValueError(f"transition_spectrum: {name} must be [T, HV] = {keys.shape[:2]}, got {array.shape}")
    for name, array in (("log_alpha", log_alpha), ("beta", beta), ("keys", keys)):
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(f"transition_spectrum: {name} must be floating point, got {array.dtype}")
    length = keys.shape[0]
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start < length:
        raise ValueError(f"transition_spectrum: start must be an int in [0, {length}), got {start!r}")
    distances = sorted({int(d) for d in distances})
    if not distances or distances[0] < 1 or start + distances[-1] > length - 1:
        raise ValueError(f"transition_spectrum: distances must be non-empty ints in [1, {length - 1 - start}] "
                         f"(start={start}, T={length}), got {distances}")
    dtype = jnp.promote_types(jnp.result_type(log_alpha, beta, keys), jnp.float32)
    return _spectra(log_alpha.astype(dtype), beta.astype(dtype), keys.astype(dtype),
                    jnp.asarray(start, jnp.int32), jnp.asarray(distances, jnp.int32))


def gdn_transition_inputs(module: GatedDeltaNet, params, x: jax.Array, *, segment_ids=None):
    """Run a GatedDeltaNet's projections on x [B, T, D] -> (log_alpha, beta [B, T, HV], keys [B, T, HV, K]).

    params: the variables dict ({"params": ...}) or the "params" collection itself.
    """
    if not isinstance(module, GatedDeltaNet):
        raise TypeError(f"gdn_transition_inputs: module must be a GatedDeltaNet, got {type(module).__name__}")
    variables = params if "params" in params else {"params": params}
    return module.apply(variables, x, segment_ids=segment_ids, method=GatedDeltaNet.transition_inputs)


def slow_mode_summary(spectra: Sequence[TransitionSpectrum]) -> SlowModeSummary:
    """M_slow and H_slow over the layer-heads of several layers (spectra at the same distances)."""
    if not spectra:
        raise ValueError("slow_mode_summary: spectra must be a non-empty sequence of TransitionSpectrum")
    distances = np.asarray(spectra[0].distances)
    for index, spectrum in enumerate(spectra):
        if not np.array_equal(np.asarray(spectrum.distances), distances):
            raise ValueError(f"slow_mode_summary: spectra[{index}].distances {np.asarray(spectrum.distances)} "
                             f"differ from spectra[0].distances {distances}")
    widths = jnp.concatenate([spectrum.slow_band_width for spectrum in spectra], axis=1)    # [L, layers*HV]
    return SlowModeSummary(distances=spectra[0].distances, m_slow=jnp.sum(widths, axis=1),
                           h_slow=jnp.sum(widths > 0, axis=1))


def write_energy(spectrum: TransitionSpectrum, key: jax.Array) -> jax.Array:
    """E_write = ||V_S^T k||^2 / ||k||^2 per distance and head: key [HV, K] (or [K], shared) -> [L, HV]."""
    key = jnp.asarray(key)
    heads, key_dim = spectrum.right_vectors.shape[1:3]
    if key.shape not in ((key_dim,), (heads, key_dim)):
        raise ValueError(f"write_energy: key must be [K] = ({key_dim},) or [HV, K] = ({heads}, {key_dim}), "
                         f"got {key.shape}")
    key = jnp.broadcast_to(key.astype(spectrum.right_vectors.dtype), (heads, key_dim))
    coefficients = jnp.einsum("lhkr,hk->lhr", spectrum.right_vectors, key)
    slow_energy = jnp.sum(jnp.where(spectrum.slow_mask, coefficients * coefficients, 0.0), axis=-1)
    return slow_energy / jnp.sum(key * key, axis=-1)


def plot_decay_spectra(spectrum: TransitionSpectrum, path: str, *, title: str | None = None,
                       gamma_floor: float = 1e-6) -> str:
    """Write a PNG: one panel per distance, decay rates gamma_r (ascending, log scale) per head,
    with the slow threshold 1/ell dashed. Rates below gamma_floor are drawn at gamma_floor."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    distances = np.asarray(spectrum.distances)
    gamma = np.maximum(np.sort(np.asarray(spectrum.gamma, dtype=np.float64), axis=-1), gamma_floor)
    heads, modes = gamma.shape[1:]
    figure = Figure(figsize=(4.0 * len(distances), 3.2), constrained_layout=True)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(distances), squeeze=False)[0]
    for panel, (axis, distance) in enumerate(zip(axes, distances)):
        for head in range(heads):
            axis.plot(np.arange(modes), gamma[panel, head], marker=".", linewidth=1, label=f"head {head}")
        axis.axhline(1.0 / distance, color="black", linestyle="--", linewidth=1, label="slow: 1/ell")
        axis.set_yscale("log")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("mode r (sorted)")
        axis.set_ylabel("decay rate gamma_r")
        axis.set_title(f"ell = {distance}")
    if heads <= 16:
        axes[-1].legend(fontsize="x-small")
    if title:
        figure.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path
