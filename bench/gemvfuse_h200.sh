#!/usr/bin/env bash
# gemvfuse_h200.sh - on the GPU machine (kind nvidia-h200), in ONE call: the RMSNorm in the bf16
# GEMV's prologue and the residual add in its epilogue (branch gemvfuse, issue 9; docs/cuda.md).
#   tests  test_cuda_ops, test_cuda_gemv, then test_cuda_model with PAGODA_FUSED_NORM=0 and 1;
#   1b/8b  `pagoda bench` at batch 1, 1 x (512 in, 128 out), greedy, on random bf16 weights of the
#          Llama-3.2-1B / -3.1-8B shape (tools/make_dummy_model.py, made in the background while
#          the tests run): PAGODA_FUSED_NORM=0 (before), then the fused norm with each prologue
#          shape ROWS:LOOP:L2 in $GEMVFUSE_CFGS (default "8:1:1 4:1:1 16:1:1 8:2:1 8:1:0 8:2:0":
#          PAGODA_GEMV_PRE_ROWS warps per block, PAGODA_GEMV_PRE_LOOP rows per warp,
#          PAGODA_GEMV_PRE_L2 the first weight steps into L2 (1, the default) or registers), each twice,
#          printing TPOT p50 and output_digest. The digests of a model must ALL be equal (the fused forms change no
#          bit); main's were 1B a6f09d2d2647cb48, 8B 1b4f4076412816e8 (bench/RESULTS.md);
#   large  1B 64 x (512, 256) with the fused norm off and on (no regression at large batch, where
#          T > 8 takes neither form; main's digest 26288d814548b329).
#   rope   (branch ropefuse) q/k/v + RoPE + KV write in one kernel (matmul_qkv_rope): 1B and 8B at
#          batch 1 with PAGODA_FUSED_ROPE=0 (matmul_n, then rope_kv_write) and 1, each twice, the
#          fused norm on; their digests join the batch-1 check (they must equal all the others).
#          1b and 8b run this A/B too (after the norm configs); `rope` alone skips the norm configs.
#          The tests part also runs test_cuda_model with PAGODA_FUSED_ROPE=0 and 1 (the model takes
#          the op through blocks.c; the test itself is unchanged and must pass both ways).
# Argument: all (default: tests, 1b, large, 8b, each while $GEMVFUSE_BUDGET_S lasts) or any of
# tests / 1b / 8b / large / rope. All of it may not fit one 600 s call (the 8B runs load 16 GB each):
# then `... tests 1b large` in one call and `... 8b` in the next.
# Stage first (here, on the branch's checkout):
#   tools/device_bundle.sh -DCMAKE_CUDA_ARCHITECTURES=90 && tools/device_stage.sh /work/main/.gpu-gemvfuse bench
#   (branch ropefuse: the same with /work/main/.gpu-ropefuse, and carry .gpu-ropefuse below)
# Run (device tool, kind nvidia-h200, carry .gpu-gemvfuse):
#   cd .gpu-gemvfuse && bash bench/gemvfuse_h200.sh [parts] 2>&1 | tee $OUT/run.log
# Outputs in $OUT: the tests' logs, bench.json (every run's JSON line), bench.err.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
budget=${GEMVFUSE_BUDGET_S:-540} # seconds after which the remaining parts are skipped
cfgs=${GEMVFUSE_CFGS:-8:1:1 4:1:1 16:1:1 8:2:1 8:1:0 8:2:0}
parts=${*:-all}
want() { [[ " $parts " == *" all "* || " $parts " == *" $1 "* ]]; }
left() { (($(date +%s) - t0 < budget)) || { el "budget of $budget s spent: skipping $1"; return 1; }; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader

# The models, in the background: 1B first (the first bench needs it), then 8B; DIR.done marks each.
rm -f /tmp/m1b.done /tmp/m8b.done
models() {
  if want 1b || want large || want rope; then
    python3 tools/make_dummy_model.py --shape llama-3.2-1b --out /tmp/m1b >/tmp/dummy1b.log 2>&1 && touch /tmp/m1b.done
  fi
  if want 8b || want rope; then
    python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/m8b >/tmp/dummy8b.log 2>&1 && touch /tmp/m8b.done
  fi
}
DP=
if want 1b || want 8b || want large || want rope; then
  models &
  DP=$!
fi
wait_model() { # DIR: returns once DIR.done exists; 1 when the maker ended without it
  while [[ ! -e $1.done ]]; do
    if ! kill -0 "$DP" 2>/dev/null && [[ ! -e $1.done ]]; then
      echo "make_dummy_model for $1 failed:"
      tail -5 /tmp/dummy*.log
      return 1
    fi
    sleep 2
  done
}

if want tests && left tests; then
  for t in test_cuda_ops test_cuda_gemv; do
    el "$t"
    "$B/tests/gpu_bin/$t" >"$out/$t.log" 2>&1
    echo "$t rc=$?"
    grep -E "FAIL|rel L2 .* >=|differs|prenorm / matmul_add|matmul_qkv_rope|passed|failed" "$out/$t.log" | tail -8
  done
  for sw in NORM:0 NORM:1 ROPE:0 ROPE:1; do # PAGODA_FUSED_NORM, then PAGODA_FUSED_ROPE, off and on
    v=PAGODA_FUSED_${sw%%:*}=${sw#*:} log="$out/test_cuda_model_${sw%%:*}${sw#*:}.log"
    el "test_cuda_model, $v"
    env "$v" "$B/tests/gpu_bin/test_cuda_model" >"$log" 2>&1
    echo "test_cuda_model $v rc=$?"
    grep -E "FAIL|passed|failed" "$log" | tail -3
  done
fi

# run LABEL MODEL [VAR=value...] -- [pagoda bench args]: one bench, its TPOT p50 and digest on one line.
run() {
  local label=$1 model=$2
  shift 2
  local envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local json
  json=$(env "${envs[@]}" "$P" bench -m "$model" --device cuda --json --temperature 0 "$@" 2>>"$out/bench.err" | tail -1)
  echo "$label ${envs[*]} $*: $json" >>"$out/bench.json"
  python3 - "$label ${envs[*]}" "$json" <<'EOF'
import json, sys
label, line = sys.argv[1], sys.argv[2]
try:
    j = json.loads(line)
    print(f"{label:60s} TPOT p50 {j['tpot_ms']['p50']:.4f} ms  output tok/s {j['output_tok_per_s']:.0f}  total tok/s {j['total_tok_per_s']:.0f}  digest {j['output_digest']}")
except Exception as e:
    print(f"{label:60s} NO RESULT ({e}): {line[:200]}")
EOF
}
one=(--num-prompts 1 --input-len 512 --output-len 128)
ropeab() { # NAME MODEL: the matmul_qkv_rope A/B (fused norm on), twice
  el "$1 batch 1, 1 x (512, 128): PAGODA_FUSED_ROPE=0 then 1, twice"
  for rep in 1 2; do
    for fr in 0 1; do
      run "$1 rope #$rep" "$2" PAGODA_FUSED_ROPE=$fr -- "${one[@]}"
    done
  done
}
batch1() { # NAME MODEL [norm]: the norm configs (with norm), the rope A/B, then the digest check
  if [[ ${3:-} == norm ]]; then
    el "$1 batch 1, 1 x (512, 128): fused norm off, then on with ROWS:LOOP:L2 in ($cfgs), each twice"
    for rep in 1 2; do
      run "$1 before (PAGODA_FUSED_NORM=0) #$rep" "$2" PAGODA_FUSED_NORM=0 -- "${one[@]}"
      for c in $cfgs; do
        IFS=: read -r rows loop l2 <<<"$c"
        run "$1 fused norm #$rep" "$2" PAGODA_FUSED_NORM=1 PAGODA_GEMV_PRE_ROWS="$rows" PAGODA_GEMV_PRE_LOOP="$loop" \
          PAGODA_GEMV_PRE_L2="${l2:-1}" -- "${one[@]}"
      done
    done
  fi
  ropeab "$1" "$2"
  python3 - "$1" "$out/bench.json" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
digests = set()
for line in open(path):
    if line.startswith(name + " ") and "--num-prompts 1 " in line:
        try:
            digests.add(json.loads(line.split(": ", 1)[1])["output_digest"])
        except Exception:
            digests.add("(no result)")
print(f"{name} batch-1 digests: {sorted(digests)} -> {'ALL EQUAL' if len(digests) == 1 else 'DIFFER'}")
EOF
}

if want 1b && left 1b; then
  el "waiting for the 1B model"
  wait_model /tmp/m1b && batch1 1B /tmp/m1b norm
fi
if want large && left large; then
  wait_model /tmp/m1b && {
    el "1B 64 x (512, 256): fused norm off, then on"
    for fn in 0 1; do
      run "1B 64x(512,256)" /tmp/m1b PAGODA_FUSED_NORM=$fn -- --num-prompts 64 --input-len 512 --output-len 256
    done
  }
fi
if want 8b && left 8b; then
  el "waiting for the 8B model"
  wait_model /tmp/m8b && batch1 8B /tmp/m8b norm
fi
if want rope; then # the models whose part above did not run it already
  for m in 1B:/tmp/m1b 8B:/tmp/m8b; do
    n=${m%%:*}
    want "${n,,}" && continue
    left "rope $n" || break
    el "waiting for the ${m%%:*} model"
    wait_model "${m#*:}" && batch1 "${m%%:*}" "${m#*:}"
  done
fi
grep -E "^error" "$out/bench.err" 2>/dev/null | sort | uniq -c | head -5
el "done"
