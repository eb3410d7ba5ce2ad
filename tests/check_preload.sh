#!/usr/bin/env bash
# check_preload.sh - every CUDA source file that defines kernels takes part in kernel preloading
# (src/backend/cuda/cuda_preload.cu): it ends with CUDA_PRELOAD_ANCHOR(<its name without cuda_>),
# and that name is in CUDA_PRELOAD_MODULES (cuda_backend.h); and every listed name has its file.
# A file left out would still work, but its kernels would stall their first launch under lazy
# loading (docs/cuda.md, Kernel loading). Checked on the sources, so CPU-only CI checks it too.
# Usage: check_preload.sh SOURCE_DIR
set -u
dir=$1/src/backend/cuda
fail=0
listed=$(sed -n '/#define CUDA_PRELOAD_MODULES/,/^$/p' "$dir/cuda_backend.h" | grep -o 'X([a-z0-9_]*)' |
  sed 's/X(\(.*\))/\1/' | sort -u)
if [[ -z $listed ]]; then
  echo "FAIL: no CUDA_PRELOAD_MODULES list found in $dir/cuda_backend.h"
  exit 1
fi
for f in "$dir"/*.cu; do
  name=$(basename "$f" .cu); name=${name#cuda_}
  grep -q '__global__' "$f" || continue
  if ! grep -q "^CUDA_PRELOAD_ANCHOR($name)" "$f"; then
    echo "FAIL: $f defines kernels but has no CUDA_PRELOAD_ANCHOR($name) line"; fail=1
  fi
  if ! grep -qx "$name" <<<"$listed"; then
    echo "FAIL: $name ($f) is missing from CUDA_PRELOAD_MODULES in cuda_backend.h"; fail=1
  fi
done
for name in $listed; do
  [[ -f $dir/cuda_$name.cu ]] || { echo "FAIL: CUDA_PRELOAD_MODULES names $name, but $dir/cuda_$name.cu does not exist"; fail=1; }
done
[[ $fail -eq 0 ]] && echo "ok: $(grep -c . <<<"$listed") CUDA source files with kernels, each preloaded"
exit $fail
