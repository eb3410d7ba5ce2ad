#!/usr/bin/env bash
# check_preload.sh - every CUDA source file whose module has kernels takes part in kernel
# preloading (src/backend/cuda/cuda_preload.cu): its last line is CUDA_PRELOAD_ANCHOR(<its name
# without cuda_>), and that name is in CUDA_PRELOAD_MODULES (cuda_backend.h); every listed name
# has its file. A file's module has kernels when the file defines one (a line starting with
# `__global__`, `static __global__` or `template <...> __global__`) or includes a .cuh of the
# directory that does. A file left out would still work, but under lazy loading its kernels would
# stall their first launch (docs/cuda.md, Kernel loading). Checked on the sources, so CPU-only CI
# checks it too.
# Usage: check_preload.sh SOURCE_DIR
set -u
dir=$1/src/backend/cuda
fail=0
kernel_re='^[[:space:]]*(static[[:space:]]+)?(template[[:space:]]*<.*>[[:space:]]*)?__global__\b'
# the macro's lines: from its #define to the first line that does not end in a backslash
listed=$(awk '/^#define CUDA_PRELOAD_MODULES/{on=1} on{print; if ($0 !~ /\\$/) exit}' "$dir/cuda_backend.h" |
  grep -oE '(^|[^A-Za-z0-9_])X\([a-z0-9_]+\)' | sed -E 's/.*X\((.*)\)/\1/' | sort -u)
if [[ -z $listed ]]; then
  echo "FAIL: no CUDA_PRELOAD_MODULES list found in $dir/cuda_backend.h"
  exit 1
fi
kernel_headers=()
for h in "$dir"/*.cuh; do
  grep -qE "$kernel_re" "$h" && kernel_headers+=("$(basename "$h")")
done
checked=0
for f in "$dir"/*.cu; do
  name=$(basename "$f" .cu); name=${name#cuda_}
  has=0
  grep -qE "$kernel_re" "$f" && has=1
  for h in "${kernel_headers[@]}"; do
    grep -qE "^#include \"backend/cuda/$h\"" "$f" && has=1
  done
  [[ $has -eq 1 ]] || continue
  checked=$((checked + 1))
  last=$(grep -v '^[[:space:]]*$' "$f" | tail -1)
  if [[ $last != "CUDA_PRELOAD_ANCHOR($name)" ]]; then
    echo "FAIL: $f has kernels but does not end with the line CUDA_PRELOAD_ANCHOR($name)"; fail=1
  fi
  if ! grep -qx "$name" <<<"$listed"; then
    echo "FAIL: $name ($f) is missing from CUDA_PRELOAD_MODULES in cuda_backend.h"; fail=1
  fi
done
for name in $listed; do
  [[ -f $dir/cuda_$name.cu ]] || { echo "FAIL: CUDA_PRELOAD_MODULES names $name, but $dir/cuda_$name.cu does not exist"; fail=1; }
done
[[ $fail -eq 0 ]] && echo "ok: $checked CUDA source files with kernels, each anchored and listed"
exit $fail
