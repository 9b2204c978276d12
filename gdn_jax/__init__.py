"""Gated DeltaNet in JAX: the delta-rule ops, the Flax layer, SpectralShift and spectral diagnostics."""

from gdn_jax.diagnostics import (
    SlowModeSummary,
    TransitionSpectrum,
    gdn_transition_inputs,
    plot_decay_spectra,
    slow_mode_summary,
    transition_spectrum,
    write_energy,
)
from gdn_jax.layer import GatedDeltaNet
from gdn_jax.ops.api import gated_delta_rule, recurrent_gated_delta_rule
from gdn_jax.spectral_shift import optimizer_labels, spectral_shift, spectralshift_scale

__all__ = [
    "GatedDeltaNet",
    "SlowModeSummary",
    "TransitionSpectrum",
    "gated_delta_rule",
    "gdn_transition_inputs",
    "optimizer_labels",
    "plot_decay_spectra",
    "recurrent_gated_delta_rule",
    "slow_mode_summary",
    "spectral_shift",
    "spectralshift_scale",
    "transition_spectrum",
    "write_energy",
]
