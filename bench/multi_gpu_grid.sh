#!/usr/bin/env bash
# bench/multi_gpu_grid.sh: the paper's single-layer grid on N real GPUs of one host, one process
# per GPU (Nccl fabric, started by `comet launch`): mixtral-8x7b, qwen2-moe-2.7b, phi-3.5-moe at
# total tokens M = 4096, 8192, 16384 (T = M / N per rank) for every (EP, TP) with EP x TP = N,
# then the communication-heavy presets (qwen3-30b-a3b, deepseek-v3 at T = 4096, 8192, EP = N).
#
#   bench/multi_gpu_grid.sh build/tools/comet /tmp/grid-x2 2
#   ITERS=10 bench/multi_gpu_grid.sh build/tools/comet /tmp/grid-x8 8
#
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Keeps rank 0's `--json` output per run in
# OUT_DIR (NAME.json; every rank's stdout and stderr in NAME.out and NAME.log) and prints one
# table (bench/grid_table.py). Environment: ITERS (20), CHUNKS (2,4), EXTRA (more `bench layer`
# options). Exit code: the last failing run's (or the table's, when a run left no JSON), else 0.
set -euo pipefail
comet=${1:?usage: bench/multi_gpu_grid.sh COMET OUT_DIR N}
out=${2:?usage: bench/multi_gpu_grid.sh COMET OUT_DIR N}
n=${3:?usage: bench/multi_gpu_grid.sh COMET OUT_DIR N}
export NCCL_NVLS_ENABLE=0
mkdir -p "$out"
status=0
run() {  # run NAME bench-layer-options...: rank 0's JSON (the launcher prefixes every line)
  local name=$1
  shift
  # shellcheck disable=SC2086  # EXTRA is a list of options
  "$comet" launch -n "$n" -- "$comet" bench layer --fabric nccl --iters "${ITERS:-20}" ${CHUNKS:+--chunks "$CHUNKS"} \
    ${EXTRA:-} --json "$@" >"$out/$name.out" 2>"$out/$name.log" || status=$?
  sed -n 's/^\[rank 0\] //p' "$out/$name.out" >"$out/$name.json"
}
tokens=$((4096 / n)),$((8192 / n)),$((16384 / n))
for ((ep = n; ep >= 1; ep /= 2)); do
  run "paper-ep${ep}tp$((n / ep))" --ep "$ep" --tp $((n / ep)) --models mixtral-8x7b,qwen2-moe-2.7b,phi-3.5-moe \
    --tokens "$tokens"
done
run "heavy-ep$n" --ep "$n" --models qwen3-30b-a3b,deepseek-v3 --tokens 4096,8192
# A bench's failure (1: a check failed, 3: it stopped) is the exit code; the table's own
# failure (a file without JSON) only when every bench succeeded.
table=0
python3 "$(dirname "$0")/grid_table.py" multi "$out" || table=$?
if [ "$status" -eq 0 ]; then status=$table; fi
exit $status
