#!/usr/bin/env python3
"""bench/trace_summary.py: what each fused kernel of a `--trace` run spent its time on.

    python3 bench/trace_summary.py TRACE.json [--rank R]

Reads the Chrome/Perfetto JSON that `comet bench layer --trace` and `comet run --trace` write
(src/io/trace_writers.cpp) and prints, per (rank, layer, kind), in order of first begin: events,
first begin and last end (us from the trace's first event), span (end - begin) and the sum of
the events' durations. Kinds: `layer` (the kernel's extent), `comm` (chunks moved), `gemm`
(tiles), `wait` (signal waits). Reading it: a layer's span against the GEMM alone (`comet bench
gemm`) is the fused kernel's overhead; comm ending after gemm is a combine tail; the gap between
one rank's layer and the next rank's is the launch (ranks take turns on one GPU).

Then, per (rank, layer), the communication the GEMM hid: of the time during which some block
moved data (the union of the comm events), the share during which some block also ran a GEMM
tile (the union of the gemm events). This is the timeline's view of hidden communication (the
paper's metric), where `comet bench layer`'s `hidden` column compares latencies instead.
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, help="only this rank")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events["traceEvents"]
    stats = collections.defaultdict(lambda: [0, float("inf"), 0.0, 0.0])  # n, begin, end, busy
    spans = collections.defaultdict(list)  # (rank, layer, kind) -> [(begin, end)]
    for e in events:
        if e.get("ph") != "X" or (args.rank is not None and e["pid"] != args.rank):
            continue
        spans[(e["pid"], e["args"]["layer"], e["cat"])].append((e["ts"], e["ts"] + e["dur"]))
        s = stats[(e["pid"], e["args"]["layer"], e["cat"])]
        s[0] += 1
        s[1] = min(s[1], e["ts"])
        s[2] = max(s[2], e["ts"] + e["dur"])
        s[3] += e["dur"]
    if not stats:
        raise SystemExit("no events")
    t0 = min(s[1] for s in stats.values())
    print(f"{'rank':>4} {'layer':>5} {'kind':<6} {'events':>7} {'begin us':>10} {'end us':>10} {'span us':>9} {'busy us':>11}")
    for key in sorted(stats, key=lambda k: (stats[k][1], k)):
        n, begin, end, busy = stats[key]
        print(f"{key[0]:>4} {key[1]:>5} {key[2]:<6} {n:>7} {begin - t0:>10.1f} {end - t0:>10.1f} {end - begin:>9.1f} {busy:>11.1f}")
    print(f"\n{'rank':>4} {'layer':>5} {'comm us':>9} {'hidden us':>10} {'hidden':>7}")
    for rank, layer in sorted({(k[0], k[1]) for k in spans if k[2] == "comm"}):
        comm = union(spans[(rank, layer, "comm")])
        gemm = union(spans.get((rank, layer, "gemm"), []))
        total = sum(e - b for b, e in comm)
        hidden = overlap(comm, gemm)
        print(f"{rank:>4} {layer:>5} {total:>9.1f} {hidden:>10.1f} {100 * hidden / total if total else 0:>6.1f}%")


def union(intervals):
    """Sorted, disjoint cover of the intervals."""
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def overlap(a, b):
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


if __name__ == "__main__":
    main()
