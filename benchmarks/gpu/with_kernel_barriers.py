"""Run a Python script or module with mixer_kernels/mosaic_gpu/common.py KERNEL_BARRIERS set
("automatic" or "explicit"), for the GPU scripts beside this file:

    python3 benchmarks/gpu/with_kernel_barriers.py explicit benchmarks/op_trace.py gdn --shape 8,2048,12,64
    python3 benchmarks/gpu/with_kernel_barriers.py explicit -m benchmarks.gated_delta_gpu_accuracy jax /tmp/a.npz
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mixer_kernels.mosaic_gpu import common  # noqa: E402


def main(argv):
    if len(argv) < 2 or argv[0] not in ("automatic", "explicit"):
        print("error: usage: with_kernel_barriers.py automatic|explicit SCRIPT [ARGS] | -m MODULE "
              "[ARGS]", file=sys.stderr)
        return 2
    common.KERNEL_BARRIERS = argv[0]
    if argv[1] == "-m":
        sys.argv = argv[2:]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
