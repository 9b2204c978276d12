"""What a preset's layers keep for their backward pass, by source line (no GPU needed).

    python benchmarks/saved_residuals.py gdn_125m [softmax_rope_125m ...] [--context 2048]
        [--batch-size 8] [--top 20] [--gdn-residuals internals|inputs]

Traces the loss of a 1- and a 2-layer model of each preset (autodiff residuals, before XLA:
XLA may fuse away cheap elementwise ones, so this is an upper bound of what stays in memory)
with the kernels chosen as on a Hopper GPU, and prints the MiB one more layer adds, by the
line of this repository (or library) that made each residual, largest first.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src.ad_checkpoint import saved_residuals  # noqa: E402

from mixer_core import registry  # noqa: E402


def residual_bytes(preset, layers, context, batch_size):
    """Counter {(origin, dtype, shape): bytes} of the loss's residuals."""
    from train.core.model import build_model   # after main() has set the platform
    from train.core.presets import load_config
    config = load_config(preset, [f"model.num_layers={layers}"])
    model = build_model(config, 32768)
    tokens = jnp.zeros((batch_size, context), jnp.int32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    found = collections.Counter()
    for aval, origin in saved_residuals(lambda p: model.apply(p, tokens, tokens).mean(), params):
        if "from the argument" in origin:
            continue
        where = origin.split(" from ")[-1].replace(os.getcwd() + "/", "")
        found[(where, str(aval.dtype), tuple(aval.shape))] += aval.size * aval.dtype.itemsize
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--gdn-residuals", choices=("internals", "inputs"),
                        help="what the gated delta rule's kernels keep (vjp.RESIDUALS; "
                             "default: the module's setting)")
    args = parser.parse_args()
    if args.gdn_residuals:
        from mixer_kernels.mosaic_gpu.gated_delta import vjp
        vjp.RESIDUALS = args.gdn_residuals
    # the ops read platform_facts when first imported: set it before train imports them
    registry.platform_facts = lambda: {"platform": "gpu", "compute_capability": "9.0"}
    for preset in args.presets:
        one, two = (residual_bytes(preset, n, args.context, args.batch_size) for n in (1, 2))
        per_layer = collections.Counter(two)
        per_layer.subtract(one)
        total = sum(per_layer.values())
        print(f"{preset}: {total / 2**20:.1f} MiB of residuals per layer at "
              f"{args.batch_size} x {args.context}")
        for (where, dtype, shape), size in per_layer.most_common(args.top):
            if size > 0:
                print(f"  {size / 2**20:8.1f} MiB  {dtype:9s} {str(shape):22s} {where[:90]}")


if __name__ == "__main__":
    main()
