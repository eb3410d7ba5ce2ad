#!/usr/bin/env bash
# tpar_h200x2.sh - on nvidia-h200-x2 (2 x H200, NVLink): the peer all-reduce's variants and the
# residual add fused into it (cuda_allreduce.cu, issue 14), in one device call per part:
#   tests  the op test (test_tp_allreduce: all_reduce_add and both variants byte for byte against
#          all_reduce_sum + add, the CPU and NCCL, every size, back to back, in a CUDA graph), the
#          model test (test_tp_cuda: every fixture at --tp 2 vs --tp 1, push and PAGODA_TP_AR_ADD=0
#          bitwise equal to the default), the microbenchmark bench/tp_allreduce (pull / push /
#          NCCL, 8 KiB .. 8 MiB);
#   bench  `pagoda bench` on the Llama-3.1-8B shape (tools/make_dummy_model.py, bf16 random
#          weights): --tp 1, and --tp 2 with PAGODA_TP_AR=pull / push, each with the add fused (the
#          default) and off (PAGODA_TP_AR_ADD=0); batch 1 (1 x (512 in, 128 out), greedy) twice
#          each, then 64 parallel once each; TPOT p50, overall (prompt + output) and output tok/s,
#          output_digest (every --tp 2 run of a workload must give the same digest); then, while
#          the budget lasts, push and pull with PAGODA_TP_AR_PDL=0 at batch 1.
#   all    (default) tests then bench: may not fit one 600 s call (bench alone ~5 min): run the
#          parts as two calls when the first one's log says the budget ran out.
# Every GPU command runs under `timeout`; logs under $OUT (tools/device_env.sh), the table on stdout.
# Stage first (here): tools/device_bundle.sh -DCMAKE_CUDA_ARCHITECTURES=90 &&
#   tools/device_stage.sh /work/main/.gpu-tpar bench
# Run (device tool, kind nvidia-h200-x2, carry .gpu-tpar):
#   cd .gpu-tpar && bash bench/tpar_h200x2.sh tests 2>&1 | tee $OUT/tests.log
#   cd .gpu-tpar && bash bench/tpar_h200x2.sh bench 2>&1 | tee $OUT/bench.log
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
export NCCL_NVLS_ENABLE=0   # KINDS.md: NVLink multicast stays off
part=${1:-all}
budget=${TPAR_BUDGET_S:-560} # seconds after which the optional runs are skipped
left() { (($(date +%s) - t0 < budget)); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -3
echo "commit $(cat "$root/COMMIT" 2>/dev/null)"
M8=/tmp/llama-8b
MP=
if [[ $part != tests && ! -f $M8/.complete ]]; then # the model while the tests run (kept for a later call)
  (python3 tools/make_dummy_model.py --shape llama-3.1-8b --out $M8 >"$out/make_model.log" 2>&1 &&
    touch $M8/.complete) &
  MP=$!
fi

if [[ $part != bench ]]; then
  el "test_tp_allreduce (the op, every size, both variants, NCCL, back to back, a CUDA graph)"
  timeout 200 "$B"/tests/gpu_bin/test_tp_allreduce >"$out/test_tp_allreduce.log" 2>&1
  rc=$?; echo "test_tp_allreduce rc=$rc"
  grep -v "^\[pagoda" "$out/test_tp_allreduce.log" | grep -E "CHECK|checked|CPU's replay|byte-equal|DIFF|passed|failed|skip" | head -30
  [[ $rc == 124 ]] && { echo "test_tp_allreduce timed out (a hang in the all-reduce?): stopping here"; exit 1; }
  el "test_tp_cuda (every fixture; graphs, NCCL, push, the fused add on/off)"
  timeout 200 "$B"/tests/gpu_bin/test_tp_cuda >"$out/test_tp_cuda.log" 2>&1
  rc=$?; echo "test_tp_cuda rc=$rc"
  grep -v "^\[pagoda" "$out/test_tp_cuda.log" | grep -E "CHECK|against the default|passed|failed" | tail -14
  [[ $rc == 124 ]] && { echo "test_tp_cuda timed out: stopping here"; exit 1; }
  el "bench/tp_allreduce 2 200 (pull / push / NCCL)"
  timeout 90 "$B"/bench/tp_allreduce 2 200 >"$out/tp_allreduce.log" 2>&1; echo "tp_allreduce rc=$?"
  grep -v "^\[pagoda" "$out/tp_allreduce.log" | tail -13
fi
[[ $part == tests ]] && { el finished; exit 0; }

el "waiting for the 8B model"
[[ -z $MP ]] || wait "$MP" || { echo "make_dummy_model failed"; tail -5 "$out/make_model.log"; exit 1; }
# pb LABEL [VAR=value...] -- pagoda bench args: one run, one line of results
pb() {
  local label=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  el "pagoda bench $label"
  env "${envs[@]}" timeout 60 "$P" bench -m $M8 --device cuda --max-num-seqs 64 --input-len 512 --output-len 128 \
    --temperature 0 --json "$@" 2>"$out/bench_$label.err" >"$out/bench_$label.json"
  local rc=$?
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("RESULT %-24s tpot_p50_ms %.3f total_tok_per_s %.1f output_tok_per_s %.1f digest %s" % (sys.argv[2], d["tpot_ms"]["p50"], d["total_tok_per_s"], d["output_tok_per_s"], d["output_digest"]))' \
    "$out/bench_$label.json" "$label" 2>/dev/null || { echo "RESULT $label rc=$rc (no JSON)"; grep -E "error" "$out/bench_$label.err" | head -3; }
  grep -E "peer all-reduce|capturing|error" "$out/bench_$label.err" | head -2
}
one=(--num-prompts 1)
p64=(--num-prompts 64)
# the variants of --tp 2: label suffix, then its variables
variants=("pull:PAGODA_TP_AR=pull" "push:PAGODA_TP_AR=push" "pull_noadd:PAGODA_TP_AR=pull PAGODA_TP_AR_ADD=0"
  "push_noadd:PAGODA_TP_AR=push PAGODA_TP_AR_ADD=0")
for round in 1 2; do
  pb tp1_b1_r$round -- --tp 1 "${one[@]}"
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2086 # the variables split on purpose
    pb tp2_b1_${v%%:*}_r$round ${v#*:} -- --tp 2 "${one[@]}"
  done
done
pb tp1_p64 -- --tp 1 "${p64[@]}"
for v in "${variants[@]}"; do
  left || { echo "budget spent: the remaining 64-parallel runs are skipped"; break; }
  # shellcheck disable=SC2086
  pb tp2_p64_${v%%:*} ${v#*:} -- --tp 2 "${p64[@]}"
done
for v in pull push; do
  left || break
  pb tp2_b1_${v}_nopdl PAGODA_TP_AR=$v PAGODA_TP_AR_PDL=0 -- --tp 2 "${one[@]}"
done
el "summary (digests: every tp2_b1 equal, every tp2_p64 equal)"
for w in b1 p64; do
  n=$(for f in "$out"/bench_tp2_"${w}"_*.json; do python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_digest"])' "$f" 2>/dev/null; done | sort -u | wc -l)
  echo "tp2 $w: $n distinct digest(s) over the variants (1 expected)"
done
el finished
