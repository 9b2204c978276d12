"""Every attention op's dispatch registry, by op name (mechanism: mixer_core/registry.py).

    REGISTRIES[op_name] -> Registry     op_name in fpa_attention, fox_attention,
                                        softmax_attention, selective_attention, dcp_attention,
                                        dipsum_attention

Each op module owns its REGISTRY; this table is what the layers and the trainer's config check
an `implementation` name against.
"""

from types import MappingProxyType

from fpa_jax.baselines import dcp, dipsum, fox, selective, softmax
from fpa_jax.fpa import api

REGISTRIES = MappingProxyType({registry.op_name: registry for registry in (
    api.REGISTRY, fox.REGISTRY, softmax.REGISTRY, selective.REGISTRY, dcp.REGISTRY,
    dipsum.REGISTRY)})
