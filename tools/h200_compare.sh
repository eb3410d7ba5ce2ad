#!/usr/bin/env bash
# h200_compare.sh - on the GPU machine, in ONE call: pagoda next to llama.cpp (../shared/peers,
# commit c392e509, CUDA, flash attention) on the SAME random-weight f16 GGUF of the Llama-3.2-1B or
# Llama-3.1-8B shape (tools/random_gguf.py; peers/make_random_gguf.py makes the same shapes in minutes),
# so that every ratio of issue 9's table comes
# from one run. The llama.cpp build and the GGUF are made in the background while the GPU tests
# (1b: three rounds, as `make test-gpu` three times in a row) and the attention
# microbenchmarks (bench/cuda_attention next to torch SDPA) use the GPU; the timed runs start after
# the build, on an otherwise idle machine.
# Stage first (here):  tools/device_bundle.sh && tools/device_stage.sh .gpu-cmp bench &&
#                      cp -r ../shared/peers .gpu-cmp/peers && cp ../shared/testdata/vocab/ggml-vocab-llama-spm.gguf .gpu-cmp/peers/
# Run (device tool):   cd .gpu-cmp && bash tools/h200_compare.sh 1b|8b      (logs under $OUT)
# 8b also requantizes the GGUF with llama-quantize to Q8_0 and Q4_K_M (issue 11 item 6) and runs
# both engines on those files, and pagoda with --isq 8 on the f16 file, while time remains.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
shape=${1:?1b or 8b}
W=/tmp/llamacpp-peer; mkdir -p $W
B=$W/lc/b/bin; G=$W/random-$shape.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[[ -d $W/lc ]] || tar xzf peers/llama.cpp-c392e509.tgz -C $W
(cd $W/lc && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >$W/build.log 2>&1 &&
 cmake --build b -j 12 --target llama-bench llama-batched-bench llama-quantize >>$W/build.log 2>&1) &
BP=$!
[[ -f $G ]] || (python3 tools/random_gguf.py $W/lc/gguf-py $G $shape peers/ggml-vocab-llama-spm.gguf >$W/gguf.log 2>&1) &
GP=$!
if [[ $shape == 1b ]]; then
  for round in 1 2 3; do
    el "GPU tests, round $round"
    mkdir -p "$out/gpu$round"; OUT=$out/gpu$round tools/device_run.sh gpu 2>&1 | grep -E "PASS|FAIL|SKIP|passed"
  done
  el "bench/cuda_attention + torch SDPA"
  .device/build/bench/cuda_attention 7 >"$out/cuda_attention.log" 2>&1; tail -1 "$out/cuda_attention.log" | head -c 2000; echo
  python3 peers/torch_attention_peers.py "$out/torch.json" >"$out/torch.log" 2>&1 || tail -5 "$out/torch.log"
  cat "$out/torch.json" 2>/dev/null | head -c 1500; echo
fi
el "waiting for the llama.cpp build and the GGUF"
wait $BP || { echo "llama.cpp build failed"; tail -20 $W/build.log; }
wait $GP || { echo "gguf failed"; tail -20 $W/gguf.log; }
ls -la $G
if [[ $shape == 1b ]]; then NTG=256; NPL=1,64,128; else NTG=128; NPL=1,64; fi
el "llama.cpp llama-bench (pp512, tg128)"
$B/llama-bench -m $G -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>/dev/null | tee "$out/llamacpp_bench_$shape.txt"
el "llama.cpp llama-batched-bench 512 + $NTG x $NPL"
$B/llama-batched-bench -m $G -ngl 99 -fa -c 140000 -b 2048 -ub 512 -npp 512 -ntg $NTG -npl $NPL 2>/dev/null | grep -E '^\|' |
  tee "$out/llamacpp_batched_$shape.txt"
pb() { # label, then pagoda bench args
  local label=$1; shift
  el "pagoda $label"
  "$P" bench -m $G --device cuda "$@" --json 2>"$out/pagoda_$label.err" | tee "$out/pagoda_$label.json"; echo
  grep -E "error" "$out/pagoda_$label.err" | head -3
}
pb "${shape}_b1" --num-prompts 1 --input-len 512 --output-len 128 --temperature 0
PAGODA_CUDA_GRAPHS=0 pb "${shape}_b1_nographs" --num-prompts 1 --input-len 512 --output-len 128 --temperature 0
pb "${shape}_p64" --num-prompts 64 --input-len 512 --output-len $NTG --temperature 0
if [[ $shape == 1b ]]; then
  pb 1b_p128 --num-prompts 128 --input-len 512 --output-len 256 --temperature 0
  pb 1b_256_greedy --num-prompts 256 --input-len 512 --output-len 256 --temperature 0
  pb 1b_256_t1 --num-prompts 256 --input-len 512 --output-len 256 --temperature 1.0
  pb 1b_p64_paged_off --num-prompts 64 --input-len 512 --output-len 256 --temperature 0 --paged-attn off
  pb 1b_p64_f8 --num-prompts 64 --input-len 512 --output-len 256 --temperature 0 --pa-cache-type f8e4m3
fi
if [[ $shape == 8b ]]; then
  for q in Q8_0 Q4_K_M; do
    (( $(date +%s) - t0 > 420 )) && { echo "skipping $q: out of time"; continue; }
    f=$W/random-8b-$q.gguf
    el "llama-quantize $q"
    $B/llama-quantize $G $f $q 16 >$W/quant_$q.log 2>&1 || tail -3 $W/quant_$q.log
    el "llama.cpp $q"
    $B/llama-bench -m $f -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>/dev/null | tee "$out/llamacpp_bench_8b_$q.txt"
    $B/llama-batched-bench -m $f -ngl 99 -fa -c 140000 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,64 2>/dev/null |
      grep -E '^\|' | tee "$out/llamacpp_batched_8b_$q.txt"
    G=$f pb "8b_${q}_b1" --num-prompts 1 --input-len 512 --output-len 128 --temperature 0
    G=$f pb "8b_${q}_p64" --num-prompts 64 --input-len 512 --output-len 128 --temperature 0
  done
  (( $(date +%s) - t0 > 520 )) || pb 8b_isq8_b1 --num-prompts 1 --input-len 512 --output-len 128 --temperature 0 --isq 8
fi
el "done"
