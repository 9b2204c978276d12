"""`python -m train` with the GDN and attention kernels' module switches set from the
environment, for the GPU scripts beside this file (unset or empty: the library's default):

    INTRA         "xla" | "pallas"          mixer_kernels/mosaic_gpu/gated_delta/vjp.py INTRA_BACKWARD
    XLA_OPERANDS  "float32" | "16-bit"      vjp.XLA_OPERANDS
    RESIDUALS     "internals" | "inputs"    vjp.RESIDUALS
    OUTPUTS       "xla" | "pallas"          vjp.OUTPUTS
    STATE_GRADIENTS  "xla" | "pallas"       vjp.STATE_GRADIENTS
    CONV          "xla"                     the short convolutions without their kernel backward
    CONV_DX       "on" | "off"              .../short_conv/backward.py DX_IN_KERNEL
    FIELDS        "by_level" | "kernels" | "all_levels"   .../attention/fields.py FIELD_PASSES
    BARRIERS      "automatic" | "explicit"  mixer_kernels/mosaic_gpu/common.py KERNEL_BARRIERS
    DKV_QUERY_MIN "on" | "off"              .../attention/backward.py DKV_QUERY_MIN_PATH

    python3 benchmarks/gpu/train_with_knobs.py bench gdn_125m --context 2048 --batch-size 8
"""

import os
import sys

from gdn_jax.ops import short_conv
from mixer_kernels.mosaic_gpu import common
from mixer_kernels.mosaic_gpu.attention import backward, fields
from mixer_kernels.mosaic_gpu.short_conv import backward as conv_backward
from mixer_kernels.mosaic_gpu.gated_delta import vjp
from train.cli.entry import main

for name, attribute in (("INTRA", "INTRA_BACKWARD"), ("XLA_OPERANDS", "XLA_OPERANDS"),
                        ("RESIDUALS", "RESIDUALS"), ("OUTPUTS", "OUTPUTS"),
                        ("STATE_GRADIENTS", "STATE_GRADIENTS")):
    if os.environ.get(name):
        setattr(vjp, attribute, os.environ[name])
if os.environ.get("FIELDS"):
    fields.FIELD_PASSES = os.environ["FIELDS"]
if os.environ.get("BARRIERS"):
    common.KERNEL_BARRIERS = os.environ["BARRIERS"]
if os.environ.get("DKV_QUERY_MIN"):
    backward.DKV_QUERY_MIN_PATH = os.environ["DKV_QUERY_MIN"] == "on"
if os.environ.get("CONV_DX"):
    conv_backward.DX_IN_KERNEL = os.environ["CONV_DX"] == "on"
if os.environ.get("CONV") == "xla":
    short_conv.REGISTRY = short_conv.REGISTRY.with_default_order(("xla",))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
