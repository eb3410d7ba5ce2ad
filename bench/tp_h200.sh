#!/usr/bin/env bash
# tp_h200.sh - on nvidia-h200-x2, in one device call: the tensor-parallel GPU test (every fixture,
# CUDA graphs and the peer all-reduce on and off), the all-reduce microbenchmark (peer vs NCCL,
# 8 KiB .. 8 MiB), --tp 2 against --tp 1 through the engine (greedy text of stories260K), then
# `pagoda bench` on the Llama-3.1-8B shape (tools/make_dummy_model.py) at --tp 1 and --tp 2, batch 1
# and 64 parallel x (512 in, 128 out), --tp 2 also with PAGODA_ASYNC_STEPS=0, PAGODA_CUDA_GRAPHS=0,
# PAGODA_TP_CUSTOM_AR=0 (NCCL, so no graphs) and the last with the first (the state before this
# work), and the logits of the 1B and 8B shapes at --tp 2 against --tp 1.
# TP_QUICK=1 stops after the four --tp 1 / --tp 2 runs, plus batch 1 with PAGODA_GEMV_RING=0.
# Every GPU command runs under `timeout`; logs go to /tmp/tp_logs (the caller tars them into $OUT).
# Stage first (here): tools/device_bundle.sh && tools/device_stage.sh /work/main/.gpu-tpgraph bench;
# there: cd .gpu-tpgraph && bash bench/tp_h200.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=/tmp/tp_logs; mkdir -p "$out" # tarred into $OUT by the caller (at most 8 files come back)
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PAGODA_BACKEND_PATH="$root/.device/build" PAGODA_FIXTURES="$root/tests/fixtures"
export NCCL_NVLS_ENABLE=0 # KINDS.md: NVLink multicast stays off
P=$root/.device/build/pagoda
el() { echo "== $(date -u +%T) $*"; }
el "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvidia-smi topo -m | head -4
echo "commit $(cat "$root/COMMIT" 2>/dev/null)"
M8=/tmp/llama-8b M1=/tmp/llama-1b
(python3 tools/make_dummy_model.py --shape llama-3.1-8b --out $M8 && python3 tools/make_dummy_model.py --shape llama-3.2-1b --out $M1) \
  >"$out/make_models.log" 2>&1 & MP=$!
el "test_tp_cuda (fixtures; graphs and peer all-reduce on/off)"
timeout 75 .device/build/tests/gpu_bin/test_tp_cuda >"$out/test_tp_cuda.log" 2>&1; rc=$?; echo "rc=$rc"
grep -v "^\[pagoda" "$out/test_tp_cuda.log" | tail -30
[[ $rc == 124 ]] && { echo "test_tp_cuda timed out: stopping here"; tail -5 "$out/test_tp_cuda.log"; exit 1; }
el "tp_allreduce (peer vs NCCL)"
timeout 40 .device/build/bench/tp_allreduce 2 200 >"$out/tp_allreduce.log" 2>&1; echo "rc=$?"
grep -v "^\[pagoda" "$out/tp_allreduce.log" | tail -14
el "engine: stories260K greedy, --tp 1 vs --tp 2"
S=$root/.device/testdata/models/stories260K.gguf
for tp in 1 2; do
  timeout 30 "$P" run -m "$S" --device cuda --tp $tp --raw -p "Once upon a time" --temperature 0 -n 64 \
    >"$out/stories_tp$tp.txt" 2>"$out/stories_tp$tp.err"; echo "tp $tp rc=$?"
done
cmp "$out/stories_tp1.txt" "$out/stories_tp2.txt" && echo "stories260K greedy: --tp 2 output equals --tp 1" ||
  { echo "stories260K greedy DIFFERS"; tail -3 "$out"/stories_tp*.err; }
el "waiting for the models"
wait $MP || tail -5 "$out/make_models.log"
pb() { # label, then pagoda bench args
  local label=$1; shift
  el "pagoda bench $label"
  timeout 45 "$P" bench -m $M8 --device cuda --max-num-seqs 64 --input-len 512 --output-len 128 --temperature 0 \
    "$@" --json 2>"$out/bench_$label.err" >"$out/bench_$label.json"; echo "rc=$?"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("output_tok_per_s", d["output_tok_per_s"], "tpot_p50", d["tpot_ms"]["p50"], "ttft_p50", d["ttft_ms"]["p50"], "digest", d["output_digest"], "elapsed_s", d["elapsed_s"])' \
    "$out/bench_$label.json" 2>/dev/null || head -c 400 "$out/bench_$label.json"
  grep -E "error|capturing|step timing" "$out/bench_$label.err" | head -3
}
export PAGODA_STEP_TIMING=1 # rank 0's GPU busy / idle per asynchronous step, in the .err logs
pb tp1_b1 --tp 1 --num-prompts 1
pb tp2_b1 --tp 2 --num-prompts 1
pb tp1_p64 --tp 1 --num-prompts 64
pb tp2_p64 --tp 2 --num-prompts 64
unset PAGODA_STEP_TIMING
if [[ -n ${TP_QUICK:-} ]]; then # TP_QUICK=1: after the four runs above, only batch 1 with the ring GEMVs off
  PAGODA_GEMV_RING=0 pb tp1_b1_noring --tp 1 --num-prompts 1
  PAGODA_GEMV_RING=0 pb tp2_b1_noring --tp 2 --num-prompts 1
  el "done (TP_QUICK)"
  exit 0
fi
PAGODA_ASYNC_STEPS=0 pb tp2_b1_sync --tp 2 --num-prompts 1
PAGODA_ASYNC_STEPS=0 pb tp2_p64_sync --tp 2 --num-prompts 64
PAGODA_TP_CUSTOM_AR=0 PAGODA_ASYNC_STEPS=0 pb tp2_b1_before --tp 2 --num-prompts 1
PAGODA_TP_CUSTOM_AR=0 PAGODA_ASYNC_STEPS=0 pb tp2_p64_before --tp 2 --num-prompts 64
grep -h "step timing" "$out"/bench_tp*_b1.err "$out"/bench_tp*_p64.err
el "logits: 1B and 8B shapes, --tp 2 vs --tp 1 (test_tp_cuda with PAGODA_TP_LOGITS_MODELS)"
PAGODA_TP_LOGITS_MODELS=$M1:$M8 timeout 100 .device/build/tests/gpu_bin/test_tp_cuda >"$out/test_tp_logits.log" 2>&1
echo "rc=$?"; grep -E "llama-(1|8)b|passed|FAIL" "$out/test_tp_logits.log" | tail -6
PAGODA_CUDA_GRAPHS=0 pb tp2_b1_nographs --tp 2 --num-prompts 1
PAGODA_CUDA_GRAPHS=0 pb tp2_p64_nographs --tp 2 --num-prompts 64
PAGODA_TP_CUSTOM_AR=0 pb tp2_b1_nccl --tp 2 --num-prompts 1
PAGODA_TP_CUSTOM_AR=0 pb tp2_p64_nccl --tp 2 --num-prompts 64
el "done"
