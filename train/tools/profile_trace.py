"""Event totals of a jax.profiler trace (no JAX import: a reader of the trace file only).

    event_totals(profile_dir) -> Counter {event name: microseconds}

Reads the newest *.trace.json.gz under profile_dir and sums its complete events by name on the
device timelines ("/device:..." processes); a trace without them (CPU) counts the XLA executor
threads instead, without their C++ scaffolding ("...::..." names). Empty without a trace.
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path


def event_totals(profile_dir: str | Path) -> collections.Counter:
    """{event name: total duration in microseconds}; see the module doc."""
    traces = sorted(Path(profile_dir).rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        return collections.Counter()
    with gzip.open(traces[-1]) as handle:
        events = json.load(handle).get("traceEvents", [])
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    on_device = any(name.startswith("/device:") for name in processes.values())

    def timeline(event) -> bool:
        if on_device:
            return processes.get(event["pid"], "").startswith("/device:")
        return (threads.get((event["pid"], event.get("tid")), "").startswith("tf_XLAEigen")
                and "::" not in event["name"])       # not the executor's own scaffolding

    totals: collections.Counter = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and timeline(event):
            totals[event["name"]] += float(event.get("dur", 0.0))
    return totals
