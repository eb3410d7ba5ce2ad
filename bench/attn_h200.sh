#!/usr/bin/env bash
# attn_h200.sh - on the GPU machine, from a bundle folder (made by bench/attn_bundle.sh): the GPU
# op tests, the f8e4m3 accuracy test on the GPU (bf16 reference), bench/cuda_attention and
# torch's SDPA figures (peers/torch_attention_peers.py) in the same run, then the ratios.
# Usage: bash attn_h200.sh      (logs under $OUT; ATTN_QUICK=1 skips the tests of the other kernel
# sets and test_kv_f8)
set -uo pipefail
d=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH="$d/lib:$d/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PAGODA_BACKEND_PATH="$d/build" PAGODA_TESTDATA="$d/testdata" PAGODA_FIXTURES="$d/fixtures"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
el "test_cuda_ops"
"$d/build/test_cuda_ops" >"$out/test_cuda_ops.log" 2>&1; echo "test_cuda_ops rc=$?"
grep -E "FAIL|failed|passed|paged attention|seed" "$out/test_cuda_ops.log" | head -20
if [[ -z "${ATTN_QUICK:-}" ]]; then # ATTN_QUICK=1: the default kernels' tests only
el "test_cuda_ops with the CUDA-core decode and prefill kernels"
PAGODA_ATTN_DECODE=simd PAGODA_ATTN_PREFILL=simd "$d/build/test_cuda_ops" >"$out/test_cuda_ops_simd.log" 2>&1; echo "test_cuda_ops (simd decode) rc=$?"
grep -E "FAIL|failed|passed" "$out/test_cuda_ops_simd.log" | head -8
el "test_cuda_ops with the mma.sync tile prefill kernel"
PAGODA_ATTN_PREFILL=tile "$d/build/test_cuda_ops" >"$out/test_cuda_ops_tile.log" 2>&1; echo "test_cuda_ops (tile prefill) rc=$?"
grep -E "FAIL|failed|passed" "$out/test_cuda_ops_tile.log" | head -8
el "test_cuda_ops with the wgmma kernel's 2 x 128 configuration"
PAGODA_ATTN_WGMMA_CFG=2x128 "$d/build/test_cuda_ops" >"$out/test_cuda_ops_2x128.log" 2>&1; echo "test_cuda_ops (wgmma 2x128) rc=$?"
grep -E "FAIL|failed|passed" "$out/test_cuda_ops_2x128.log" | head -8
el "test_kv_f8 on cuda"
PAGODA_KV_F8_DEVICE=cuda "$d/build/test_kv_f8" >"$out/test_kv_f8.log" 2>&1; echo "test_kv_f8 rc=$?"
grep -E "agreement|failed|passed" "$out/test_kv_f8.log"
fi
el "cuda_attention"
"$d/build/cuda_attention" 7 2>&1 | tee "$out/cuda_attention.log"
el "cuda_attention variants: the mma.sync tile prefill kernel, wgmma with 2 warpgroups and 128-key tiles"
PAGODA_ATTN_PREFILL=tile "$d/build/cuda_attention" 3 2>&1 | grep -E "^prefill_bf16_bs16 " | sed 's/^/tile kernel: /'
PAGODA_ATTN_WGMMA_CFG=2x128 "$d/build/cuda_attention" 3 2>&1 | grep -E "^prefill_bf16_bs(8|16|32) " | sed 's/^/wgmma 2 warpgroups x 128-key tiles: /'
el "cuda_attention, CUDA-core decode kernel"
PAGODA_ATTN_DECODE=simd PAGODA_ATTN_PREFILL=simd "$d/build/cuda_attention" 3 2>&1 | grep -E "^(decode_(bf16|f8)_bs(16) |prefill)" | sed 's/^/simd /'
el "torch peers"
python3 "$d/torch_attention_peers.py" "$out/torch.json" >"$out/torch.log" 2>&1 || tail -5 "$out/torch.log"
el "ratios"
python3 - "$out/cuda_attention.log" "$out/torch.json" <<'PY' | tee "$out/ratios.txt"
import json, sys
p = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); t = json.load(open(sys.argv[2]))
cud = t.get("decode_sdpa_cudnn_ms"); fl = t.get("decode_sdpa_flash_ms"); pf = t.get("prefill_sdpa_flash_ms")
print("pagoda copy %.0f GB/s, torch copy %.0f GB/s" % (p["copy_GBps_rw"], t.get("copy_GBps_rw", 0)))
print("torch decode cudnn %s ms, flash %s ms; prefill flash %s ms (%s TFLOP/s), cudnn %s ms" % (cud, fl, pf, t.get("prefill_sdpa_flash_TFLOPs"), t.get("prefill_sdpa_cudnn_ms")))
for bs in (8, 16, 32):
    b = p["decode_bf16_bs%d_ms" % bs]; f = p["decode_f8_bs%d_ms" % bs]
    print("decode bs%-2d bf16 %.3f ms (%.2fx cuDNN), f8 %.3f ms (%.2fx cuDNN), f8 speed-up %.2fx" % (bs, b, cud / b if cud else 0, f, cud / f if cud else 0, b / f))
print("decode bs16 in-order blocks: bf16 %.3f ms, f8 %.3f ms; part-1 kernel %.3f ms" % (p["decode_bf16_bs16_inorder_ms"], p["decode_f8_bs16_inorder_ms"], p["decode_bf16_bs16_part1kernel_ms"]))
print("prefill 4x4096 bf16 bs8 %.3f ms (%.3fx flash), bs32 %.3f ms (%.3fx flash)" % (p["prefill_bf16_bs8_ms"], pf / p["prefill_bf16_bs8_ms"] if pf else 0, p["prefill_bf16_bs32_ms"], pf / p["prefill_bf16_bs32_ms"] if pf else 0))
print("prefill 4x4096 bf16 %.2f ms = %.1f TFLOP/s (%.3fx torch flash), f8 %.2f ms" % (p["prefill_bf16_bs16_ms"], p["prefill_bf16_bs16_TFLOPs"], pf / p["prefill_bf16_bs16_ms"] if pf else 0, p["prefill_f8_bs16_ms"]))
PY
el "done"
