#!/usr/bin/env bash
# prenorm_probe_h200.sh - on the GPU machine (kind nvidia-h200), in ONE call: where batch-1 decode
# time goes on the Llama-3.2-1B shape (issue 9), and which prologue shape the bf16 GEMV's fused
# RMSNorm wants (gpunext_h200.sh found it 0.035 ms per token SLOWER than the separate norm at
# ROWS:LOOP:L2 = 8:1:1; this script found 8:1:0 the shape that pays, bench/RESULTS.md).
#   1. the GPU tests (tools/device_run.sh gpu);
#   2. `pagoda bench` 1 x (512, 128) greedy on a random f16 GGUF of the 1B shape
#      (tools/random_gguf.py, made in the background meanwhile): PAGODA_FUSED_NORM=0, then
#      the fused norm with each ROWS:LOOP:L2 of $PROBE_CFGS, twice, interleaved; digests must
#      all be equal;
#   3. ncu (--clock-control none, gpu__time_duration) over a short greedy run with CUDA graphs
#      off, fused norm on and off: each kernel's duration in the LAST decode step, summed by
#      kernel name (tools/ncu_step.py; summary in $OUT/ncu_*.txt): the kernels' own time against the step's TPOT.
# Stage: as gpunext_h200.sh (peers + the llama vocab beside the bundle). Run:
#   cd .gpu-next && bash bench/prenorm_probe_h200.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
cfgs=${PROBE_CFGS:-8:1:1 8:1:0 8:2:1 8:4:1 16:2:1 16:4:1 4:4:1 16:4:0}
W=/tmp/llamacpp-peer; mkdir -p $W
G=$W/random-1b.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
echo "commit $(cat COMMIT 2>/dev/null)"
[[ -d $W/lc ]] || tar xzf peers/llama.cpp-c392e509.tgz -C $W
[[ -f $G ]] || (python3 tools/random_gguf.py $W/lc/gguf-py $G 1b peers/ggml-vocab-llama-spm.gguf >$W/gguf.log 2>&1) &
GP=$!
el "GPU tests (tools/device_run.sh gpu)"
mkdir -p "$out/gpu"; OUT=$out/gpu tools/device_run.sh gpu 2>&1 | grep -E "PASS|FAIL|SKIP|passed|rel|differ|CHECK" | head -40
wait $GP || { echo "gguf failed"; tail -20 $W/gguf.log; }

run() { # LABEL [VAR=value...]: one batch-1 bench on $G, TPOT p50 and digest on one line
  local label=$1; shift
  local json
  json=$(env "$@" "$P" bench -m "$G" --device cuda --json --temperature 0 --num-prompts 1 --input-len 512 \
    --output-len 128 2>>"$out/bench.err" | tail -1)
  echo "$label | $*: $json" >>"$out/bench.json"
  python3 - "$label $*" "$json" <<'EOF'
import json, sys
try:
    j = json.loads(sys.argv[2])
    print(f"{sys.argv[1]:60s} TPOT p50 {j['tpot_ms']['p50']:.4f} ms  digest {j['output_digest']}")
except Exception as e:
    print(sys.argv[1], "NO RESULT", e, sys.argv[2][:200])
EOF
}
el "1B batch 1: fused norm off, then on with ROWS:LOOP:L2 in ($cfgs), twice"
for rep in 1 2; do
  run "norm off #$rep" PAGODA_FUSED_NORM=0
  for c in $cfgs; do
    IFS=: read -r rows loop l2 <<<"$c"
    run "norm $c #$rep" PAGODA_GEMV_PRE_ROWS="$rows" PAGODA_GEMV_PRE_LOOP="$loop" PAGODA_GEMV_PRE_L2="$l2"
  done
done
python3 - "$out/bench.json" <<'EOF'
import json, sys
d = set(json.loads(l.split(": ", 1)[1])["output_digest"] for l in open(sys.argv[1]) if ": {" in l)
print("digests", sorted(d), "ALL EQUAL" if len(d) == 1 else "DIFFER")
EOF

NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -n $NCU ]]; then
  for fn in 1 0; do
    el "ncu, PAGODA_FUSED_NORM=$fn, graphs off: 24 prompt tokens, 6 new"
    PAGODA_CUDA_GRAPHS=0 PAGODA_FUSED_NORM=$fn timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
      --csv --print-units base "$P" run -m "$G" --device cuda --temperature 0 -n 6 --ignore-eos \
      -p "one two three four five six seven eight nine ten eleven twelve" >"$out/ncu_norm$fn.csv" 2>"$out/ncu_norm$fn.err"
    echo "ncu rc=$?"
    python3 tools/ncu_step.py "$out/ncu_norm$fn.csv" | tee "$out/ncu_norm_summary_$fn.txt"
  done
else
  echo "no ncu"
fi
el "done"
