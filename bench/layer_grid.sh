#!/usr/bin/env bash
# bench/layer_grid.sh: every preset on one GPU with W = 8 virtual ranks (EP 8, Loopback fabric),
# T = 1024, 4096, 8192 tokens per rank (deepseek-v3: 1024, 4096; its 8192 does not fit one GPU),
# with both baselines: fused / compute-only (docs/gpu_layer.md) and the speedups, in one table.
#
#   bench/layer_grid.sh build/tools/comet /tmp/layer-grid
#   ITERS=10 EXTRA="--n-comm0 32 --n-comm1 2" bench/layer_grid.sh build/tools/comet /tmp/g mixtral-8x7b
#
# One process per preset, so that one workload's memory cannot affect the next. Keeps each
# `comet bench layer --json` output in OUT_DIR; the table is bench/grid_table.py's. Environment: ITERS (20), WARMUP_MS (100), CHUNKS
# (2,4), TUNING (a tuning table for n_comm 0), EXTRA (more `bench layer` options). Exit code: the
# last failing bench's, else the table's (1: a file without JSON), else 0.
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
    --warmup-ms "${WARMUP_MS:-100}" ${CHUNKS:+--chunks "$CHUNKS"} ${TUNING:+--tuning "$TUNING"} ${EXTRA:-} \
    --json >"$out/$m.json" || status=$?
done
# A bench's failure (1: a check failed, 3: it stopped) is the exit code; the table's own
# failure (a file without JSON) only when every bench succeeded.
table=0
python3 "$(dirname "$0")/grid_table.py" layer "$out" || table=$?
if [ "$status" -eq 0 ]; then status=$table; fi
exit $status
