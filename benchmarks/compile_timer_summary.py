"""Sums XLA's compile timers from a log made with TF_CPP_MIN_LOG_LEVEL=0 and TF_CPP_VMODULE
naming the compiler's files (benchmarks/gpu/compile_timers.sh):

    python benchmarks/compile_timer_summary.py LOG [--top 30]

Every timer line "LABEL time: X s|ms|us (...)": the HLO pass pipeline's ("HLO pass: NAME",
summed by pass) and the scoped logging timers' (summed by label, digits masked).
"""

import argparse
import collections
import gzip
import re
import sys

UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
TIMER = re.compile(r"\] (.*?) time: ([0-9.]+) ?(s|ms|us|ns) \(")


def summarise(lines):
    """({pass name: seconds}, {timer label: seconds}, {label: count})."""
    passes, timers, count = collections.Counter(), collections.Counter(), collections.Counter()
    for line in lines:
        m = TIMER.search(line)
        if m and m.group(1).startswith("HLO pass: "):
            passes[m.group(1)[len("HLO pass: "):]] += float(m.group(2)) * UNITS[m.group(3)]
        elif m:
            label = re.sub(r"0x[0-9a-f]+|[0-9]+", "#", m.group(1))[:100]
            timers[label] += float(m.group(2)) * UNITS[m.group(3)]
            count[label] += 1
    return passes, timers, count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    opener = gzip.open if args.log.endswith(".gz") else open
    with opener(args.log, "rt", errors="replace") as handle:
        passes, timers, count = summarise(handle)
    print(f"HLO passes: {sum(passes.values()):.2f} s in all")
    for name, seconds in passes.most_common(args.top):
        print(f"  {seconds:8.2f} s  {name}")
    print("timers:")
    for label, seconds in timers.most_common(args.top):
        print(f"  {seconds:8.2f} s  {count[label]:5d}x  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
