"""The "pallas" entries of the attention ops (FPA, FoX, softmax) and their `supports`; each op
module (`fpa_jax/fpa/api.py`, `fpa_jax/baselines/fox.py`, `.../softmax.py`) builds its table
from them.

The default (`implementation=None`) picks them wherever `pallas_supports` says they run (Hopper
GPUs, bf16 / fp16, head dim 64 or 128): first for FPA and FoX; for softmax after cuDNN, so the
kernel serves what cuDNN does not take (ALiBi, segment_ids). Forward and forward+backward were
checked against the "xla" paths on an H200 (benchmarks/bench_attention_kernels.py, results in
benchmarks/results/attention_kernels_h200.txt).
"""

from mixer_kernels.mosaic_gpu.attention.vjp import fox_pallas, fpa_pallas, pallas_supports, softmax_pallas

__all__ = ["fox_pallas", "fpa_pallas", "pallas_supports", "softmax_pallas"]
