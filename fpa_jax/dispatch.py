"""The facts an attention op hands to its registry, so every `supports` reads the same names.

    attention_facts(q, v, segment_ids, **op_facts) =
        platform_facts()                              platform, compute_capability
        | dtype (numpy dtype of q), batch, seq_len, num_heads, head_dim (q/k),
          value_head_dim (v), has_segment_ids

The registries themselves (name -> implementation, ordered default) are
`mixer_core.registry.Registry`; each op module owns one (`fpa_jax.REGISTRIES`).
"""

import jax.numpy as jnp

from mixer_core.registry import platform_facts


def attention_facts(q, v, segment_ids, **op_facts):
    """Facts for `Registry.select` from q [B, T, H, D], v [B, T, H, Dv] and the op's flags."""
    batch, seq_len, num_heads, head_dim = q.shape
    return {**platform_facts(), "dtype": jnp.dtype(q.dtype), "batch": batch, "seq_len": seq_len,
            "num_heads": num_heads, "head_dim": head_dim, "value_head_dim": v.shape[-1],
            "has_segment_ids": segment_ids is not None, **op_facts}
