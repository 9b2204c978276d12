"""The joined table and the JSON of a benchmark run (used by benchmarks/harness.py).

    join_rows      every side's rows in shape order, each with
                   fwd_ratio, fwdbwd_ratio    time / the anchor entry's time on the same shape
                   fwd_tflops, fwdbwd_tflops  the benchmark's nominal flops / time
                   fwdbwd_ceiling_percent     fwd+bwd TFLOP/s / the bf16 matmul rate of the run
    format_table   one aligned text table (optional columns only when some row has a value),
                   then notes: timing rule, memory sources, skipped sides, failed entries
    write_json     the whole run, indented
"""

import json
from pathlib import Path
from typing import Optional

from benchmarks import timing


def shape_tag(shape):
    return "x".join(str(n) for n in shape)


def join_rows(benchmark, args, results):
    """All rows in shape order (JAX entries first), with ratios to the anchor and TFLOP/s."""
    rows = [row for side in ("jax", "torch") for row in results.get(side, {}).get("rows", [])]
    ceiling = results.get("jax", {}).get("info", {}).get("matmul_tflops")
    order = {shape_tag(shape): index for index, shape in enumerate(benchmark.shapes(args))}
    rows.sort(key=lambda row: order.get(shape_tag(row["shape"]), len(order)))
    anchors = {shape_tag(row["shape"]): row for row in rows if row["name"] == args.anchor}
    for row in rows:
        anchor = anchors.get(shape_tag(row["shape"]), {})
        fwd_flops, fwdbwd_flops = benchmark.flops(tuple(row["shape"]))
        for key, flops in (("fwd", fwd_flops), ("fwdbwd", fwdbwd_flops)):
            ms, anchor_ms = row.get(f"{key}_ms"), anchor.get(f"{key}_ms")
            row[f"{key}_ratio"] = ms / anchor_ms if ms and anchor_ms else None
            row[f"{key}_tflops"] = timing.tflops(flops, ms)
        if ceiling and row.get("fwdbwd_tflops"):
            row["fwdbwd_ceiling_percent"] = 100 * row["fwdbwd_tflops"] / ceiling
    return rows


def _number(value, spec):
    return None if value is None else format(value, spec)


def _rate(value):
    """TFLOP/s: one decimal from 10 up, three significant digits below (CPU rates)."""
    return None if value is None else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _pair(first, second, fmt):
    if first is None and second is None:
        return None
    return f"{fmt(first) or 'n/a'}/{fmt(second) or 'n/a'}"


def _mib(nbytes):
    return None if nbytes is None else nbytes / 2 ** 20


TABLE_COLUMNS = (  # (header, cell); a cell is a string or None (shown as "-")
    ("op", lambda r, anchor: r["name"]),
    ("shape", lambda r, anchor: str(tuple(r["shape"]))),
    ("fwd ms", lambda r, anchor: _number(r.get("fwd_ms"), ".3f")),
    ("x {anchor}", lambda r, anchor: _number(r.get("fwd_ratio"), ".2f")),
    ("fwd+bwd ms", lambda r, anchor: _number(r.get("fwdbwd_ms"), ".3f")),
    ("x {anchor}", lambda r, anchor: _number(r.get("fwdbwd_ratio"), ".2f")),
    ("TFLOP/s f/fb", lambda r, anchor: _pair(r.get("fwd_tflops"), r.get("fwdbwd_tflops"), _rate)),
    ("% ceil fb", lambda r, anchor: _number(r.get("fwdbwd_ceiling_percent"), ".1f")),
    ("peak MiB f/fb", lambda r, anchor: _pair(_mib(r.get("fwd_bytes")), _mib(r.get("fwdbwd_bytes")),
                                              lambda x: _number(x, ".1f"))),
    ("rel err", lambda r, anchor: _number(r.get("rel_err"), ".2e")),
)
ALWAYS_SHOWN = 6  # the first columns; the others only when some row has a value


def format_table(benchmark, args, results, rows):
    headers = [header.format(anchor=args.anchor) for header, _ in TABLE_COLUMNS]
    headers[1] = benchmark.shape_header
    cells = [[cell(row, args.anchor) for _, cell in TABLE_COLUMNS] for row in rows]
    keep = [i for i in range(len(headers))
            if i < ALWAYS_SHOWN or any(line[i] is not None for line in cells)]
    table = [[headers[i] for i in keep]] + [[line[i] or "-" for i in keep] for line in cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(keep))]
    aligned = lambda line: "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                                     for i, (cell, w) in enumerate(zip(line, widths)))

    jax_info = results.get("jax", {}).get("info", {})
    precision = "bf16" if args.device == "gpu" else "float32"
    lines = ["", f"{benchmark.title}: {precision}, "
                 f"{jax_info.get('device', args.device)} (jax {jax_info.get('jax', '?')})"]
    if jax_info.get("matmul_tflops"):
        lines.append(f"bf16 8192^3 matmul in this run: {jax_info['matmul_tflops']:.0f} TFLOP/s "
                     f"(the ceiling for '% ceil')")
    lines += [aligned(line) for line in table]
    timed = (f"{args.repeats} calls" if args.calls_per_sample == 1 else
             f"{args.repeats} samples of {args.calls_per_sample} back-to-back calls (per call)")
    lines.append(f"ms: median of {timed} after {args.warmup} warm-up calls; "
                 f"x {args.anchor}: time / its time on the same shape")
    lines.append("peak: JAX = compiled arguments + outputs + scratch; torch = CUDA allocator "
                 "peak during one call")
    if benchmark.flops_note:
        lines.append(benchmark.flops_note)
    for side in ("jax", "torch"):
        result = results.get(side)
        if result is None:
            lines.append(f"{side} side: not run" + (" (--torch adds it)" if side == "torch"
                                                    else ""))
        elif "skipped" in result or "failed" in result:
            lines.append(f"{side} side: {result.get('skipped') or result.get('failed')}")
        for note in result.get("notes", []) if result else []:
            lines.append(f"{side} side: {note}")
    for row in rows:
        if row.get("error"):
            lines.append(f"{row['side']} {row['name']} {tuple(row['shape'])}: {row['error']}")
    return "\n".join(lines)


def write_json(path: Optional[Path], payload):
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {path}")
