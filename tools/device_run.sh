#!/usr/bin/env bash
# device_run.sh - on the GPU machine: runs the GPU tests (and optionally more) from the bundle
# that tools/device_bundle.sh made. Paths are relative to the repository root, since the
# working tree lands at a different place there. Logs go to $OUT when it is set.
# Usage: tools/device_run.sh [gpu|unit|all]   (default gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# the tests and benches link libpagoda statically and load libpagoda-cuda.so from here
export PAGODA_BACKEND_PATH="$root/.device/build"
export PAGODA_SOURCE_DIR="$root" PAGODA_TESTDATA="$root/.device/testdata"
export PAGODA_FIXTURES="$root/tests/fixtures" PAGODA_BIN="$root/.device/build/pagoda"
out=${OUT:-/tmp}
what=${1:-gpu}
pass=0; fail=0; skip=0
run_dir() {
  for t in "$1"/test_*; do
    [[ -x $t && ! -d $t ]] || continue
    name=$(basename "$t")
    "$t" >"$out/$name.log" 2>&1; rc=$?
    if [[ $rc -eq 0 ]]; then pass=$((pass+1)); echo "PASS $name";
    elif [[ $rc -eq 77 ]]; then skip=$((skip+1)); echo "SKIP $name";
    else fail=$((fail+1)); echo "FAIL $name (rc=$rc)"; tail -20 "$out/$name.log"; fi
  done
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case $what in
  gpu) run_dir .device/build/tests/gpu_bin ;;
  unit) run_dir .device/build/tests/unit_bin ;;
  all) run_dir .device/build/tests/gpu_bin; run_dir .device/build/tests/unit_bin ;;
esac
echo "$pass passed, $fail failed, $skip skipped"
[[ $fail -eq 0 ]]
