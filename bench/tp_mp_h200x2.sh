#!/usr/bin/env bash
# tp_mp_h200x2.sh - multi-process tensor parallelism on nvidia-h200-x2, in one device call: two
# processes (--tp-rank 0/1 --tp-world 2 --tp-master 127.0.0.1:PORT, one GPU each, NCCL between
# them) against single-process --tp 2 and --tp 1 through the engine:
#   1. `pagoda run` greedy text of stories260K: 2 processes == --tp 2 == --tp 1;
#   2. `pagoda bench` (64 prompts, greedy, then seeded sampling) output digests: 2 processes ==
#      --tp 2 (2 ranks: NCCL's bf16 sum of two values is order-free, so bitwise equal), and the
#      tok/s of both;
#   3. rank 1 killed mid-bench: rank 0 exits with an error naming rank 1 (its watchdog aborts the
#      NCCL communicator), and rank 0 killed: rank 1 exits with an error naming rank 0; both timed;
#   4. when time is left (a deadline keeps the call short): the Llama-3.2-1B shape
#      (tools/make_dummy_model.py), bench digests and tok/s, 2 processes vs --tp 2.
# Stage first (here): tools/device_bundle.sh && tools/device_stage.sh /work/main/.gpu-mpwire bench;
# there: cd .gpu-mpwire && bash bench/tp_mp_h200x2.sh  (logs under $OUT, tarred).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
t_start=$(date +%s)
out=/tmp/tp_mp_logs; mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PAGODA_BACKEND_PATH="$root/.device/build" PAGODA_FIXTURES="$root/tests/fixtures"
export NCCL_NVLS_ENABLE=0 # KINDS.md: NVLink multicast stays off
export PAGODA_TP_TIMEOUT=60
# a dry run of the script's logic on a CPU machine: DEV=cpu PAGODA_BIN=build/pagoda SMODEL=... (no part 4)
DEV=${DEV:-cuda}
P=${PAGODA_BIN:-$root/.device/build/pagoda}
S=${SMODEL:-$root/.device/testdata/models/stories260K.gguf}
el() { echo "== $(date -u +%T) (+$(($(date +%s) - t_start)) s) $*"; }
finish() { tar czf "${OUT:-/tmp}/tp_mp_logs.tgz" -C /tmp tp_mp_logs; exit 0; }
el "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "commit $(cat "$root/COMMIT" 2>/dev/null)"
port=29500
# waitfor PID: its exit status, or 124 after killing it when it runs past 20 s (a hang)
waitfor() {
  local i
  for i in $(seq 200); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$1" 2>/dev/null && { kill -9 "$1"; wait "$1"; return 124; }
  wait "$1"
}
# mp NAME TIMEOUT CMD ARGS...: pagoda CMD at 2 processes (rank 1 in the background)
mp() {
  local name=$1 t=$2 cmd=$3; shift 3
  port=$((port + 1))
  timeout "$t" "$P" "$cmd" "$@" --tp-rank 1 --tp-world 2 --tp-master 127.0.0.1:$port \
    >"$out/${name}_r1.out" 2>"$out/${name}_r1.err" &
  local w=$!
  timeout "$t" "$P" "$cmd" "$@" --tp-rank 0 --tp-world 2 --tp-master 127.0.0.1:$port \
    >"$out/${name}.out" 2>"$out/${name}.err"
  echo "$name: rank 0 rc=$?"
  wait $w; echo "$name: rank 1 rc=$?"
}

el "1. stories260K greedy text: 2 processes vs --tp 2 vs --tp 1"
R=(--device $DEV --raw -p "Once upon a time" --temperature 0 -n 64)
for tp in 1 2; do
  timeout 60 "$P" run -m "$S" "${R[@]}" --tp $tp >"$out/run_tp$tp.out" 2>"$out/run_tp$tp.err"; echo "tp $tp rc=$?"
done
mp run_mp 60 run -m "$S" "${R[@]}"
cmp -s "$out/run_tp1.out" "$out/run_tp2.out" && echo "--tp 2 text == --tp 1" || echo "--tp 2 text DIFFERS from --tp 1"
cmp -s "$out/run_tp2.out" "$out/run_mp.out" && echo "2-process text == --tp 2" || echo "2-process text DIFFERS from --tp 2"
head -c 300 "$out/run_mp.out"; echo
grep -hE "tensor parallelism|error" "$out"/run_mp*.err | head -4

el "2. stories260K bench digests: 2 processes vs --tp 2"
for mode in greedy seeded; do
  B=(-m "$S" --device $DEV --num-prompts 64 --input-len 128 --output-len 128 --max-num-seqs 64 --json)
  [[ $mode == greedy ]] && B+=(--temperature 0) || B+=(--temperature 0.8 --seed 7)
  timeout 60 "$P" bench "${B[@]}" --tp 2 >"$out/bench_${mode}_tp2.out" 2>"$out/bench_${mode}_tp2.err"
  echo "tp 2 rc=$?"
  mp "bench_${mode}_mp" 60 bench "${B[@]}"
  for f in tp2 mp; do
    echo "$mode $f: $(grep -o '"output_digest": "[0-9a-f]*"' "$out/bench_${mode}_$f.out") \
$(grep -o '"output_tok_per_s": [0-9.]*' "$out/bench_${mode}_$f.out")"
  done
done

# killed VICTIM LABEL: both ranks start one long bench; once rank 0 has its KV pool, rank VICTIM is
# SIGKILLed and the other must exit with an error naming it (timed from the kill)
killed() {
  local victim=$1 label=$2
  port=$((port + 1))
  K=(-m "$S" --device $DEV --num-prompts 512 --input-len 200 --output-len 300 --max-num-seqs 64 --temperature 0)
  # no `timeout` wrapper: the kill must reach pagoda itself ($! is its pid)
  "$P" bench "${K[@]}" --tp-rank 1 --tp-world 2 --tp-master 127.0.0.1:$port >/dev/null 2>"$out/${label}_r1.err" &
  local w=$!
  "$P" bench "${K[@]}" --tp-rank 0 --tp-world 2 --tp-master 127.0.0.1:$port >"$out/$label.out" 2>"$out/$label.err" &
  local r0=$!
  for _ in $(seq 100); do grep -q "KV pool" "$out/$label.err" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  local dead=$w alive=$r0 alive_rank=0 err="$out/$label.err"
  ((victim == 0)) && { dead=$r0; alive=$w; alive_rank=1; err="$out/${label}_r1.err"; }
  kill -9 $dead; local tk=$(date +%s%N)
  waitfor $alive; local rc=$?
  echo "rank $alive_rank rc=$rc, $((($(date +%s%N) - tk) / 1000000)) ms after the kill"
  grep -E "error" "$err" | head -3
}
el "3a. rank 1 killed mid-bench"
killed 1 kill1
el "3b. rank 0 killed mid-bench"
killed 0 kill0

if [[ $DEV != cuda ]] || (($(date +%s) - t_start > 50)); then el "no time left for the 1B shape"; finish; fi
el "4. Llama-3.2-1B shape: 2 processes vs --tp 2"
M1=/tmp/llama-1b
timeout 60 python3 tools/make_dummy_model.py --shape llama-3.2-1b --out $M1 >"$out/make1b.log" 2>&1 || { tail -3 "$out/make1b.log"; finish; }
B=(-m $M1 --device $DEV --num-prompts 64 --input-len 256 --output-len 64 --max-num-seqs 64 --temperature 0 --json)
timeout 60 "$P" bench "${B[@]}" --tp 2 >"$out/b1_tp2.out" 2>"$out/b1_tp2.err"; echo "tp 2 rc=$?"
mp b1_mp 60 bench "${B[@]}"
for f in tp2 mp; do
  echo "1B $f: $(grep -o '"output_digest": "[0-9a-f]*"' "$out/b1_$f.out") \
$(grep -o '"output_tok_per_s": [0-9.]*' "$out/b1_$f.out")"
done
el "done"
finish
