"""The SASS lines with the most warp-stall samples per kernel, from Nsight Compute's source page.

    ncu -i REPORT --page source --csv --print-source sass | gzip > sass.csv.gz
    python benchmarks/ncu_sass_hotspots.py sass.csv.gz [--top 25] [--kernel REGEX]
    ncu -i REPORT --page raw --csv | python benchmarks/ncu_sass_hotspots.py --raw -

Per kernel: the warp instructions executed by opcode, the total stall samples, the samples by
instruction class (the opcode before the first dot: MUFU, BAR, LDS, HGMMA, ...) and the top
lines with their leading stall reasons. With --raw, the input is the raw metrics page and the
output each kernel's warp stall reasons (average warps stalled per issued instruction).
"""

import argparse
import collections
import csv
import gzip
import re
import sys


def kernels(lines):
    """Yield (kernel name, header, rows) from the source page's CSV (one block per kernel)."""
    name, header, rows = None, None, []
    for row in csv.reader(lines):
        if row and row[0] == "Kernel Name":
            if name is not None:
                yield name, header, rows
            name, header, rows = row[1], None, []
        elif header is None and row and row[0] == "Address":
            header = row
        elif header is not None and row:
            rows.append(row)
    if name is not None:
        yield name, header, rows


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def stall_reasons(lines, top):
    """Print each kernel's `top` stall reasons from the raw metrics page's CSV."""
    rows = list(csv.reader(lines))
    head, data = rows[0], rows[2:]   # the second row holds the units
    keep = [i for i, h in enumerate(head)
            if "issue_stalled_" in h and h.endswith("per_issue_active.ratio")]
    for r in data:
        print("--", r[head.index("Kernel Name")][:60])
        for value, h in sorted(((number(r[i]), head[i]) for i in keep), reverse=True)[:top]:
            print(f"   {value:12.3f}  {h}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the source page as CSV (.csv or .csv.gz; - for stdin)")
    parser.add_argument("--raw", action="store_true", help="the input is the raw metrics page")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--kernel", default=".", help="regex on the kernel name")
    args = parser.parse_args(argv)
    if args.source == "-":
        handle = sys.stdin
    else:
        handle = (gzip.open if args.source.endswith(".gz") else open)(args.source, "rt")
    with handle:
        if args.raw:
            stall_reasons(handle, args.top)
            return 0
        for name, header, rows in kernels(handle):
            if not re.search(args.kernel, name) or header is None:
                continue
            col = {h: i for i, h in enumerate(header)}
            samples = col["Warp Stall Sampling (All Samples)"]
            executed = col.get("Instructions Executed")
            reasons = [h for h in header if h.startswith("stall_")]
            total = sum(number(r[samples]) for r in rows) or 1.0
            by_class, by_reason = collections.Counter(), collections.Counter()
            by_opcode = collections.Counter()
            for r in rows:
                opcode = r[col["Source"]].split()
                opcode = [w for w in opcode if not w.startswith("@")]
                by_class[opcode[0].split(".")[0] if opcode else "?"] += number(r[samples])
                if executed is not None:
                    by_opcode[opcode[0] if opcode else "?"] += number(r[executed])
                for h in reasons:
                    by_reason[h] += number(r[col[h]])
            instructions = sum(number(r[executed]) for r in rows) if executed is not None else 0
            print(f"== {name}: {len(rows)} SASS lines, {total:.0f} stall samples, "
                  f"{instructions:.3g} warp instructions executed")
            print("   executed (M): " + ", ".join(f"{k} {v / 1e6:.1f}"
                                               for k, v in by_opcode.most_common(14)))
            print("   by class: " + ", ".join(f"{k} {v / total:.1%}"
                                             for k, v in by_class.most_common(12)))
            print("   by reason: " + ", ".join(f"{k[6:]} {v / total:.1%}"
                                              for k, v in by_reason.most_common(8)))
            top = sorted(rows, key=lambda r: -number(r[samples]))[: args.top]
            for r in top:
                lead = sorted(((number(r[col[h]]), h[6:]) for h in reasons), reverse=True)[:2]
                why = ", ".join(f"{h} {v:.0f}" for v, h in lead if v)
                print(f"   {number(r[samples]) / total:6.1%}  {r[col['Source']].strip()[:60]:60s}  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
