#!/usr/bin/env python3
"""Tests of bench/grid_table.py on made-up `comet bench layer --json` rows: the paper-preset means."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grid_table  # noqa: E402


def row(model, ep, tp, seq, chunked, hidden, bound, T=2048):
    return {"model": model, "ep": ep, "tp": tp, "world": ep * tp, "tokens_per_rank": T, "n_comm0": 32, "n_comm1": 2,
            "fused_us": 1000.0, "unfused_us": 1100.0, "compute_only_us": 900.0, "comm_only_us": 100.0, "plan_us": 40.0,
            "fused_over_compute": 1.11, "speedup_over_sequential": seq, "speedup_over_chunked": chunked,
            "hidden_fraction": hidden, "fused_over_lower_bound": bound, "fused_equals_unfused": True,
            "baselines_match": True}


def run_script(view, rows):
    """grid_table.py VIEW on a directory holding `rows` as one JSON file; it must exit 0."""
    with tempfile.TemporaryDirectory() as out:
        with open(os.path.join(out, "grid.json"), "w") as f:
            json.dump(rows, f)
        done = subprocess.run([sys.executable, grid_table.__file__, view, out], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def main():
    rows = [row("mixtral-8x7b", 2, 1, 1.2, 1.5, 0.0, 1.3), row("phi-3.5-moe", 2, 1, 1.6, 2.5, 0.5, 1.5),
            row("qwen2-moe-2.7b", 1, 2, 2.0, 3.0, 1.0, 2.0),
            row("qwen3-30b-a3b", 2, 1, 9.0, 9.0, 1.0, 9.0)]  # not a paper preset: left out of the means
    lines = grid_table.summary(rows, lambda r: f"EP {r['ep']} x TP {r['tp']}")
    assert lines[0] == ("mean over the paper's presets, EP 2 x TP 1: 2 rows, vs sequential 1.40x (1.20-1.60), "
                        "vs chunked 2.00x (1.50-2.50), hidden 25.0%, x bound 1.40"), lines
    assert lines[1].startswith("mean over the paper's presets, EP 1 x TP 2: 1 rows, vs sequential 2.00x"), lines
    assert lines[2].startswith("mean over the paper's presets, all: 3 rows, vs sequential 1.60x (1.20-2.00)"), lines
    assert lines[3] == "paper (8 H800s): 1.96x mean speedup, 86.5% hidden communication", lines
    # One group: no separate "all" line; rows without baselines leave those means out.
    bare = dict(rows[0])
    del bare["speedup_over_sequential"], bare["speedup_over_chunked"]
    one = grid_table.summary([bare], lambda r: "x")
    assert one[0] == "mean over the paper's presets, x: 1 rows, hidden 0.0%, x bound 1.30", one
    assert len(one) == 2, one
    assert grid_table.summary([rows[3]], lambda r: "x") == []
    # A speedup mean over fewer rows than the group says so; rows whose checks failed are left out.
    failed = dict(rows[1], fused_equals_unfused=False)
    mixed = grid_table.summary([bare, rows[0], failed], lambda r: "x")
    assert mixed[0] == ("mean over the paper's presets, x: 2 rows, vs sequential 1.20x (1.20-1.20, 1 rows with that "
                        "baseline), vs chunked 1.50x (1.50-1.50, 1 rows with that baseline), hidden 0.0%, x bound 1.30"), mixed
    assert mixed[1] == "left out of the means: 1 rows whose checks failed (ok = NO)", mixed
    assert grid_table.summary([failed], lambda r: "x") == [
        "mean over the paper's presets: none (1 rows whose checks failed left out)"]
    # The script: the table, then the means (multi view), exit code 0.
    done = run_script("multi", rows)
    assert "mean over the paper's presets, all: 3 rows" in done.stdout, done.stdout
    assert done.stdout.index("qwen3-30b-a3b") < done.stdout.index("mean over"), done.stdout
    # The paper view groups by link, latency included.
    linked = [dict(r, link_gbps=450.0, link_latency_us=lat, comm_link_gbps=300.0) for r, lat in zip(rows, (2, 2, 10, 2))]
    done = run_script("paper", linked)
    assert "mean over the paper's presets, link 450 GB/s, 2 us: 2 rows" in done.stdout, done.stdout
    assert "mean over the paper's presets, link 450 GB/s, 10 us: 1 rows" in done.stdout, done.stdout
    # The default path's speedups (rows of a run with --tuning) get their own means and columns;
    # rows without them (older JSON) show "-" there.
    tuned = [dict(rows[0], tuned_path="unfused", tuned_speedup_over_sequential=1.1, tuned_speedup_over_chunked=1.4),
             dict(rows[1], tuned_path="fused", tuned_speedup_over_sequential=1.6, tuned_speedup_over_chunked=2.5)]
    lines = grid_table.summary(tuned, lambda r: "x")
    assert lines[0] == ("mean over the paper's presets, x: 2 rows, vs sequential 1.40x (1.20-1.60), vs chunked 2.00x "
                        "(1.50-2.50), default path vs sequential 1.35x (1.10-1.60), default path vs chunked 1.95x "
                        "(1.40-2.50), hidden 25.0%, x bound 1.40"), lines
    done = run_script("multi", tuned + [rows[2]])
    table = done.stdout.splitlines()
    assert "path vs seq" in table[0], done.stdout
    assert "unfused" in table[1] and "1.10x" in table[1], done.stdout
    assert table[3].split()[-4:-1] == ["-", "-", "-"], done.stdout
    # Who ran layer1's combine: the row's layer1_combine, "blocks" for JSON without it.
    done = run_script("layer", [dict(rows[0], layer1_combine="gemm"), rows[1]])
    table = done.stdout.splitlines()
    assert table[0].split()[3] == "cb1", done.stdout
    assert table[1].split()[3] == "gemm" and table[2].split()[3] == "blocks", done.stdout
    # A row whose split GEMMs left bf16 rounding of the unsplit output (bench exit 1) is not ok,
    # and stays out of the means, like any failed check.
    split_off = dict(rows[0], split_within_tolerance=False)
    done = run_script("layer", [split_off, rows[1]])
    table = done.stdout.splitlines()
    assert table[1].split()[-1] == "NO" and table[2].split()[-1] == "yes", done.stdout
    assert grid_table.summary([split_off], lambda r: "x") == [
        "mean over the paper's presets: none (1 rows whose checks failed left out)"]
    print("grid_table: ok")


if __name__ == "__main__":
    main()
