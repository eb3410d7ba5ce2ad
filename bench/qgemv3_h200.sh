#!/usr/bin/env bash
# qgemv3_h200.sh - on the GPU machine, in ONE call: the integer-dot quantized GEMV (int8
# activations, __dp4a) and the quantized fused ops of issue 11 item 6 (branch qgemv3).
# GPU tests that run quantized weights or the fused ops (test_cuda_quant, test_cuda_gemv,
# test_cuda_ops, test_cuda_moe_act, test_cuda_model), bench/cuda_quant at T = 1/2/4/8/16 with the
# integer-dot kernel (default) and with the bf16-activation kernel (PAGODA_QGEMV_I8=0, no head),
# then `pagoda bench` on random bf16 safetensors of the Llama-3.1-8B shape
# (tools/make_dummy_model.py, made in the background meanwhile): batch 1 (1 x (512 in, 128 out))
# with bf16 weights, --isq 8 and --isq 4; 64 x (512, 128) with --isq 4; then, while the time
# allows, --isq 4 / --isq 8 at batch 1 with PAGODA_QGEMV_I8=0 (A/B).
# `grid` instead: test_cuda_quant, then bench/cuda_quant (T <= 8, no head) and the batch-1 --isq 8
# / --isq 4 runs for each PAGODA_QGEMV_STREAM_ROWS in $QGEMV3_SR (default "8 1 2": the units per
# resident warp above which the integer-dot kernel's grid is capped and every warp streams).
# Stage first (here):  tools/device_bundle.sh && tools/device_stage.sh /work/main/.gpu-NAME bench
# Run (device tool):   cd .gpu-NAME && bash bench/qgemv3_h200.sh [all|grid] 2>&1 | tee $OUT/run.log
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
budget=${QGEMV3_BUDGET_S:-470} # seconds after which the optional runs are skipped
left() { (( $(date +%s) - t0 < budget )); }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
(python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/m8b >/tmp/dummy.log 2>&1) &
DP=$!
bench8b() { # name [VAR=value...] pagoda bench args
  local name=$1; shift
  el "pagoda bench 8B: $name"
  env "$@" --device cuda --temperature 0 --json 2>>"$out/bench8b.err" | tee -a "$out/bench8b.json"; echo
  grep -E "^error" "$out/bench8b.err" | tail -2
}
one=(--num-prompts 1 --input-len 512 --output-len 128)
if [[ ${1:-all} == grid ]]; then
  el test_cuda_quant
  $B/tests/gpu_bin/test_cuda_quant >>"$out/tests.log" 2>&1; echo "test_cuda_quant rc=$?"; tail -1 "$out/tests.log"
  for sr in ${QGEMV3_SR:-8 1 2}; do
    el "bench/cuda_quant 20 8 3, PAGODA_QGEMV_STREAM_ROWS=$sr"
    PAGODA_QGEMV_STREAM_ROWS=$sr $B/bench/cuda_quant 20 8 3 >"$out/cuda_quant_sr$sr.txt"
    awk '$4 == 1' "$out/cuda_quant_sr$sr.txt"
  done
  el "waiting for the 8B model"
  wait $DP || { echo "make_dummy_model failed"; tail -5 /tmp/dummy.log; }
  for sr in ${QGEMV3_SR:-8 1 2}; do
    for q in 8 4; do
      bench8b "--isq $q batch 1, PAGODA_QGEMV_STREAM_ROWS=$sr" PAGODA_QGEMV_STREAM_ROWS=$sr $P bench -m /tmp/m8b --isq $q "${one[@]}"
    done
  done
  el done
  exit 0
fi
for t in test_cuda_quant test_cuda_gemv test_cuda_ops test_cuda_moe_act test_cuda_model; do
  el "$t"
  $B/tests/gpu_bin/$t >>"$out/tests.log" 2>&1; echo "$t rc=$?"
  grep -E "FAIL|rel L2 .* >=|passed|failed" "$out/tests.log" | tail -4
done
el "bench/cuda_quant 20 16: integer-dot kernel (default)"
$B/bench/cuda_quant 20 16 | tee "$out/cuda_quant_i8.txt"
el "bench/cuda_quant 20 8 3: bf16-activation kernel (PAGODA_QGEMV_I8=0), no head"
PAGODA_QGEMV_I8=0 $B/bench/cuda_quant 20 8 3 | tee "$out/cuda_quant_f.txt"
el "waiting for the 8B model"
wait $DP || { echo "make_dummy_model failed"; tail -5 /tmp/dummy.log; }
bench8b "bf16 batch 1" $P bench -m /tmp/m8b "${one[@]}"
bench8b "--isq 8 batch 1" $P bench -m /tmp/m8b --isq 8 "${one[@]}"
bench8b "--isq 4 batch 1" $P bench -m /tmp/m8b --isq 4 "${one[@]}"
left && bench8b "--isq 4 64 x (512, 128)" $P bench -m /tmp/m8b --isq 4 --num-prompts 64 --input-len 512 --output-len 128
left && bench8b "--isq 4 batch 1, PAGODA_QGEMV_I8=0" PAGODA_QGEMV_I8=0 $P bench -m /tmp/m8b --isq 4 "${one[@]}"
left && bench8b "--isq 8 batch 1, PAGODA_QGEMV_I8=0" PAGODA_QGEMV_I8=0 $P bench -m /tmp/m8b --isq 8 "${one[@]}"
el done
