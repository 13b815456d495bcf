#!/usr/bin/env bash
# bench/paper_grid.sh: the paper's single-layer grid on one GPU (W = 8 virtual ranks) under link
# emulation (docs/link_emulation.md): mixtral-8x7b, qwen2-moe-2.7b and phi-3.5-moe; (EP, TP) in
# (8,1), (4,2), (2,4), (1,8); M = 4096, 8192, 16384 tokens in all (T = M / 8 per rank); once per
# link given (default 450,2 and 160,2: NVLink 4 and the paper's H800 in practice).
#
#   bench/paper_grid.sh build/tools/comet results/grid            # both default links
#   ITERS=10 CHUNKS=4 bench/paper_grid.sh build/tools/comet /tmp/grid 450,2
#
# Keeps each `comet bench layer --json` output in OUT_DIR and prints one short table
# (bench/grid_table.py). Exit code: the last failing bench's (1: a verification failed), else the
# table's (1: a file without JSON), else 0.
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
      ${CHUNKS:+--chunks "$CHUNKS"} --json >"$out/link-${link/,/-}us-ep${ep}tp${tp}.json" || status=$?
  done
done
# A bench's failure (1: a check failed, 3: it stopped) is the exit code; the table's own
# failure (a file without JSON) only when every bench succeeded.
table=0
python3 "$(dirname "$0")/grid_table.py" paper "$out" || table=$?
if [ "$status" -eq 0 ]; then status=$table; fi
exit $status
