#!/usr/bin/env bash
# qgemv_h200.sh - on the GPU machine, in ONE call: the quantized decode GEMV of issue 11 item 6.
# The device-to-device copy bandwidth (torch), test_cuda_quant with each GEMV kernel
# (PAGODA_QGEMV_KERNEL=1 the default, 0 direct, 3 staged one row per warp, 4 staged with the
# grid capped) and the other GPU tests that run quantized weights (test_cuda_gemv,
# test_cuda_moe_act), bench/cuda_quant (T <= 8 for the default, T = 1 for the others), then
# `pagoda bench` at batch 1 (1 x (512 in, 128 out)) on random bf16 safetensors of the
# Llama-3.1-8B shape (tools/make_dummy_model.py, made in the background meanwhile) with bf16
# weights, --isq 8 and --isq 4 (default kernel), --isq 8 also with kernels 3 and 0.
# Stage first (here):  tools/device_bundle.sh -DCMAKE_CUDA_ARCHITECTURES=90 &&
#                      tools/device_stage.sh /work/main/.gpu-NAME bench
# Run (device tool):   cd .gpu-NAME && bash bench/qgemv_h200.sh [micro|e2e|all] 2>&1 | tee $OUT/run.log
# Logs under $OUT (few files: the device tool brings back at most 8).
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
what=${1:-all}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
DP=
if [[ $what != micro ]]; then
  (python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/m8b >/tmp/dummy.log 2>&1) &
  DP=$!
fi
if [[ $what != e2e ]]; then
  el "copy bandwidth (torch, 2 GiB device to device)"
  python3 - <<'EOF'
import torch
n = 2 << 30
x = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e) / 20
print(f"copy: {ms:.3f} ms per 2 GiB, {2 * n / ms / 1e6:.0f} GB/s read + write")
EOF
  for k in 1 0 3 4; do
    el "test_cuda_quant, PAGODA_QGEMV_KERNEL=$k"
    PAGODA_QGEMV_KERNEL=$k $B/tests/gpu_bin/test_cuda_quant >>"$out/tests.log" 2>&1; echo "rc=$?"
    grep -E "FAIL|passed|failed" "$out/tests.log" | tail -3
  done
  for t in test_cuda_gemv test_cuda_moe_act; do
    el "$t"
    $B/tests/gpu_bin/$t >>"$out/tests.log" 2>&1; echo "rc=$?"; tail -1 "$out/tests.log"
  done
  el "bench/cuda_quant, default kernel (1)"
  PAGODA_QGEMV_KERNEL=1 $B/bench/cuda_quant 30 8 | tee "$out/cuda_quant_k1.txt"
  for k in 3 4 0; do
    el "bench/cuda_quant T = 1, kernel $k (3: staged one row per warp; 4: staged, grid capped; 0: direct)"
    PAGODA_QGEMV_KERNEL=$k $B/bench/cuda_quant 30 1 3 | tee "$out/cuda_quant_k$k.txt"
  done
fi
if [[ -n $DP ]]; then
  el "waiting for the 8B model"
  wait $DP || { echo "make_dummy_model failed"; tail -5 /tmp/dummy.log; }
  for run in none:1 8:1 4:1 8:3 8:0; do
    isq=${run%:*} k=${run#*:}
    a=(); [[ $isq != none ]] && a=(--isq "$isq")
    el "pagoda bench 8B batch 1, isq=$isq, PAGODA_QGEMV_KERNEL=$k"
    PAGODA_QGEMV_KERNEL=$k $P bench -m /tmp/m8b --device cuda "${a[@]}" --num-prompts 1 --input-len 512 \
      --output-len 128 --temperature 0 --json 2>>"$out/bench8b.err" | tee -a "$out/bench8b.json"; echo
    grep -E "^error" "$out/bench8b.err" | tail -2
  done
fi
el done
