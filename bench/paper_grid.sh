#!/usr/bin/env bash
# bench/paper_grid.sh: the paper's single-layer grid on one GPU (W = 8 virtual ranks) under link
# emulation (docs/link_emulation.md): mixtral-8x7b, qwen2-moe-2.7b and phi-3.5-moe; (EP, TP) in
# (8,1), (4,2), (2,4), (1,8); M = 4096, 8192, 16384 tokens in all (T = M / 8 per rank); once per
# link given (default 450,2 and 160,2: NVLink 4 and the paper's H800 in practice).
#
#   bench/paper_grid.sh build/tools/comet results/grid            # both default links
#   ITERS=10 CHUNKS=4 bench/paper_grid.sh build/tools/comet /tmp/grid 450,2
#
# Keeps each `comet bench layer --json` output in OUT_DIR and prints one short table. Exit code:
# the last failing bench's (1: a verification failed), else 0.
set -euo pipefail
comet=${1:?usage: bench/paper_grid.sh COMET OUT_DIR [GBPS,LATENCY_US ...]}
out=${2:?usage: bench/paper_grid.sh COMET OUT_DIR [GBPS,LATENCY_US ...]}
shift 2
links=("$@")
# shellcheck disable=SC2054  # GBPS,LATENCY pairs, commas intended
if [ ${#links[@]} -eq 0 ]; then links=(450,2 160,2); fi
mkdir -p "$out"
status=0
for link in "${links[@]}"; do
  for layout in 8x1 4x2 2x4 1x8; do
    ep=${layout%x*} tp=${layout#*x}
    "$comet" bench layer --models mixtral-8x7b,qwen2-moe-2.7b,phi-3.5-moe --tokens 512,1024,2048 \
      --ep "$ep" --tp "$tp" --emulate-link "$link" --iters "${ITERS:-20}" --warmup-ms "${WARMUP_MS:-100}" \
      --chunks "${CHUNKS:-2,4}" --json >"$out/link-${link/,/-}us-ep${ep}tp${tp}.json" || status=$?
  done
done
python3 - "$out" <<'EOF'
import glob, json, sys
rows = []
for path in sorted(glob.glob(sys.argv[1] + "/link-*.json")):
    with open(path) as f:
        rows += json.load(f)
rows.sort(key=lambda r: (-r["link_gbps"], r["model"], r["ep"], r["tokens_per_rank"]))
print(f"{'link':>12} {'model':<15} {'M':>6} {'EPxTP':>6} {'fused ms':>9} {'vs seq':>7} {'vs chunk':>9} "
      f"{'hidden':>7} {'x bound':>8} {'comm GB/s':>10} {'ok':>3}")
for r in rows:
    link = f"{r['link_gbps']:g}GB/s,{r['link_latency_us']:g}us"
    seq = f"{r['speedup_over_sequential']:.2f}x" if "speedup_over_sequential" in r else "-"
    chunk = f"{r['speedup_over_chunked']:.2f}x" if "speedup_over_chunked" in r else "-"
    ok = r["fused_equals_unfused"] and r.get("baselines_match", True)
    print(f"{link:>12} {r['model']:<15} {r['world'] * r['tokens_per_rank']:>6} {str(r['ep']) + 'x' + str(r['tp']):>6} "
          f"{r['fused_us'] / 1e3:>9.2f} {seq:>7} {chunk:>9} {100 * r['hidden_fraction']:>6.1f}% "
          f"{r['fused_over_lower_bound']:>7.2f}x {r['comm_link_gbps']:>10.0f} {'yes' if ok else 'NO':>3}")
EOF
exit $status
