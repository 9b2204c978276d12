"""The trace reader (`train/tools/profile_trace.py`) on hand-written traces: totals by name on
the device timelines (or the XLA executor threads of a CPU trace), per-stream counts, sums and
spans, the newest trace only, and nothing without a trace."""

import gzip
import json
import os

from train.tools.profile_trace import device_streams, event_totals


def _write(path, events):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)


def _meta(pid, tid, process, thread):
    return [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}}]


def _event(name, pid, tid, ts, dur):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def test_device_totals_and_streams(tmp_path):
    events = (_meta(1, 7, "/device:GPU:0", "Stream #14(Compute)")
              + _meta(1, 8, "/device:GPU:0", "Stream #15(Copy)")
              + _meta(2, 3, "/host:CPU", "python")
              + [_event("kernel_a", 1, 7, 100.0, 10.0), _event("kernel_b", 1, 7, 130.0, 5.0),
                 _event("kernel_a", 1, 7, 140.0, 20.0), _event("copy", 1, 8, 0.0, 2.0),
                 _event("host_work", 2, 3, 0.0, 1000.0)])
    _write(tmp_path / "run" / "a.trace.json.gz", events)
    assert event_totals(tmp_path) == {"kernel_a": 30.0, "kernel_b": 5.0, "copy": 2.0}
    assert device_streams(tmp_path) == {"Stream #14(Compute)": (3, 35.0, 60.0),
                                        "Stream #15(Copy)": (1, 2.0, 2.0)}


def test_cpu_trace_counts_executor_threads_and_only_the_newest_trace(tmp_path):
    old = tmp_path / "old.trace.json.gz"
    _write(old, _meta(1, 1, "/host:CPU", "tf_XLAEigen/1") + [_event("stale", 1, 1, 0.0, 9.0)])
    os.utime(old, (1, 1))
    _write(tmp_path / "new.trace.json.gz",
           _meta(1, 1, "/host:CPU", "tf_XLAEigen/1") + _meta(1, 2, "/host:CPU", "python")
           + [_event("fusion.1", 1, 1, 0.0, 4.0), _event("xla::Executor::Run", 1, 1, 0.0, 50.0),
              _event("python_call", 1, 2, 0.0, 70.0)])
    assert event_totals(tmp_path) == {"fusion.1": 4.0}
    assert device_streams(tmp_path) == {}


def test_no_trace(tmp_path):
    assert event_totals(tmp_path) == {} and device_streams(tmp_path) == {}
