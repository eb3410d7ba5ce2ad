#!/usr/bin/env bash
# device_check_all.sh - on the GPU machine, from a folder staged by tools/device_stage.sh: the GPU
# tests (tools/device_run.sh gpu), then the Llama-3.2-1B shape (random bf16 safetensors made by
# tools/make_dummy_model.py) at batch 1 with bf16 weights and with --isq 8 / --isq 4, and
# `--isq 8` greedy text on the CUDA and CPU backends side by side. Logs under $OUT.
# Usage: tools/device_check_all.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
P=$root/.device/build/pagoda
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
el "GPU tests"
tools/device_run.sh gpu
el "1B shape"
python3 tools/make_dummy_model.py --shape llama-3.2-1b --out /tmp/m1b >"$out/dummy.log" 2>&1 || tail -5 "$out/dummy.log"
for isq in none 8 4; do
  a=(); [[ $isq != none ]] && a=(--isq "$isq")
  el "bench 1B batch 1, isq=$isq"
  $P bench -m /tmp/m1b --device cuda "${a[@]}" --num-prompts 1 --input-len 128 --output-len 256 --json \
    2>"$out/bench_1b_$isq.err" | tee "$out/bench_1b_$isq.json"; echo
  el "bench 1B 64 parallel, isq=$isq"
  $P bench -m /tmp/m1b --device cuda "${a[@]}" --num-prompts 64 --input-len 512 --output-len 256 --json \
    2>>"$out/bench_1b_$isq.err" | tee -a "$out/bench_1b_$isq.json"; echo
done
el "--isq 8 greedy, cuda vs cpu (stories260K)"
for dev in cuda cpu; do
  $P run -m .device/testdata/models/stories260K.gguf --device $dev --isq 8 --raw --temperature 0 -n 64 -p "Once upon a time" \
    >"$out/isq_$dev.txt" 2>"$out/isq_$dev.err"; echo "$dev rc=$?"
done
cmp "$out/isq_cuda.txt" "$out/isq_cpu.txt" && echo "isq 8 greedy: cuda == cpu" || echo "isq 8 greedy: cuda != cpu"
el done
