#!/usr/bin/env bash
# quant_h200.sh - on the GPU machine, from a folder staged by tools/device_stage.sh with peers/
# (../shared/peers) copied beside it: issue 11 item 6, pagoda and llama.cpp on the same
# quantized files of the random-weight Llama-3.1-8B shape.
# Usage: bench/quant_h200.sh prep|bench|all     (logs under $OUT; all = prep then bench)
#  prep:  builds llama.cpp (peers/run_llamacpp_cuda.sh's flags) and writes the f16 GGUF in the
#         background while the GPU tests and bench/cuda_quant run, then llama-quantize -> Q8_0
#         and Q4_K_M (kept in /tmp/llamacpp-peer for a following `bench` call on the same machine)
#  bench: llama-bench (tg128, batch 1) and llama-batched-bench (512 + 128 tokens, 1 and 64
#         parallel) and `pagoda bench` (1 and 64 requests of 512 + 128 tokens) on both files
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
W=/tmp/llamacpp-peer; mkdir -p $W
B=$W/lc/b/bin; G=$W/random-8b.gguf
what=${1:-all}
if [[ $what == prep || $what == all ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  [[ -d $W/lc ]] || tar xzf peers/llama.cpp-c392e509.tgz -C $W
  (cd $W/lc && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >$W/build.log 2>&1 &&
   cmake --build b -j 12 --target llama-bench llama-batched-bench llama-quantize >>$W/build.log 2>&1) &
  BP=$!
  [[ -f $G ]] || (python3 tools/random_gguf.py $W/lc/gguf-py $G 8b peers/ggml-vocab-llama-spm.gguf >$W/gguf.log 2>&1) &
  GP=$!
  el "GPU tests"
  .device/build/tests/gpu_bin/test_cuda_quant >"$out/test_cuda_quant.log" 2>&1; echo "test_cuda_quant rc=$?"; tail -5 "$out/test_cuda_quant.log"
  .device/build/tests/gpu_bin/test_cuda_ops >"$out/test_cuda_ops.log" 2>&1; echo "test_cuda_ops rc=$?"; tail -3 "$out/test_cuda_ops.log"
  el "bench/cuda_quant"
  .device/build/bench/cuda_quant 50 2>&1 | tee "$out/cuda_quant.log"
  el "waiting for llama.cpp build and the GGUF"
  wait $BP || { echo "llama.cpp build failed"; tail -20 $W/build.log; }
  wait $GP || { echo "gguf failed"; tail -20 $W/gguf.log; }
  el "quantize"
  [[ -f $W/q8_0.gguf ]] || $B/llama-quantize $G $W/q8_0.gguf Q8_0 16 >$W/q8.log 2>&1 || tail -5 $W/q8.log
  [[ -f $W/q4_k_m.gguf ]] || $B/llama-quantize $G $W/q4_k_m.gguf Q4_K_M 16 >$W/q4.log 2>&1 || tail -5 $W/q4.log
  ls -la $W/*.gguf
  el "pagoda batch 1 on Q4_K_M (smoke)"
  .device/build/pagoda bench -m $W/q4_k_m.gguf --device cuda --num-prompts 1 --input-len 512 --output-len 128 --temperature 0 2>&1 | tail -8
  el "prep done"
fi
if [[ $what == bench || $what == all ]]; then
  for q in q8_0 q4_k_m; do
    f=$W/$q.gguf
    el "== $q llama-bench (batch 1)"
    $B/llama-bench -m $f -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>/dev/null
    el "== $q llama-batched-bench 512+128 x 1, 64"
    $B/llama-batched-bench -m $f -ngl 99 -fa -c 100000 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,64 2>/dev/null | grep -E '^\|'
    for n in 1 64; do
      el "== $q pagoda bench $n x (512 + 128)"
      .device/build/pagoda bench -m $f --device cuda --num-prompts $n --max-num-seqs 64 --input-len 512 --output-len 128 --temperature 0 2>&1 | grep -E "memory:|KV pool|requests:|tokens:|TTFT|error"
    done
  done
  el done
fi
