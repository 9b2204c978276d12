"""Event totals of a jax.profiler trace (no JAX import: a reader of the trace file only).

    event_totals(profile_dir) -> Counter {event name: microseconds}
    device_streams(profile_dir) -> {stream name: (events, summed us, span us)}

Both read the newest *.trace.json.gz under profile_dir. `event_totals` sums its complete events
by name on the device timelines ("/device:..." processes); a trace without them (CPU) counts
the XLA executor threads instead, without their C++ scaffolding ("...::..." names). Empty
without a trace. `device_streams` takes the device timelines' threads (one per stream): how
many events, their summed duration and the span from the first start to the last end (span =
sum means the stream never idled between them).
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path


def _newest_trace(profile_dir):
    """(complete events, {pid: process name}, {(pid, tid): thread name}) of the newest trace,
    or None without one."""
    traces = sorted(Path(profile_dir).rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        return None
    with gzip.open(traces[-1]) as handle:
        events = json.load(handle).get("traceEvents", [])
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return [e for e in events if e.get("ph") == "X"], processes, threads


def _on_device(event, processes) -> bool:
    return processes.get(event["pid"], "").startswith("/device:")


def event_totals(profile_dir: str | Path) -> collections.Counter:
    """{event name: total duration in microseconds}; see the module doc."""
    totals: collections.Counter = collections.Counter()
    trace = _newest_trace(profile_dir)
    if trace is None:
        return totals
    events, processes, threads = trace
    on_device = any(name.startswith("/device:") for name in processes.values())

    def timeline(event) -> bool:
        if on_device:
            return _on_device(event, processes)
        return (threads.get((event["pid"], event.get("tid")), "").startswith("tf_XLAEigen")
                and "::" not in event["name"])       # not the executor's own scaffolding

    for event in events:
        if timeline(event):
            totals[event["name"]] += float(event.get("dur", 0.0))
    return totals


def device_streams(profile_dir: str | Path) -> dict:
    """{device stream (thread) name: (events, summed us, span us)}; see the module doc."""
    trace = _newest_trace(profile_dir)
    if trace is None:
        return {}
    events, processes, threads = trace
    by_stream = collections.defaultdict(list)
    for event in events:
        if _on_device(event, processes):
            by_stream[threads.get((event["pid"], event.get("tid")), "?")].append(event)
    return {name: (len(evs), sum(float(e.get("dur", 0.0)) for e in evs),
                   max(e["ts"] + e.get("dur", 0.0) for e in evs) - min(e["ts"] for e in evs))
            for name, evs in by_stream.items()}
