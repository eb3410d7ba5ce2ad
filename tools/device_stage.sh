#!/usr/bin/env bash
# device_stage.sh - copies what a GPU-machine run needs from this tree into DEST, a git-ignored
# folder of the checkout that the device tool sends (e.g. /work/main/.gpu-NAME), to be named in
# the run's `carry`. Run tools/device_bundle.sh first. There: cd DEST && tools/device_run.sh
# Usage: tools/device_stage.sh DEST [extra paths to copy...]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$1; shift
rm -rf "$dest"
mkdir -p "$dest/.device/build/tests"
cp -r tools "$dest/"
[[ -d tests/fixtures ]] && mkdir -p "$dest/tests" && cp -r tests/fixtures "$dest/tests/"
cp -r .device/lib "$dest/.device/"
[[ -d .device/testdata ]] && cp -r .device/testdata "$dest/.device/"
cp .device/build/pagoda "$dest/.device/build/"
# libpagoda.so and the CUDA backend module (dlopen'ed from beside the binary or PAGODA_BACKEND_PATH)
cp .device/build/libpagoda*.so "$dest/.device/build/"
for d in gpu_bin unit_bin; do
  [[ -d .device/build/tests/$d ]] && cp -r ".device/build/tests/$d" "$dest/.device/build/tests/"
done
[[ -d .device/build/bench ]] && cp -r .device/build/bench "$dest/.device/build/" || true
for p in "$@"; do mkdir -p "$dest/$(dirname "$p")"; cp -r "$p" "$dest/$p"; done
du -sh "$dest"
