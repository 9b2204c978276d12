"""Gated delta rule ops: the public chunked op and its token-by-token oracle (see api.py)."""

from gdn_jax.ops.api import gated_delta_rule, recurrent_gated_delta_rule

__all__ = ["gated_delta_rule", "recurrent_gated_delta_rule"]

import kernels_pallas.gated_delta.register  # noqa: E402,F401  (adds the "pallas" entry to api.REGISTRY)
import kernels_pallas.short_conv.register  # noqa: E402,F401  (adds the "pallas" entry to short_conv.REGISTRY)
