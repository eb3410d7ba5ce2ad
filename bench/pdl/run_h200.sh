#!/usr/bin/env bash
# bench/pdl/run_h200.sh - one GPU-machine call for branch pdl (issue 9, batch-1 decode): the GPU
# tests with programmatic dependent launch on and off, then pagoda bench at batch 1 on the 1B and
# 8B shapes with PAGODA_PDL on and 0 (with and without CUDA graphs, twice each with graphs), once
# with PAGODA_STEP_TIMING=1, and the 1B 64 x (512, 256) bench with PDL on and off. (The calls of
# bench/RESULTS.md, "Programmatic dependent launch", ran it at 7cd871f3 and 28785596 with the
# switches those commits had: PAGODA_FUSED_NORM, PAGODA_GEMV_DEPTH.) Run from a staged bundle
# (tools/device_stage.sh DEST bench): cd DEST && bash bench/pdl/run_h200.sh. Logs under $OUT.
cd "$(dirname "$0")/../.."
root=$(pwd)
out=${OUT:-/tmp}
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PAGODA_BACKEND_PATH="$root/.device/build" PAGODA_SOURCE_DIR="$root" PAGODA_TESTDATA="$root/.device/testdata"
export PAGODA_FIXTURES="$root/tests/fixtures" PAGODA_BIN="$root/.device/build/pagoda"
P=$root/.device/build/pagoda
G=$root/.device/build/tests/gpu_bin
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
echo "commit $(cat COMMIT 2>/dev/null)"
t0=$SECONDS
(python3 tools/make_dummy_model.py --shape llama-3.2-1b --out /tmp/m1b >"$out/mk1b.log" 2>&1 &&
 python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/m8b >"$out/mk8b.log" 2>&1; echo "models made at $((SECONDS - t0)) s") &
mk=$!
t() { # name, env..., binary
  local name=$1; shift
  env "$@" >"$out/$name.log" 2>&1; local rc=$?
  if [[ $rc -eq 0 ]]; then echo "PASS $name ($((SECONDS - t0)) s)"; else echo "FAIL $name rc=$rc"; tail -15 "$out/$name.log"; fi
}
t ops_pdl timeout 120 $G/test_cuda_ops
t ops_pdl2 timeout 120 $G/test_cuda_ops
t gemv_pdl timeout 60 $G/test_cuda_gemv
t gemv_nopdl PAGODA_PDL=0 timeout 60 $G/test_cuda_gemv
t ops_nopdl PAGODA_PDL=0 timeout 120 $G/test_cuda_ops
t model_pdl timeout 120 $G/test_cuda_model
t model_nopdl PAGODA_PDL=0 timeout 120 $G/test_cuda_model
t sampling_pdl timeout 120 $G/test_cuda_sampling
t archops_pdl timeout 120 $G/test_cuda_archops_model
wait $mk
summ() { python3 -c '
import json,sys
for line in sys.stdin:
    line=line.strip()
    if line.startswith("{"):
        j=json.loads(line); print("digest %s tpot_p50 %.4f ms out_tok/s %.1f total_tok/s %.1f" % (j["output_digest"], j["tpot_ms"]["p50"], j["output_tok_per_s"], j["total_tok_per_s"]))
'; }
b() { # label, model, then env assignments
  local label=$1 m=$2; shift 2
  local r
  r=$(env "$@" timeout 120 "$P" bench -m $m --device cuda --json --num-prompts 1 --input-len 512 --output-len 128 --temperature 0 2>"$out/b_$label.err" | tee "$out/b_$label.json" | summ)
  echo "$label [$*]: $r $(grep -o 'GPU busy.*' "$out/b_$label.err" | head -1) $(grep -m1 -o 'capturing.*' "$out/b_$label.err")"
}
for m in 1b 8b; do
  b ${m}_pdl /tmp/m$m
  b ${m}_nopdl /tmp/m$m PAGODA_PDL=0
  b ${m}_pdl_nographs /tmp/m$m PAGODA_CUDA_GRAPHS=0
  b ${m}_nopdl_nographs /tmp/m$m PAGODA_CUDA_GRAPHS=0 PAGODA_PDL=0
  b ${m}_pdl2 /tmp/m$m
  b ${m}_nopdl2 /tmp/m$m PAGODA_PDL=0
  [[ $m == 1b ]] && b 1b_timing /tmp/m1b PAGODA_STEP_TIMING=1
  echo "($((SECONDS - t0)) s)"
done
for v in pdl nopdl; do
  e=""; [[ $v == nopdl ]] && e="PAGODA_PDL=0"
  r=$(env $e timeout 120 "$P" bench -m /tmp/m1b --device cuda --json --num-prompts 64 --input-len 512 --output-len 256 --temperature 0 2>"$out/b64_$v.err" | tee "$out/b64_$v.json" | summ)
  echo "1b 64x(512,256) $v [$e]: $r"
done
echo "total $((SECONDS - t0)) s"
