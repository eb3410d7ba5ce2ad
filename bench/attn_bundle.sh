#!/usr/bin/env bash
# attn_bundle.sh - stages what bench/attn_h200.sh needs into DEST (a git-ignored folder of the
# checkout the device tool sends, e.g. /work/main/.gpu-attn): the CUDA build's test and bench
# binaries and module from BUILD (default .device/build, made by tools/device_bundle.sh), the
# shared libraries of our Debian dependencies, stories260K, the fixtures and torch's peer script.
# Usage: bench/attn_bundle.sh DEST [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$1; build=${2:-.device/build}
rm -rf "$dest"; mkdir -p "$dest/build" "$dest/lib" "$dest/testdata/models"
cp "$build/tests/gpu_bin/test_cuda_ops" "$build/tests/unit_bin/test_kv_f8" "$build/bench/cuda_attention" \
   "$build/libpagoda-cuda.so" "$dest/build/"
for bin in "$dest/build/test_cuda_ops" "$dest/build/cuda_attention" "$dest/build/test_kv_f8"; do
  ldd "$bin" | awk '/=> \//{print $3}' | grep -E 'cjson|pcre2|sodium|utf8proc|microhttpd|gomp|gnutls|nettle|hogweed|tasn1|idn2|unistring|p11-kit|gmp|ffi' |
    while read -r so; do cp -L "$so" "$dest/lib/"; done || true
done
cp ../shared/testdata/models/stories260K.gguf "$dest/testdata/models/"
cp -r tests/fixtures "$dest/fixtures"
cp ../shared/peers/torch_attention_peers.py bench/attn_h200.sh "$dest/"
du -sh "$dest"
