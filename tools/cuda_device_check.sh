#!/usr/bin/env bash
# cuda_device_check.sh - on the GPU machine, in one call: the GPU tests, a random-weight model of
# Llama-3.2-1B's shape (tools/make_dummy_model.py), the forward-pass throughput benchmark
# (bench/cuda_forward) and, when the build has it, `pagoda bench` on that model. Run from a
# folder made by tools/device_bundle.sh + tools/device_stage.sh (with tools/ and .device/).
# Logs go to $OUT when it is set.
# Usage: tools/cuda_device_check.sh [tests|bench|all|8b]   (default all; 8b: also the forward
#        benchmark on a Llama-3.1-8B-shaped model, 16 GB of weights written first)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-/tmp}
what=${1:-all}
export LD_LIBRARY_PATH="$root/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# the tests and benches link libpagoda statically and load libpagoda-cuda.so from here
export PAGODA_BACKEND_PATH="$root/.device/build"
rc=0
if [[ $what == tests || $what == all || $what == 8b ]]; then
  tools/device_run.sh gpu || rc=1
  for t in "$out"/test_cuda_*.log; do echo "== $t"; cat "$t"; done
fi
if [[ $what == bench || $what == all || $what == 8b ]]; then
  model=/tmp/llama-3.2-1b-dummy
  if [[ ! -f $model/model.safetensors ]]; then
    PYTHONUNBUFFERED=1 python3 tools/make_dummy_model.py --shape llama-3.2-1b --out "$model" || rc=1
  fi
  if [[ -x .device/build/bench/cuda_forward ]]; then
    .device/build/bench/cuda_forward "$model" 256 512 256 32 8192 2>&1 | tee "$out/cuda_forward.log" || rc=1
  fi
  if .device/build/pagoda bench --help >/dev/null 2>&1; then
    for temp in 1.0 0; do
      echo "== pagoda bench --temperature $temp"
      .device/build/pagoda bench -m "$model" --device cuda --num-prompts 256 --input-len 512 --output-len 256 \
        --temperature $temp 2>&1 | tee "$out/pagoda_bench_t$temp.log" || rc=1
    done
  fi
fi
if [[ $what == 8b ]]; then
  model=/tmp/llama-3.1-8b-dummy
  PYTHONUNBUFFERED=1 python3 tools/make_dummy_model.py --shape llama-3.1-8b --out "$model" || rc=1
  .device/build/bench/cuda_forward "$model" 256 512 256 32 8192 2>&1 | tee "$out/cuda_forward_8b.log" || rc=1
fi
exit $rc
