#!/usr/bin/env bash
# device_bundle.sh - builds pagoda here for the GPU machine (sm_90, x86-64-v3 host code) into
# .device/build and copies beside it what that machine lacks: the shared libraries of our
# Debian dependencies (.device/lib) and the shared test data (.device/testdata). The device
# tool then carries .device; run there with tools/device_run.sh.
# Usage: tools/device_bundle.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/lib
cmake -S . -B .device/build -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON -DPAGODA_ARCH=x86-64-v3 "$@" >/dev/null
cmake --build .device/build -j "$(nproc)"
# Libraries the device image does not have: everything our binaries need outside glibc/CUDA.
for bin in .device/build/pagoda .device/build/libpagoda.so; do
  ldd "$bin" | awk '/=> \//{print $3}' | grep -E 'cjson|pcre2|sodium|utf8proc|microhttpd|gomp|gnutls|nettle|hogweed|tasn1|idn2|unistring|p11-kit|gmp|ffi' |
    while read -r so; do cp -L "$so" .device/lib/; done || true
done
if [[ -d ../shared/testdata && ! -d .device/testdata ]]; then
  mkdir -p .device/testdata
  cp -r ../shared/testdata/models ../shared/testdata/README.md .device/testdata/
fi
du -sh .device
