#!/usr/bin/env bash
# gpunext_h200.sh - on the GPU machine (kind nvidia-h200), in ONE call: the batch-1 fusions of
# issue 9 (attnfold, gemvfuse, ropefuse) and, for 8b, issue 11's --isq 8, each switched off
# alone against everything on, next to llama.cpp (../shared/peers, CUDA, flash attention) on the
# SAME random-weight f16 GGUF of the Llama-3.2-1B or -3.1-8B shape (tools/random_gguf.py: seconds,
# where peers/make_random_gguf.py took five minutes of the 8B call).
#   1b  all GPU tests (tools/device_run.sh gpu; GPUNEXT_SUITE_ROUNDS times), test_cuda_model with each switch, then the
#       batch-1 A/B and llama-bench, then 64 x (512, 256) with everything on and off;
#   8b  the batch-1 A/B and llama-bench, then --isq 8 (on and off the fused forms), then
#       llama-quantize's copies of the GGUF next to llama-bench on each (GPUNEXT_QUANTS).
# A/B configurations (`pagoda bench -m G --device cuda --json --num-prompts 1 --input-len 512
# --output-len 128 --temperature 0`, twice each, interleaved): "on" (the defaults), and
# PAGODA_GEMV_SPLIT=0, PAGODA_FUSED_NORM=0, PAGODA_GEMV_PRE_L2=1, PAGODA_ATTN_FOLD=0,
# PAGODA_FUSED_ROPE=0 alone, and all of them off (main's kernels, in the new summation order);
# GPUNEXT_CFGS="on,PAGODA_GEMV_SPLIT=0,..." picks others ("none" as the whole value: no A/B;
# GPUNEXT_TESTS, GPUNEXT_B64, GPUNEXT_ISQ_CFGS, GPUNEXT_QUANTS and GPUNEXT_NCU below pick the rest); GPUNEXT_ROUNDS=N (0: none) alternates llama-bench and
# pagoda's default N times after them (for the ratio on a machine whose speed drifts). Every fused form and split is
# bit-identical to the separate ops: the digests of one model must all be equal; the script says
# ALL EQUAL or DIFFER.
# The llama.cpp build and the GGUF are made in the background while the tests use the GPU.
# Stage (here): tools/device_bundle.sh -DCMAKE_CUDA_ARCHITECTURES=90 && tools/device_stage.sh
#   /work/main/.gpu-next bench && cp -r ../shared/peers /work/main/.gpu-next/ &&
#   cp ../shared/testdata/vocab/ggml-vocab-llama-spm.gguf /work/main/.gpu-next/peers/
# Run (device tool, kind nvidia-h200, carry .gpu-next):
#   cd .gpu-next && bash bench/gpunext_h200.sh 1b|8b 2>&1 | tee $OUT/run.log
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
shape=${1:?1b or 8b}
budget=${GPUNEXT_BUDGET_S:-560}
left() { (($(date +%s) - t0 < budget)) || { el "budget of $budget s spent: skipping $1"; return 1; }; }
W=/tmp/llamacpp-peer; mkdir -p $W
LB=$W/lc/b/bin G=$W/random-$shape.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
echo "commit $(cat COMMIT 2>/dev/null)"
[[ -d $W/lc ]] || tar xzf peers/llama.cpp-c392e509.tgz -C $W
targets="llama-bench"
[[ $shape == 1b ]] && targets="llama-bench llama-batched-bench"
[[ ${GPUNEXT_LLAMA:-1} == 0 ]] && targets="" # GPUNEXT_LLAMA=0: no llama.cpp (no build, no rounds, no batched bench)
[[ -n $targets && -n ${GPUNEXT_QUANTS:-} && $shape == 8b ]] && targets="$targets llama-quantize"
[[ -n $targets ]] && (cd $W/lc && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >$W/build.log 2>&1 &&
  cmake --build b -j 12 --target $targets >>$W/build.log 2>&1) &
BP=$!
[[ -f $G ]] || (python3 tools/random_gguf.py $W/lc/gguf-py $G $shape peers/ggml-vocab-llama-spm.gguf >$W/gguf.log 2>&1) &
GP=$!

gtest() { # NAME [VAR=value...]: one GPU test binary, its rc and last lines
  local name=$1; shift
  el "$name $*"
  local tag="$*"; tag=${tag//=/}; tag=${tag// /_}
  local log="/tmp/gpulogs/$name${tag:+_$tag}.log"
  env "$@" "$B/tests/gpu_bin/$name" >"$log" 2>&1
  echo "$name $* rc=$?"
  grep -E "FAIL|passed|failed" "$log" | tail -3
}
# GPUNEXT_SUITE_ROUNDS=N: the whole single-GPU suite (tools/device_run.sh gpu) N times in a row (issue 9 asks
# for three; default 1 for 1b, 0 for 8b or with GPUNEXT_TESTS); GPUNEXT_TESTS="name[:VAR=value...];...": these
# GPU test binaries (after the suite rounds, e.g. "test_cuda_ops:PAGODA_TEST_SEED=N" to repeat a seed).
suite_rounds=${GPUNEXT_SUITE_ROUNDS:-$([[ $shape == 1b && -z ${GPUNEXT_TESTS:-} ]] && echo 1 || echo 0)}
mkdir -p /tmp/gpulogs
for ((sr = 1; sr <= suite_rounds; sr++)); do
  el "GPU tests (tools/device_run.sh gpu), round $sr of $suite_rounds"
  mkdir -p "/tmp/gpulogs/suite$sr"
  OUT=/tmp/gpulogs/suite$sr tools/device_run.sh gpu 2>&1 | grep -E "PASS|FAIL|SKIP|passed|rel|differ" | head -40
  grep -h "failed:" /tmp/gpulogs/suite$sr/*.log | head -30
done
if [[ -n ${GPUNEXT_TESTS:-} ]]; then
  IFS=';' read -ra tests <<<"$GPUNEXT_TESTS"
  for e in "${tests[@]}"; do
    IFS=: read -ra te <<<"$e"
    gtest "${te[@]}"
  done
elif [[ $shape == 1b ]]; then
  for v in PAGODA_FUSED_NORM=0 PAGODA_ATTN_FOLD=0 PAGODA_FUSED_ROPE=0 PAGODA_GEMV_SPLIT=0 PAGODA_GEMV_PRE_SPLIT=0 \
    PAGODA_GEMV_REG=0 PAGODA_QX_EARLY=0 PAGODA_ATTN_EARLY=1 PAGODA_GEMV_RING=0; do gtest test_cuda_model $v; done
  gtest test_cuda_ops PAGODA_GEMV_SPLIT=0
  gtest test_cuda_ops PAGODA_GEMV_RING=0
fi
tar czf "$out/gpu_logs.tgz" -C /tmp gpulogs 2>/dev/null

# run LABEL [VAR=value...] -- [pagoda bench args]: one bench on $G, its TPOT p50 and digest on one line
run() {
  local label=$1; shift
  local envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local json
  json=$(env "${envs[@]}" "$P" bench -m "$G" --device cuda --json --temperature 0 "$@" 2>>"$out/bench.err" | tail -1)
  echo "$label | ${envs[*]} $*: $json" >>"$out/bench.json"
  python3 - "$label ${envs[*]}" "$json" <<'EOF'
import json, sys
label, line = sys.argv[1], sys.argv[2]
try:
    j = json.loads(line)
    print(f"{label:70s} TPOT p50 {j['tpot_ms']['p50']:.4f} ms  output tok/s {j['output_tok_per_s']:.1f}  total tok/s {j['total_tok_per_s']:.0f}  digest {j['output_digest']}")
except Exception as e:
    print(f"{label:70s} NO RESULT ({e}): {line[:200]}")
EOF
}
digests() { # PREFIX: are the digests of every line starting with PREFIX equal?
  [[ -f $out/bench.json ]] || return
  python3 - "$1" "$out/bench.json" <<'EOF'
import json, sys
pre, path = sys.argv[1], sys.argv[2]
d = set()
for line in open(path):
    if line.startswith(pre):
        try: d.add(json.loads(line.split(": ", 1)[1])["output_digest"])
        except Exception: d.add("(no result)")
print(f"{pre}: digests {sorted(d)} -> {'no runs' if not d else 'ALL EQUAL' if len(d) == 1 else 'DIFFER'}")
EOF
}
one=(--num-prompts 1 --input-len 512 --output-len 128)
cfgs=("on" "PAGODA_GEMV_SPLIT=0" "PAGODA_FUSED_NORM=0" "PAGODA_GEMV_PRE_L2=1" "PAGODA_ATTN_FOLD=0" "PAGODA_FUSED_ROPE=0"
  "PAGODA_GEMV_SPLIT=0 PAGODA_FUSED_NORM=0 PAGODA_ATTN_FOLD=0 PAGODA_FUSED_ROPE=0")
[[ -n ${GPUNEXT_CFGS:-} ]] && IFS=, read -ra cfgs <<<"$GPUNEXT_CFGS" # comma-separated, "on" for the defaults
ab() { # NAME [extra bench args]: every configuration twice, interleaved (GPUNEXT_CFGS=none: no A/B)
  local name=$1; shift
  [[ ${cfgs[0]} == none ]] && return
  for rep in 1 2; do
    for c in "${cfgs[@]}"; do
      left "$name $c" || return
      local e=()
      [[ $c != on ]] && read -ra e <<<"$c"
      run "$name #$rep" "${e[@]}" -- "${one[@]}" "$@"
    done
  done
  digests "$name"
}
el "waiting for the GGUF"
wait $GP || { echo "gguf failed"; tail -20 $W/gguf.log; }
ls -la $G
left "A/B" && ab "$shape b1"
rounds=${GPUNEXT_ROUNDS:-1}
if [[ -n $targets ]]; then
  el "waiting for the llama.cpp build"
  wait $BP || { echo "llama.cpp build failed"; tail -20 $W/build.log; }
else
  rounds=0
fi
for ((round = 1; round <= rounds; round++)); do # GPUNEXT_ROUNDS: llama.cpp, then pagoda, N times
  left llama-bench || break
  el "llama.cpp llama-bench (pp512, tg128), round $round"
  $LB/llama-bench -m $G -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>/dev/null | tee -a "$out/llamacpp_bench_$shape.txt"
  left "pagoda after llama.cpp" && run "$shape b1 after llama.cpp" -- "${one[@]}"
done
if [[ $shape == 1b && ${GPUNEXT_B64:-1} != 0 ]]; then # GPUNEXT_B64=0: no 64-parallel part
  for c in on "PAGODA_GEMV_SPLIT=0 PAGODA_FUSED_NORM=0 PAGODA_ATTN_FOLD=0 PAGODA_FUSED_ROPE=0"; do
    left "64 x (512, 256) $c" || break
    e=(); [[ $c != on ]] && read -ra e <<<"$c"
    run "1b 64x(512,256)" "${e[@]}" -- --num-prompts 64 --input-len 512 --output-len 256
  done
  digests "1b 64x"
  if [[ -n $targets ]] && left "llama-batched-bench"; then
    $LB/llama-batched-bench -m $G -ngl 99 -fa -c 140000 -b 2048 -ub 512 -npp 512 -ntg 256 -npl 64 2>/dev/null |
      grep -E '^\|' | tee "$out/llamacpp_batched_$shape.txt"
  fi
elif [[ $shape == 8b ]]; then # GPUNEXT_ISQ_CFGS="on,VAR=value ...,...": the --isq 8 configurations
  isq=(on "PAGODA_FUSED_NORM=0" "PAGODA_FUSED_NORM=0 PAGODA_ATTN_FOLD=0 PAGODA_FUSED_ROPE=0" on)
  [[ -n ${GPUNEXT_ISQ_CFGS:-} ]] && IFS=, read -ra isq <<<"$GPUNEXT_ISQ_CFGS" # "none": no --isq 8 runs
  [[ ${isq[0]} == none ]] && isq=()
  for c in "${isq[@]}"; do
    left "--isq 8 $c" || break
    e=(); [[ $c != on ]] && read -ra e <<<"$c"
    run "8b isq8 b1" "${e[@]}" -- "${one[@]}" --isq 8
  done
  digests "8b isq8"
  # GPUNEXT_QUANTS="Q4_K_M Q8_0" (space-separated llama-quantize types): llama-quantize (built with
  # llama-bench) makes these from the f16 GGUF; per file llama-bench (tg128) and pagoda batch 1 in
  # each GPUNEXT_QUANT_CFGS configuration (comma-separated, default "on"), in that order,
  # GPUNEXT_ROUNDS times (at least once)
  qcfgs=(on)
  [[ -n ${GPUNEXT_QUANT_CFGS:-} ]] && IFS=, read -ra qcfgs <<<"$GPUNEXT_QUANT_CFGS"
  for q in ${GPUNEXT_QUANTS:-}; do
    [[ -x $LB/llama-quantize ]] || { echo "no llama-quantize (GPUNEXT_LLAMA=0?)"; break; }
    left "$q" || break
    f=$W/random-8b-$q.gguf
    if [[ ! -f $f ]]; then
      el "llama-quantize $q"
      $LB/llama-quantize $G $f.tmp $q 16 >$W/quant_$q.log 2>&1 && mv $f.tmp $f ||
        { tail -3 $W/quant_$q.log; rm -f $f.tmp; continue; }
    fi
    for ((round = 1; round <= (rounds > 1 ? rounds : 1); round++)); do
      left "$q round $round" || break
      el "llama.cpp llama-bench $q (tg128), round $round"
      $LB/llama-bench -m $f -ngl 99 -fa 1 -p 0 -n 128 -r 3 2>/dev/null | grep -E "tg128|model" |
        tee -a "$out/llamacpp_bench_$q.txt"
      for c in "${qcfgs[@]}"; do
        left "$q $c" || break
        e=(); [[ $c != on ]] && read -ra e <<<"$c"
        G=$f run "8b $q b1" "${e[@]}" -- "${one[@]}"
      done
    done
    digests "8b $q b1"
  done
fi
# GPUNEXT_NCU="label=ARGS;label=ARGS" (e.g. "bf16=;isq8=--isq 8"; leading VAR=value words of ARGS
# set that run's environment, e.g. "ring=PAGODA_GEMV_RING=1"): ncu over a short greedy run per
# entry, CUDA graphs off, and one decode step's kernels summed by name and grid (tools/ncu_step.py:
# time, DRAM bytes read and GB/s per kernel); GPUNEXT_NCU_METRICS="m1,m2" adds ncu metrics, printed
# as time-weighted means per row (e.g. sm__warps_active.avg.pct_of_peak_sustained_active for the
# achieved occupancy, launch__registers_per_thread); summaries in $OUT/ncu_LABEL.txt, CSVs tarred.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -n ${GPUNEXT_NCU:-} ]]; then
  IFS=';' read -ra ncus <<<"$GPUNEXT_NCU"
  mkdir -p /tmp/ncu
  for e in "${ncus[@]}"; do
    label=${e%%=*} args=${e#*=}
    left "ncu $label" || break
    [[ -n $NCU ]] || { echo "no ncu"; break; }
    el "ncu $label ($args), graphs off: 12 prompt words, 4 new tokens"
    # shellcheck disable=SC2086
    nenv=() # leading VAR=value words of ARGS: the environment of that run
    while [[ $args =~ ^[[:space:]]*([A-Z_][A-Z0-9_]*=[^[:space:]]*)[[:space:]]*(.*)$ ]]; do
      nenv+=("${BASH_REMATCH[1]}") args=${BASH_REMATCH[2]}
    done
    PAGODA_CUDA_GRAPHS=0 timeout 150 env "${nenv[@]}" "$NCU" --clock-control none \
      --metrics "gpu__time_duration.sum,dram__bytes_read.sum${GPUNEXT_NCU_METRICS:+,$GPUNEXT_NCU_METRICS}" \
      --csv --print-units base "$P" run -m "$G" --device cuda --temperature 0 -n 4 --ignore-eos $args \
      -p "one two three four five six seven eight nine ten eleven twelve" >"/tmp/ncu/$label.csv" 2>"/tmp/ncu/$label.err"
    echo "ncu rc=$?"
    python3 tools/ncu_step.py "/tmp/ncu/$label.csv" | tee "$out/ncu_$label.txt"
  done
  tar czf "$out/ncu.tgz" -C /tmp ncu 2>/dev/null
fi
grep -E "^error" "$out/bench.err" 2>/dev/null | sort | uniq -c | head -5
el "done"
