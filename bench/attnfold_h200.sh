#!/usr/bin/env bash
# attnfold_h200.sh - on the GPU machine, in ONE call (kind nvidia-h200): decode attention's
# split-K reduction folded into the decode kernel (branch attnfold, issue 9; PAGODA_ATTN_FOLD).
#   1. GPU tests: test_cuda_ops (fold on: the default; its "decode fold" cases compare the fold
#      with the reduce kernel byte for byte in one process), test_cuda_ops with
#      PAGODA_ATTN_FOLD=0, test_cuda_model;
#   2. `pagoda bench -m /tmp/m1b|/tmp/m8b --device cuda --json --num-prompts 1 --input-len 512
#      --output-len 128 --temperature 0` on random-weight models of the Llama-3.2-1B and
#      Llama-3.1-8B shapes (tools/make_dummy_model.py, made in the background meanwhile), with
#      PAGODA_ATTN_FOLD=0 and 1 alternating, twice each: TPOT p50 and output_digest of every run,
#      then per model the fold's best TPOT against the reduce kernel's and whether all four
#      digests are equal (they must be: the fold changes no bit). Targets: 1B <= 0.96 ms, 8B
#      <= 4.14 ms (main: 1.081 / 4.645 ms, bench/RESULTS.md, last section);
#   3. while the budget (ATTNFOLD_BUDGET_S, default 480 s) allows: test_cuda_ops with
#      PAGODA_ATTN_DECODE=simd (the CUDA-core decode kernel's fold) and test_cuda_model with
#      PAGODA_ATTN_FOLD=0.
# Logs go to $OUT (tests.log, bench.json, bench.err). Stage first (here): tools/device_bundle.sh &&
# tools/device_stage.sh /work/main/.gpu-attnfold bench; run (device tool):
#   cd .gpu-attnfold && bash bench/attnfold_h200.sh 2>&1 | tee $OUT/run.log
# Dry run of the logic on a machine without a GPU: DEV=cpu [PAGODA_BIN=build/pagoda]
# [PAGODA_GPU_TESTS=build-cuda/tests/gpu_bin] bash bench/attnfold_h200.sh: the tests exit 77
# (skipped), the benches run stories260K on the CPU with short lengths (the switch does nothing
# there, so the digests must agree too).
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
DEV=${DEV:-cuda}
budget=${ATTNFOLD_BUDGET_S:-480}
left() { (($(date +%s) - t0 < budget)); }
T=${PAGODA_GPU_TESTS:-$B/tests/gpu_bin}
if [[ $DEV == cuda ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
  (python3 tools/make_dummy_model.py --shape llama-3.2-1b --out /tmp/m1b &&
    python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/m8b) >/tmp/dummy.log 2>&1 &
  DP=$!
  models=(1b:/tmp/m1b 8b:/tmp/m8b)
  lens=(--input-len 512 --output-len 128)
else
  P=${PAGODA_BIN:-$root/build/pagoda}
  S=${SMODEL:-$root/../shared/testdata/models/stories260K.gguf}
  DP=
  models=(s260k-a:$S s260k-b:$S)
  lens=(--input-len 64 --output-len 32)
fi
echo "commit $(cat "$root/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null)"

# gtest NAME [VAR=value...]: one GPU test binary, its rc and last lines
gtest() {
  local name=$1; shift
  el "$name $*"
  echo "==== $name $*" >>"$out/tests.log"
  if [[ ! -x $T/$name ]]; then echo "$name: missing ($T/$name)"; return; fi
  local n0 rc
  n0=$(wc -l <"$out/tests.log")
  env "$@" "$T/$name" >>"$out/tests.log" 2>&1
  rc=$?
  echo "$name $* rc=$rc"
  tail -n +$((n0 + 1)) "$out/tests.log" | grep -E "FAIL|CHECK|decode fold: |paged attention: |passed|failed|SKIPPED" | tail -6
}
gtest test_cuda_ops
gtest test_cuda_ops PAGODA_ATTN_FOLD=0
gtest test_cuda_model

if [[ -n $DP ]]; then
  el "waiting for the models"
  wait $DP || { echo "make_dummy_model failed"; tail -5 /tmp/dummy.log; }
fi
# one model: PAGODA_ATTN_FOLD 0, 1, 0, 1; "name fold run tpot digest" lines in $out/summary.txt
for m in "${models[@]}"; do
  name=${m%%:*} path=${m#*:}
  for run in 1 2; do
    for fold in 0 1; do
      el "pagoda bench $name PAGODA_ATTN_FOLD=$fold (run $run)"
      line=$(PAGODA_ATTN_FOLD=$fold "$P" bench -m "$path" --device "$DEV" --json --num-prompts 1 "${lens[@]}" \
        --temperature 0 2>>"$out/bench.err")
      echo "$line" >>"$out/bench.json"
      tpot=$(grep -o '"tpot_ms": {"p50": [0-9.]*' <<<"$line" | grep -o '[0-9.]*$')
      dig=$(grep -o '"output_digest": "[0-9a-f]*"' <<<"$line" | grep -o '[0-9a-f]\{16\}')
      echo "$name fold=$fold run $run: TPOT p50 ${tpot:-?} ms, output_digest ${dig:-?}"
      echo "$name $fold $run ${tpot:-nan} ${dig:-none}" >>"$out/summary.txt"
      [[ -z $dig ]] && grep -E "^error" "$out/bench.err" | tail -2
    done
  done
  awk -v n="$name" '$1 == n { if (!($2 in best) || $4 < best[$2]) best[$2] = $4; d[$5] = 1 }
    END { k = 0; for (x in d) k++
          r = best[0] > 0 ? (best[1] / best[0] - 1) * 100 : 0
          printf "%s: best TPOT p50 reduce kernel %s ms, fold %s ms (%+.2f%%); digests %s\n", n, best[0], best[1], r,
                 (k == 1 ? "all equal" : "DIFFER") }' "$out/summary.txt"
done

left && gtest test_cuda_ops PAGODA_ATTN_DECODE=simd
left && gtest test_cuda_model PAGODA_ATTN_FOLD=0
left || echo "budget of $budget s spent: the optional tests were skipped"
el done
