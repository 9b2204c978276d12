"""A Python script or module run with the kernels' module switches set from the environment,
for the GPU scripts beside this file (unset or empty: the library's default):

    INTRA         "xla" | "pallas"          mixer_kernels/mosaic_gpu/gated_delta/vjp.py INTRA_BACKWARD
    XLA_OPERANDS  "float32" | "16-bit"      vjp.XLA_OPERANDS
    RESIDUALS     "internals" | "inputs"    vjp.RESIDUALS
    OUTPUTS       "xla" | "pallas"          vjp.OUTPUTS
    STATE_GRADIENTS  "xla" | "pallas"       vjp.STATE_GRADIENTS
    CONV          "xla"                     the short convolutions without their kernel backward
    FIELDS        "by_level" | "kernels" | "all_levels" | "spread_kernel"
                                            .../attention/fields.py FIELD_PASSES

    python3 benchmarks/gpu/with_knobs.py -m train bench gdn_125m --context 2048 --batch-size 8
    OUTPUTS=xla python3 benchmarks/gpu/with_knobs.py benchmarks/op_trace.py gdn
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gdn_jax.ops import short_conv  # noqa: E402
from mixer_kernels.mosaic_gpu.attention import fields  # noqa: E402
from mixer_kernels.mosaic_gpu.gated_delta import vjp  # noqa: E402


def apply_environment():
    """Sets every switch its environment variable names (module docstring)."""
    for name, attribute in (("INTRA", "INTRA_BACKWARD"), ("XLA_OPERANDS", "XLA_OPERANDS"),
                            ("RESIDUALS", "RESIDUALS"), ("OUTPUTS", "OUTPUTS"),
                            ("STATE_GRADIENTS", "STATE_GRADIENTS")):
        if os.environ.get(name):
            setattr(vjp, attribute, os.environ[name])
    if os.environ.get("FIELDS"):
        fields.FIELD_PASSES = os.environ["FIELDS"]
    if os.environ.get("CONV") == "xla":
        short_conv.REGISTRY = short_conv.REGISTRY.with_default_order(("xla",))


def main(argv):
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print("error: usage: with_knobs.py SCRIPT [ARGS] | -m MODULE [ARGS]", file=sys.stderr)
        return 2
    apply_environment()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
