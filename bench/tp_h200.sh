#!/usr/bin/env bash
# tp_h200.sh - on nvidia-h200-x2, in one device call: the tensor-parallel GPU test, --tp 2 against
# --tp 1 through the engine (greedy text of stories260K), then `pagoda bench` on the
# Llama-3.1-8B shape (tools/make_dummy_model.py) at --tp 1 and --tp 2, batch 1 and 64 parallel x
# (512 in, 128 out). Stage first (here): tools/device_bundle.sh && tools/device_stage.sh
# /work/main/.gpu-tp bench; there: cd .gpu-tp && bash bench/tp_h200.sh  (logs under $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=/tmp/tp_logs; mkdir -p "$out" # tarred into $OUT at the end (the device returns 8 files at most)
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PAGODA_BACKEND_PATH="$root/.device/build" PAGODA_FIXTURES="$root/tests/fixtures"
export NCCL_NVLS_ENABLE=0 # KINDS.md: NVLink multicast stays off
P=$root/.device/build/pagoda
el() { echo "== $(date -u +%T) $*"; }
el "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvidia-smi topo -m | head -4
git_commit=$(cat "$root/COMMIT" 2>/dev/null); echo "commit $git_commit"
M8=/tmp/llama-8b
(python3 tools/make_dummy_model.py --shape llama-3.1-8b --out $M8 >"$out/make8b.log" 2>&1) & MP=$!
el "test_tp_cuda"
timeout 120 .device/build/tests/gpu_bin/test_tp_cuda >"$out/test_tp_cuda.log" 2>&1; echo "rc=$?"
grep -v "^\[pagoda" "$out/test_tp_cuda.log" | tail -12
el "engine: stories260K greedy, --tp 1 vs --tp 2"
S=$root/.device/testdata/models/stories260K.gguf
for tp in 1 2; do
  timeout 60 "$P" run -m "$S" --device cuda --tp $tp --raw -p "Once upon a time" --temperature 0 -n 64 \
    >"$out/stories_tp$tp.txt" 2>"$out/stories_tp$tp.err"; echo "tp $tp rc=$?"
done
cmp "$out/stories_tp1.txt" "$out/stories_tp2.txt" && echo "stories260K greedy: --tp 2 output equals --tp 1" ||
  { echo "stories260K greedy DIFFERS"; tail -3 "$out"/stories_tp*.err; }
el "refusals"
"$P" run -m "$S" --device cuda --tp 4 --raw -p "x" -n 1 2>&1 | grep -m1 error
el "waiting for the 8B model"
wait $MP || tail -5 "$out/make8b.log"
pb() { # label, then pagoda bench args
  local label=$1; shift
  el "pagoda bench $label"
  timeout 150 "$P" bench -m $M8 --device cuda --max-num-seqs 64 --input-len 512 --output-len 128 --temperature 0 \
    "$@" --json 2>"$out/bench_$label.err" | tee "$out/bench_$label.json"; echo
  grep -E "error|tensor parallelism" "$out/bench_$label.err" | head -3
}
pb tp1_b1 --tp 1 --num-prompts 1
pb tp2_b1 --tp 2 --num-prompts 1
pb tp1_p64 --tp 1 --num-prompts 64
pb tp2_p64 --tp 2 --num-prompts 64
PAGODA_CUDA_GRAPHS=0 pb tp1_b1_nographs --tp 1 --num-prompts 1
el "done"
tar czf "${OUT:-/tmp}/tp_logs.tgz" -C /tmp tp_logs
