"""Registers the Pallas attention kernels as the "pallas" entry of the attention ops.

The entries are explicit-only (`implementation="pallas"` runs them; `None` keeps choosing the
next default) until the whole forward+backward path has been checked against "xla" on an H200:
the backward kernels were, the forward kernel has so far only been interpreted and lowered.
Remove `explicit_only` once `benchmarks/bench_attention_kernels.py` passes on the GPU.

Imported as the last line of fpa_jax/__init__.py (importing it from kernels_pallas/__init__.py
would be circular, see notes/API.md "Dispatch").
"""

from fpa_jax.baselines import fox, softmax
from fpa_jax.fpa import api
from kernels_pallas.attention.vjp import fox_pallas, fpa_pallas, pallas_supports, softmax_pallas

NOT_VALIDATED = "the Pallas attention forward has not yet been validated on a GPU"

for _registry, _fn in ((api.REGISTRY, fpa_pallas), (fox.REGISTRY, fox_pallas),
                       (softmax.REGISTRY, softmax_pallas)):
    if "pallas" not in _registry.names():
        _registry.register("pallas", _fn, supports=pallas_supports, explicit_only=NOT_VALIDATED)
