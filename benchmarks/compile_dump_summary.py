"""Summarise an XLA GPU dump of a compiled program (`XLA_FLAGS=--xla_dump_to=DIR
--xla_dump_hlo_as_text`): how many fusions the optimised HLO runs, how many distinct fused
computations they call, the custom calls by target, and how many kernels the PTX defines.

    python benchmarks/compile_dump_summary.py DIR [--module-re REGEX]

XLA compiles one kernel per distinct fusion and reuses it for identical fusions, so
"PTX kernels" well below "fusions" means the layers share their compiled kernels; a count
that grows with the layers means each layer's glue is compiled again.
"""

import argparse
import collections
import glob
import os
import re


def hlo_counts(text):
    """(fusion calls, distinct fused computations, {custom-call target: count}) of an HLO text."""
    fusions = re.findall(r"\bfusion\(.*?calls=(%?[\w.\-]+)", text)
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
    return len(fusions), len(set(fusions)), dict(targets)


def ptx_kernels(paths):
    """(kernels, bytes) over PTX files: `.entry` definitions and total size."""
    kernels, size = 0, 0
    for path in paths:
        with open(path, errors="replace") as f:
            text = f.read()
        kernels += len(re.findall(r"^\s*\.(?:visible\s+)?\.?entry\s", text, flags=re.M))
        size += len(text)
    return kernels, size


def summarise(directory, module_re):
    pattern = re.compile(module_re)
    hlo = [p for p in glob.glob(os.path.join(directory, "*after_optimizations.txt"))
           if pattern.search(os.path.basename(p))]
    if not hlo:
        return f"{directory}: no optimised HLO matching {module_re!r}"
    lines = []
    for path in sorted(hlo):
        with open(path) as f:
            text = f.read()
        calls, distinct, targets = hlo_counts(text)
        stem = os.path.basename(path).split("after_optimizations")[0].rstrip("._")
        module = stem.split(".")[0]   # module_NNNN: the PTX files' prefix
        kernels, size = ptx_kernels(glob.glob(os.path.join(directory, module + ".*ptx")))
        lines.append(f"{stem}: {calls} fusion calls, {distinct} distinct fused computations, "
                     f"PTX kernels {kernels} ({size / 1e6:.1f} MB), HLO {len(text) / 1e6:.1f} MB, "
                     f"custom calls {targets}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--module-re", default="guarded",
                        help="only the modules whose dump name matches (default: the train step)")
    args = parser.parse_args()
    print(summarise(args.directory, args.module_re))


if __name__ == "__main__":
    main()
