"""Gated delta rule ops: the public chunked op and its token-by-token oracle (see api.py)."""

from gdn_jax.ops.api import gated_delta_rule, recurrent_gated_delta_rule

__all__ = ["gated_delta_rule", "recurrent_gated_delta_rule"]
