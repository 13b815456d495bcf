#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p $OUT/r
s0=$(date +%s)
B=$OUT/r/summary.txt
el() { echo "$(( $(date +%s) - s0 )) s"; }
one() {  # label env model tokens ep
  local label=$1; shift
  env $1 timeout 40 build/tools/comet bench layer --models $2 --tokens $3 --ep $4 --iters 3 --warmup-ms 10 --json > $OUT/r/$label.json 2> $OUT/r/$label.err
  echo "$label rc=$? $(el) $(python3 -c "
import json,sys
d=json.load(open('$OUT/r/$label.json'))
rows=d['rows'] if isinstance(d,dict) and 'rows' in d else d
for r in (rows if isinstance(rows,list) else [rows]):
  print('eq',r.get('fused_equals_unfused'),'base',r.get('baselines_match'),'rel',r.get('baseline_rel_l2'),'ht',r.get('half_tiles'))
" 2>&1 | tr '\n' ' ')" >> $B
}
one q3-1024-ht0 COMET_HALF_TILES=0 qwen3-30b-a3b 1024 1
one q3-1024-ht1 COMET_HALF_TILES=1 qwen3-30b-a3b 1024 1
one q3-512 X=1 qwen3-30b-a3b 512 1
one q3-2048 X=1 qwen3-30b-a3b 2048 1
one q3-1024-ep2 X=1 qwen3-30b-a3b 1024 2
one q2-1024 X=1 qwen2-moe-2.7b 1024 1
one q2-1024-ht1 COMET_HALF_TILES=1 qwen2-moe-2.7b 1024 1
one ds-512 X=1 deepseek-v3 512 1
for m in qwen3-30b-a3b qwen2-moe-2.7b; do
  timeout 60 build/tools/comet run --backend cuda --model $m --ep 1 --tokens 1024 > $OUT/r/run-$m.txt 2>&1; echo "run $m rc=$? $(grep -h verify $OUT/r/run-$m.txt | head -1)" >> $B
done
cat $B; head -c 600 $OUT/r/q3-1024-ht0.err
