#!/usr/bin/env python3
"""bench/grid_table.py: one short table from the `comet bench layer --json` files of a grid run.

    python3 bench/grid_table.py VIEW OUT_DIR

VIEW picks the columns: `layer` (bench/layer_grid.sh: times, fused / compute-only, speedups),
`paper` (bench/paper_grid.sh: one row per link, layout and size, sorted by link), `multi`
(bench/multi_gpu_grid.sh). Reads every OUT_DIR/*.json; a file without JSON (a run that failed
before printing) is named, and the exit code is then 1. `ok` is "NO" where fused differed from
unfused, a baseline from Comet, or the split GEMMs' output from the unsplit one beyond rounding. `paper` and `multi` end with the means over the paper's
presets (per link or layout, and over all rows) next to the paper's own numbers.
"""
import glob
import json
import sys


def speedup(r, key):
    return f"{r[key]:.2f}x" if key in r else "-"


# name: (header, width (negative: left-aligned), value of a row)
COLUMNS = {
    "link": ("link", 12, lambda r: f"{r['link_gbps']:g}GB/s,{r['link_latency_us']:g}us"),
    "model": ("model", -15, lambda r: r["model"]),
    "T": ("T", 5, lambda r: r["tokens_per_rank"]),
    "M": ("M", 6, lambda r: r["world"] * r["tokens_per_rank"]),
    "layout": ("EPxTP", 6, lambda r: f"{r['ep']}x{r['tp']}"),
    "n_comm": ("n_comm", 7, lambda r: f"{r['n_comm0']}/{r['n_comm1']}"),
    # Who ran layer1's combine (LayerOptions::layer1_combine as the layer resolved it; older
    # JSON without the key: the communication blocks).
    "cb1": ("cb1", 6, lambda r: r.get("layer1_combine", "blocks")),
    "fused_us": ("fused us", 9, lambda r: f"{r['fused_us']:.0f}"),
    "fused_ms": ("fused ms", 9, lambda r: f"{r['fused_us'] / 1e3:.2f}"),
    "unfused": ("unfused", 9, lambda r: f"{r['unfused_us']:.0f}"),
    "compute": ("compute", 9, lambda r: f"{r['compute_only_us']:.0f}"),
    "comm": ("comm", 7, lambda r: f"{r['comm_only_us']:.0f}"),
    "plan": ("plan", 6, lambda r: f"{r['plan_us']:.0f}"),
    "fused/cmp": ("fused/cmp", 9, lambda r: f"{r['fused_over_compute']:.3f}"),
    "vs seq": ("vs seq", 7, lambda r: speedup(r, "speedup_over_sequential")),
    "vs chunk": ("vs chunk", 9, lambda r: speedup(r, "speedup_over_chunked")),
    "hidden": ("hidden", 7, lambda r: f"{100 * r['hidden_fraction']:.1f}%"),
    "x bound": ("x bound", 8, lambda r: f"{r['fused_over_lower_bound']:.2f}x"),
    "comm GB/s": ("comm GB/s", 10, lambda r: f"{r['comm_link_gbps']:.0f}"),
    # MoeLayer's default path (ForwardPath::kTuned) under the run's --tuning table, and its speedups.
    "path": ("path", 8, lambda r: r.get("tuned_path", "-")),
    "tuned vs seq": ("path vs seq", 12, lambda r: speedup(r, "tuned_speedup_over_sequential")),
    "tuned vs chunk": ("path vs chunk", 14, lambda r: speedup(r, "tuned_speedup_over_chunked")),
    "ok": ("ok", 3, lambda r: "yes" if r["fused_equals_unfused"] and r.get("baselines_match", True)
           and r.get("split_within_tolerance", True) else "NO"),
}
# The paper's single-layer grid (Comet, MLSys 2025): these presets, against its reported means
# over 8 H800s (average speedup of one MoE layer over the baseline; hidden communication).
PAPER_MODELS = ("mixtral-8x7b", "qwen2-moe-2.7b", "phi-3.5-moe")
PAPER_SPEEDUP, PAPER_HIDDEN = 1.96, 0.865

VIEWS = {
    "layer": ["model", "T", "n_comm", "cb1", "fused_us", "unfused", "compute", "comm", "plan", "fused/cmp", "vs seq",
              "vs chunk", "path", "ok"],
    "paper": ["link", "model", "M", "layout", "fused_ms", "vs seq", "vs chunk", "hidden", "x bound", "comm GB/s", "ok"],
    "multi": ["model", "M", "layout", "n_comm", "cb1", "fused_ms", "vs seq", "vs chunk", "hidden", "x bound", "fused/cmp",
              "path", "tuned vs seq", "tuned vs chunk", "ok"],
}


def cell(text, width):
    return f"{text:<{-width}}" if width < 0 else f"{text:>{width}}"


def mean(values):
    return sum(values) / len(values) if values else None


def summary(rows, group):
    """Lines of means over the paper's presets, per group (group(r) names it) and over all of them:
    the speedup over each baseline (arithmetic mean, as the paper reports it; also for MoeLayer's
    default path where the rows carry it: the fused or unfused forward, as the run's tuning table
    chose), the latency-based
    hidden fraction and the ratio to the lower bound, then the paper's numbers to set them against.
    Rows whose checks failed are left out (and counted); a speedup mean over fewer rows than the
    group's (rows without that baseline) says over how many."""
    ok = COLUMNS["ok"][2]
    paper = [r for r in rows if r["model"] in PAPER_MODELS and ok(r) == "yes"]
    left_out = sum(1 for r in rows if r["model"] in PAPER_MODELS and ok(r) != "yes")
    if not paper:
        return [f"mean over the paper's presets: none ({left_out} rows whose checks failed left out)"] if left_out else []
    groups = {}
    for r in paper:
        groups.setdefault(group(r), []).append(r)
    if len(groups) > 1:
        groups["all"] = paper
    lines = []
    for name, rs in groups.items():
        parts = [f"{len(rs)} rows"]
        for key, label in (("speedup_over_sequential", "vs sequential"), ("speedup_over_chunked", "vs chunked"),
                           ("tuned_speedup_over_sequential", "default path vs sequential"),
                           ("tuned_speedup_over_chunked", "default path vs chunked")):
            values = [r[key] for r in rs if key in r]
            if values:
                covered = "" if len(values) == len(rs) else f", {len(values)} rows with that baseline"
                parts.append(f"{label} {mean(values):.2f}x ({min(values):.2f}-{max(values):.2f}{covered})")
        hidden = [r["hidden_fraction"] for r in rs if "hidden_fraction" in r]
        if hidden:
            parts.append(f"hidden {100 * mean(hidden):.1f}%")
        bound = [r["fused_over_lower_bound"] for r in rs if "fused_over_lower_bound" in r]
        if bound:
            parts.append(f"x bound {mean(bound):.2f}")
        lines.append(f"mean over the paper's presets, {name}: " + ", ".join(parts))
    if left_out:
        lines.append(f"left out of the means: {left_out} rows whose checks failed (ok = NO)")
    lines.append(f"paper (8 H800s): {PAPER_SPEEDUP:.2f}x mean speedup, {100 * PAPER_HIDDEN:.1f}% hidden communication")
    return lines


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in VIEWS:
        raise SystemExit(f"usage: grid_table.py {{{','.join(VIEWS)}}} OUT_DIR")
    view, out = sys.argv[1], sys.argv[2]
    rows, missing = [], 0
    for path in sorted(glob.glob(out + "/*.json")):
        try:
            with open(path) as f:
                rows += json.load(f)
        except ValueError:
            print(f"{path}: no JSON (see the run's log)")
            missing += 1
    if view == "paper":
        rows.sort(key=lambda r: (-r["link_gbps"], r["model"], r["ep"], r["tokens_per_rank"]))
    columns = [COLUMNS[c] for c in VIEWS[view]]
    print(" ".join(cell(header, width) for header, width, _ in columns))
    for r in rows:
        print(" ".join(cell(value(r), width) for _, width, value in columns))
    if view == "multi":
        lines = summary(rows, lambda r: f"EP {r['ep']} x TP {r['tp']}")
    elif view == "paper":
        lines = summary(rows, lambda r: f"link {r['link_gbps']:g} GB/s, {r['link_latency_us']:g} us")
    else:
        lines = []
    if lines:
        print()
        print("\n".join(lines))
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
