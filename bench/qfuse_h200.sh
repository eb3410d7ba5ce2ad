#!/usr/bin/env bash
# qfuse_h200.sh - on the GPU machine (kind nvidia-h200), in ONE call: the quantized decode step
# with fewer launches (issue 11 item 6, branch qfuse): programmatic dependent launch for the x
# quantization and the quantized GEMVs, the input RMSNorm inside the x quantization (prenorm of
# matmul_n / matmul_silu_mul) and the o / down products added into the residual stream in the
# GEMV's epilogue (matmul_add).
#  1. GPU tests: test_cuda_quant (prenorm and matmul_add byte-equal to the separate ops),
#     test_cuda_ops, test_cuda_model;
#  2. bench/cuda_quant at T = 1 (microseconds per quantized matmul) and `bench/cuda_quant fused`
#     (the prenorm and add forms against the launches they replace), PAGODA_PDL=1 then 0;
#  3. `pagoda bench` on random bf16 safetensors of the Llama-3.1-8B shape
#     (tools/make_dummy_model.py, made in the background meanwhile), batch 1 (1 x (512 in, 128
#     out), greedy): bf16 weights, --isq 8 and --isq 4, with PAGODA_PDL=1 and 0, twice, then
#     --isq 8 / --isq 4 with PAGODA_FUSED_NORM=0 (the separate rmsnorm / add+rmsnorm: the digest
#     must equal the default's, the fused forms being bit for bit the same). Prints TPOT p50 and
#     output_digest per run; the digests of one weight kind must all be equal.
# `tests` runs part 1 only, `bench` parts 2 and 3 (if one call cannot hold everything).
# Stage first (here):  tools/device_bundle.sh && tools/device_stage.sh /work/main/.gpu-NAME bench
# Run (device tool):   cd .gpu-NAME && bash bench/qfuse_h200.sh [all|tests|bench] 2>&1 | tee $OUT/run.log
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
mode=${1:-all}
budget=${QFUSE_BUDGET_S:-500} # seconds after which the optional runs (second round, A/B) are skipped
left() { (( $(date +%s) - t0 < budget )); }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
if [[ $mode != tests ]]; then
  (python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/m8b >/tmp/dummy.log 2>&1) &
  DP=$!
fi
if [[ $mode != bench ]]; then
  for t in test_cuda_quant test_cuda_ops test_cuda_model; do
    el "$t"
    $B/tests/gpu_bin/$t >>"$out/tests.log" 2>&1; echo "$t rc=$?"
    grep -E "FAIL|differs|answered|rel L2 .* >=|note:|passed|failed" "$out/tests.log" | tail -4
  done
fi
[[ $mode == tests ]] && { el done; exit 0; }
for pdl in 1 0; do
  el "bench/cuda_quant 20 1 (T = 1), PAGODA_PDL=$pdl"
  PAGODA_PDL=$pdl $B/bench/cuda_quant 20 1 | tee "$out/cuda_quant_pdl$pdl.txt"
  el "bench/cuda_quant fused 200 (prenorm / add against the separate launches), PAGODA_PDL=$pdl"
  PAGODA_PDL=$pdl $B/bench/cuda_quant fused 200 | tee "$out/cuda_quant_fused_pdl$pdl.txt"
done
# one run: NAME [VAR=value...] -- pagoda bench args; prints TPOT p50 and the digest
bench8b() {
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local j
  j=$(env "${envs[@]}" $P bench -m /tmp/m8b --device cuda --temperature 0 --json \
        --num-prompts 1 --input-len 512 --output-len 128 "$@" 2>>"$out/bench8b.err" | tail -1)
  echo "$j" >>"$out/bench8b.json"
  local tpot digest
  tpot=$(grep -o '"tpot_ms": {"p50": [0-9.]*' <<<"$j" | grep -o '[0-9.]*$')
  digest=$(grep -o '"output_digest": "[0-9a-f]*"' <<<"$j" | grep -o '[0-9a-f]*"$' | tr -d '"')
  printf '%-44s TPOT p50 %8s ms  output_digest %s\n' "$name" "${tpot:-?}" "${digest:-?}"
  [[ -n $tpot ]] || grep -E "^error" "$out/bench8b.err" | tail -2
}
el "waiting for the 8B model"
wait $DP || { echo "make_dummy_model failed"; tail -5 /tmp/dummy.log; exit 1; }
for round in 1 2; do
  (( round == 1 )) || left || break
  for pdl in 1 0; do
    bench8b "round $round PAGODA_PDL=$pdl bf16" PAGODA_PDL=$pdl --
    bench8b "round $round PAGODA_PDL=$pdl --isq 8" PAGODA_PDL=$pdl -- --isq 8
    bench8b "round $round PAGODA_PDL=$pdl --isq 4" PAGODA_PDL=$pdl -- --isq 4
  done
done
left && bench8b "PAGODA_FUSED_NORM=0 --isq 8" PAGODA_FUSED_NORM=0 -- --isq 8
left && bench8b "PAGODA_FUSED_NORM=0 --isq 4" PAGODA_FUSED_NORM=0 -- --isq 4
el done
