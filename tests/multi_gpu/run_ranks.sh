#!/usr/bin/env bash
# tests/multi_gpu/run_ranks.sh N PROGRAM [ARGS...]: runs N copies of PROGRAM as the ranks of one
# node, with the variables `comet launch` sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
# COMET_BOOTSTRAP_FILE in a private temporary directory). The multi_gpu tests use it so that
# they do not depend on the launcher.
#   tests/multi_gpu/run_ranks.sh 2 build/tests/multi_gpu/nccl_fabric_multi_gpu_test
# Each rank's output is printed after the run, every line prefixed with "[rank r] ".
# Exit status: 0 when every rank exits 0; otherwise the first failing rank's status, after the
# other ranks were stopped (a failed rank must not leave its peers waiting in a collective).
set -u
if (($# < 2)) || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N PROGRAM [ARGS...]" >&2
  exit 2
fi
n=$1
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/comet-ranks-XXXXXX") || exit 2
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ((r = 0; r < n; ++r)); do
  # The subshell drops this script's traps before exec: stopped early, it must not run cleanup.
  (
    trap - EXIT INT TERM
    export RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n COMET_BOOTSTRAP_FILE="$dir/bootstrap.id"
    exec "$@" >"$dir/rank$r.log" 2>&1
  ) &
  pids+=($!)
done

status=0
for ((i = 0; i < n; ++i)); do
  wait -n
  rc=$?
  if ((rc != 0)); then
    status=$rc
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    break
  fi
done
wait
for ((r = 0; r < n; ++r)); do sed "s/^/[rank $r] /" "$dir/rank$r.log"; done
exit $status
