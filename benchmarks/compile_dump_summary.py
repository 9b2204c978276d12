"""Summarise an XLA GPU dump of a compiled program (`XLA_FLAGS=--xla_dump_to=DIR
--xla_dump_hlo_as_text`): how many fusions the optimised HLO runs, its custom calls by target,
and how much of its text those custom calls take (a Mosaic GPU call carries its kernel's whole
module in its backend config, once per call site: once per layer after XLA inlines the layers).

    python benchmarks/compile_dump_summary.py DIR [--module-re REGEX]
"""

import argparse
import collections
import glob
import os
import re


def hlo_counts(text):
    """(fusion calls, {custom-call target: count}, {custom-call target: characters of its
    lines}) of an HLO text."""
    fusions = len(re.findall(r"\bfusion\(", text))
    targets, sizes = collections.Counter(), collections.Counter()
    for line in text.splitlines():
        match = re.search(r'custom_call_target="([^"]+)"', line)
        if match:
            targets[match.group(1)] += 1
            sizes[match.group(1)] += len(line)
    return fusions, dict(targets), dict(sizes)


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
        fusions, targets, sizes = hlo_counts(text)
        stem = os.path.basename(path).split("after_optimizations")[0].rstrip("._")
        calls = ", ".join(f"{name} {count} ({sizes[name] / 1e6:.1f} MB)"
                          for name, count in sorted(targets.items()))
        lines.append(f"{stem}: HLO {len(text) / 1e6:.1f} MB, {fusions} fusion calls, "
                     f"custom calls: {calls or 'none'}")
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
