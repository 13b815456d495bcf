#!/usr/bin/env bash
# bench/layer_grid.sh: every preset on one GPU with W = 8 virtual ranks (EP 8, Loopback fabric),
# T = 1024, 4096, 8192 tokens per rank (deepseek-v3: 1024, 4096; its 8192 does not fit one GPU),
# with both baselines: fused / compute-only (docs/gpu_layer.md) and the speedups, in one table.
#
#   bench/layer_grid.sh build/tools/comet /tmp/layer-grid
#   ITERS=10 EXTRA="--n-comm0 32 --n-comm1 2" bench/layer_grid.sh build/tools/comet /tmp/g mixtral-8x7b
#
# One process per preset, so that one workload's memory cannot affect the next. Keeps each
# `comet bench layer --json` output in OUT_DIR. Environment: ITERS (20), WARMUP_MS (100), CHUNKS
# (2,4), TUNING (a tuning table for n_comm 0), EXTRA (more `bench layer` options). Exit code: the
# last failing bench's, else 0.
set -euo pipefail
comet=${1:?usage: bench/layer_grid.sh COMET OUT_DIR [PRESET ...]}
out=${2:?usage: bench/layer_grid.sh COMET OUT_DIR [PRESET ...]}
shift 2
models=("$@")
if [ ${#models[@]} -eq 0 ]; then models=(mixtral-8x7b qwen2-moe-2.7b phi-3.5-moe qwen3-30b-a3b deepseek-v3); fi
mkdir -p "$out"
status=0
for m in "${models[@]}"; do
  tokens=1024,4096,8192
  if [ "$m" = deepseek-v3 ]; then tokens=1024,4096; fi
  # shellcheck disable=SC2086  # EXTRA is a list of options
  "$comet" bench layer --models "$m" --tokens "$tokens" --ep 8 --iters "${ITERS:-20}" \
    --warmup-ms "${WARMUP_MS:-100}" --chunks "${CHUNKS:-2,4}" ${TUNING:+--tuning "$TUNING"} ${EXTRA:-} \
    --json >"$out/$m.json" || status=$?
done
python3 - "$out" <<'PY'
import glob, json, sys
rows = []
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    with open(path) as f:
        rows += json.load(f)
print(f"{'model':<15} {'T':>5} {'n_comm':>7} {'fused us':>9} {'unfused':>9} {'compute':>9} {'comm':>7} {'plan':>6} "
      f"{'fused/cmp':>9} {'vs seq':>7} {'vs chunk':>9} {'ok':>3}")
for r in rows:
    seq = f"{r['speedup_over_sequential']:.2f}x" if "speedup_over_sequential" in r else "-"
    chunk = f"{r['speedup_over_chunked']:.2f}x" if "speedup_over_chunked" in r else "-"
    ok = r["fused_equals_unfused"] and r.get("baselines_match", True)
    print(f"{r['model']:<15} {r['tokens_per_rank']:>5} {str(r['n_comm0']) + '/' + str(r['n_comm1']):>7} "
          f"{r['fused_us']:>9.0f} {r['unfused_us']:>9.0f} {r['compute_only_us']:>9.0f} {r['comm_only_us']:>7.0f} "
          f"{r['plan_us']:>6.0f} {r['fused_over_compute']:>9.3f} {seq:>7} {chunk:>9} {'yes' if ok else 'NO':>3}")
PY
exit $status
