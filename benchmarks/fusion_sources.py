"""Name the source of each costly kernel in a GPU trace: an XLA fusion's JAX op and line.

    python3 benchmarks/fusion_sources.py TRACE_DIR [HLO_DUMP_DIR] [--top 40] [--steps 3]

TRACE_DIR holds a jax.profiler trace (train/tools/profile_trace.py reads it), HLO_DUMP_DIR the
`--xla_dump_to` output of the same program with `--xla_dump_hlo_as_text`; without it only the
kernel names and their ms per step and share are printed. For the names the trace must be
taken with command buffers off (`--xla_gpu_enable_command_buffer=`): inside a CUDA graph every
kernel is reported under the graph, not under its own HLO instruction. For each of the `top`
costliest kernels it prints ms per step and the instruction's `op_name` from the optimized HLO
(the JAX name stack: which layer, which primitive, forward or transpose), plus file:line where
the metadata carries `source_file` (jax 0.11 writes a `stack_frame_id` instead, not resolved
here); Pallas kernels and library GEMMs keep their own names. Where XLA runs identical
fusions as one deduplicated kernel, all their time is reported under that kernel's name and
the op_name of the instruction that bears it.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train.tools.profile_trace import event_totals   # noqa: E402

INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{([^}]*)\}")
FIELD = re.compile(r'(op_name|source_file|source_line)=("([^"]*)"|\d+)')


def instruction_sources(dump_dir: Path) -> dict[str, str]:
    """{instruction name with '.' as '_': "op_name  file:line"} over every optimized module;
    where names repeat across modules, the largest module's (the train step's) win."""
    sources = {}
    for path in sorted(dump_dir.glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size):
        for line in path.read_text().splitlines():
            match = INSTRUCTION.match(line)
            if not match:
                continue
            fields = {m.group(1): m.group(3) or m.group(2) for m in FIELD.finditer(match.group(2))}
            where = (f"  {Path(fields['source_file']).name}:{fields.get('source_line', '?')}"
                     if "source_file" in fields else "")
            sources[match.group(1).replace(".", "_")] = f"{fields.get('op_name', '?')}{where}"
    return sources


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("dump_dir", type=Path, nargs="?")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--steps", type=int, default=3, help="steps in the trace")
    args = parser.parse_args(argv)
    totals = event_totals(args.trace_dir)
    if not totals:
        print(f"error: no trace under {args.trace_dir}", file=sys.stderr)
        return 2
    sources = instruction_sources(args.dump_dir) if args.dump_dir else {}
    whole = sum(totals.values())
    print(f"{whole / args.steps / 1e3:.1f} ms of kernel time per step ({args.steps} steps); "
          f"{len(sources)} named instructions")
    for name, micros in totals.most_common(args.top):
        source = sources.get(name.replace(".", "_"), "")
        print(f"{micros / args.steps / 1e3:8.3f} ms  {100 * micros / whole:5.1f}%  "
              f"{name[:60]:60s}  {source[:150]}")
    if not sources:
        return 0
    by_source = collections.Counter()
    for name, micros in totals.items():
        by_source[sources.get(name.replace(".", "_"), name).split("  ")[0]] += micros
    print("\nby op_name (all kernels):")
    for name, micros in by_source.most_common(args.top):
        print(f"{micros / args.steps / 1e3:8.3f} ms  {name[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
