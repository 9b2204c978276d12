"""Registers the Pallas attention kernels as the "pallas" entry of the attention ops.

The default (`implementation=None`) picks them wherever `pallas_supports` says they run (Hopper
GPUs, bf16 / fp16, head dim 64 or 128): first for FPA and FoX; for softmax after cuDNN, so the
kernel serves what cuDNN does not take (ALiBi, segment_ids). Forward and forward+backward were
checked against the "xla" paths on an H200 (benchmarks/bench_attention_kernels.py, results in
benchmarks/results/attention_kernels_h200.txt).

Imported as the last line of fpa_jax/__init__.py (importing it from kernels_pallas/__init__.py
would be circular, see docs/api.md "Dispatch").
"""

from fpa_jax.baselines import fox, softmax
from fpa_jax.fpa import api
from kernels_pallas.attention.vjp import fox_pallas, fpa_pallas, pallas_supports, softmax_pallas

for _registry, _fn in ((api.REGISTRY, fpa_pallas), (fox.REGISTRY, fox_pallas),
                       (softmax.REGISTRY, softmax_pallas)):
    if "pallas" not in _registry.names():
        _registry.register("pallas", _fn, supports=pallas_supports)
