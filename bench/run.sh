#!/usr/bin/env bash
# run.sh - `make bench`: the quick CPU benchmarks whose results bench/RESULTS.md records
# (scheduler cost per step, CPU matmul against the copy bandwidth, pagoda bench on stories260K).
# Usage: bench/run.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" -j "$(nproc)" --target bench_scheduler cpu_matmul pagoda_cli >/dev/null
echo "== scheduler + KV manager cost per step, 256 running sequences (block size 32, prefix cache on)"
"$build/bench/bench_scheduler" 256 4000 32 1
echo "== CPU matmul (one thread) vs memory copy bandwidth"
"$build/bench/cpu_matmul" 1 0.5
model=${PAGODA_TESTDATA:-../shared/testdata}/models/stories260K.gguf
if [[ -f $model ]]; then
  echo "== pagoda bench, stories260K, mixed lengths 64..1984 (block size 32)"
  "$build/pagoda" bench -m "$model" --num-prompts 64 --input-len 1024 --random-range-ratio 0.9375 \
    --output-len 32 --seed 1 --json
  echo "== pagoda bench, stories260K, 1024-token shared prefix over 64 requests"
  "$build/pagoda" bench -m "$model" --num-prompts 64 --input-len 1100 --shared-prefix-len 1024 \
    --output-len 32 --seed 1 --json
else
  echo "stories260K not found at $model: skipping the end-to-end runs"
fi
