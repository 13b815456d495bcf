#!/usr/bin/env python3
"""Tests of bench/trace_summary.py on a made-up trace: the per-kind table and the hidden share."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_summary  # noqa: E402


def event(cat, ts, dur, layer, pid=0):
    return {"name": cat, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 0, "args": {"layer": layer}}


def main():
    assert trace_summary.union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [[0, 3], [5, 8]]
    assert trace_summary.overlap([[0, 3], [5, 8]], [[2, 6]]) == 2.0
    assert trace_summary.overlap([[0, 1]], []) == 0.0
    # Layer 0: comm 0-10 and 5-20 (union 20 us), gemm 10-30: 10 us hidden (50%).
    # Layer 1: comm 100-110 inside gemm 90-120: 100%.
    events = [event("comm", 0, 10, 0), event("comm", 5, 15, 0), event("gemm", 10, 20, 0),
              event("gemm", 90, 30, 1), event("comm", 100, 10, 1)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": events}, f)
    try:
        out = subprocess.run([sys.executable, trace_summary.__file__, f.name], check=True, capture_output=True,
                             text=True).stdout
    finally:
        os.unlink(f.name)
    rows = [line.split() for line in out.splitlines() if line.strip()]
    hidden = {(r[0], r[1]): (r[2], r[3], r[4]) for r in rows if len(r) == 5 and r[4].endswith("%")}
    assert hidden[("0", "0")] == ("20.0", "10.0", "50.0%"), out
    assert hidden[("0", "1")] == ("10.0", "10.0", "100.0%"), out
    assert any(r[:3] == ["0", "0", "comm"] and r[3] == "2" for r in rows), out
    print("trace_summary: ok")


if __name__ == "__main__":
    main()
