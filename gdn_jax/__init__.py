"""Gated DeltaNet in JAX: the delta-rule ops, the Flax layer, SpectralShift and spectral diagnostics.

REGISTRIES maps op name ("gated_delta_rule", "short_conv") -> its dispatch Registry
(gdn_jax.ops.api.REGISTRY, gdn_jax.ops.short_conv.REGISTRY).
"""

from types import MappingProxyType as _MappingProxyType

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
from gdn_jax.ops import api as _ops_api
from gdn_jax.ops.api import gated_delta_rule, recurrent_gated_delta_rule
from gdn_jax.ops import short_conv as _short_conv
from gdn_jax.spectral_shift import optimizer_labels, spectral_shift, spectralshift_scale

REGISTRIES = _MappingProxyType({registry.op_name: registry      # op name -> dispatch Registry
                                for registry in (_ops_api.REGISTRY, _short_conv.REGISTRY)})

__all__ = [
    "GatedDeltaNet",
    "REGISTRIES",
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
