#!/usr/bin/env bash
# loading_h200.sh - on the GPU machine (kind nvidia-h200), in ONE call: how CUDA's kernel loading
# modes compare on random-weight f16 GGUFs of the Llama-3.2-1B and -3.1-8B shapes
# (tools/random_gguf.py): eager (the pagoda command's default: it sets CUDA_MODULE_LOADING=EAGER
# unless the variable is set; docs/cuda.md), lazy with pagoda's own kernels preloaded on a
# background thread during the weights' upload (CUDA_MODULE_LOADING=LAZY, src/backend/cuda/
# cuda_preload.cu), and plain lazy (CUDA_MODULE_LOADING=LAZY PAGODA_CUDA_PRELOAD=0). Each run is one
# `pagoda bench -m G --device cuda --json --temperature 0 ...` process; the line printed per run has
# the process's wall time and the part of it outside the timed run (start-up: model load, kernel
# loading, profiling step, KV pool; and shut-down), the run's TPOT / TTFT (p50 / p99), overall and
# output tok/s, the digest, the start-up log's loading mode and KV blocks, and for the start-up runs
# (PAGODA_LOG=debug) what the preloading thread did. The three modes alternate:
#   1B  1 x (16 in, 1 out) twice (start-up), 1 x (512, 128) twice (first-request TTFT),
#       64 x (512, 256) twice, 256 x (512, 256) once; then eager only: 256 x (512, 256) at
#       temperature 1.0, 64 x (512, 256) with the f8e4m3 cache, with --paged-attn off, 128 x (512, 256);
#   8B  start-up, 1 x (512, 128) and 64 x (512, 128), once per mode, its GGUF made after the 1B runs
#       so that nothing else runs while they are timed (LOADING_8B=0: skipped);
# then the GPU suite once (tools/device_run.sh gpu, at most 150 s) if less than 400 s have passed.
# LOADING_QUICK=1: one start-up and one batch-1 run per mode at 1B, nothing else (a check of the modes).
# Stage: tools/device_bundle.sh -DCMAKE_CUDA_ARCHITECTURES=90-real && tools/device_stage.sh
#   /work/main/.gpu-next bench && cp -r ../shared/peers .gpu-next/ && cp
#   ../shared/testdata/vocab/ggml-vocab-llama-spm.gguf .gpu-next/peers/ (only the llama.cpp
#   tarball's gguf-py is used). Run (device tool, carry .gpu-next):
#   cd .gpu-next && bash bench/loading_h200.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
unset CUDA_MODULE_LOADING  # the eager runs take the command's default; the lazy ones set it
echo "commit $(cat COMMIT 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
W=/tmp/llamacpp-peer; mkdir -p $W
[[ -d $W/lc ]] || tar xzf peers/llama.cpp-c392e509.tgz -C $W
gguf() { [[ -f $W/random-$1.gguf ]] || python3 tools/random_gguf.py $W/lc/gguf-py $W/random-$1.gguf $1 \
  peers/ggml-vocab-llama-spm.gguf >$W/gguf_$1.log 2>&1 || tail -3 $W/gguf_$1.log; }
gguf 1b
el "1b GGUF made"
n=0
run() { # LABEL SHAPE [VAR=value...] -- [pagoda bench args]
  local label=$1 s=$2; shift 2
  local envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  n=$((n + 1))
  local j t1 t2 log=$out/bench_$n.err
  t1=$(date +%s%N)
  j=$(env "${envs[@]}" "$P" bench -m $W/random-$s.gguf --device cuda --json --temperature 0 "$@" 2>"$log" | tail -1)
  t2=$(date +%s%N)
  echo "$s $label ${envs[*]}: $j" >>"$out/loading.json"
  python3 - "$s $label ${envs[*]}" "$j" "$t1" "$t2" "$log" <<'EOF'
import json, re, sys
label, line, t1, t2, log = sys.argv[1:6]
text = open(log, errors="replace").read()
mode = re.search(r"kernels load[^\n]*", text)
blocks = re.search(r"KV pool: (\d+) blocks", text)
pre = re.search(r"(\d+) kernels of (\d+) modules loaded in the background in (\d+) ms \((\d+) ms of it waited for\)", text)
try:
    j = json.loads(line)
except Exception as e:
    print(f"{label}: NO RESULT ({e}): {line[:200]}")
    sys.exit(0)
wall = (int(t2) - int(t1)) / 1e9
el = j["elapsed_s"]
print(f"{label:36s} process {wall:.2f} s, outside the run {wall - el:.2f} s | run {el:.4f} s, "
      f"TPOT {j['tpot_ms']['p50']:.4f} / {j['tpot_ms']['p99']:.3f} ms, TTFT {j['ttft_ms']['p50']:.1f} / "
      f"{j['ttft_ms']['p99']:.1f} ms, {j['total_tok_per_s']:.0f} tok/s ({j['output_tok_per_s']:.0f} out), "
      f"digest {j['output_digest']} | {mode.group(0) if mode else '?'}, "
      f"{blocks.group(1) if blocks else '?'} KV blocks"
      + (f" | preloaded {pre.group(1)} kernels of {pre.group(2)} modules in {pre.group(3)} ms, "
         f"{pre.group(4)} ms waited for" if pre else ""))
EOF
}
lazy=CUDA_MODULE_LOADING=LAZY
nopre=PAGODA_CUDA_PRELOAD=0
dbg=PAGODA_LOG=debug
T=(--num-prompts 1 --input-len 16 --output-len 1)
B1=(--num-prompts 1 --input-len 512 --output-len 128)
P64=(--num-prompts 64 --input-len 512 --output-len 256)
P256=(--num-prompts 256 --input-len 512 --output-len 256)
modes() { # LABEL SHAPE [VAR=value...] -- [pagoda bench args]: eager, lazy + preload, plain lazy
  local label=$1 s=$2; shift 2
  local envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  run "$label" "$s" "${envs[@]}" -- "$@"
  run "$label" "$s" "${envs[@]}" $lazy -- "$@"
  run "$label" "$s" "${envs[@]}" $lazy $nopre -- "$@"
}
if [[ ${LOADING_QUICK:-0} == 1 ]]; then
  modes start 1b $dbg -- "${T[@]}"
  modes b1 1b -- "${B1[@]}"
  el done
  exit 0
fi
for r in 1 2; do modes start 1b $dbg -- "${T[@]}"; done
for r in 1 2; do modes b1 1b -- "${B1[@]}"; done
for r in 1 2; do modes p64 1b -- "${P64[@]}"; done
modes p256 1b -- "${P256[@]}"
run p256-t1 1b -- "${P256[@]}" --temperature 1.0
run p64-f8 1b -- "${P64[@]}" --pa-cache-type f8e4m3
run p64-paged-off 1b -- "${P64[@]}" --paged-attn off
run p128 1b -- --num-prompts 128 --input-len 512 --output-len 256
if [[ ${LOADING_8B:-1} != 0 ]]; then
  gguf 8b
  el "8b GGUF made"
  modes start 8b $dbg -- "${T[@]}"
  modes b1 8b -- "${B1[@]}"
  modes p64 8b -- --num-prompts 64 --input-len 512 --output-len 128
fi
if (($(date +%s) - t0 < 400)); then
  el "GPU tests (tools/device_run.sh gpu)"
  mkdir -p "$out/suite"
  OUT=$out/suite timeout 150 tools/device_run.sh gpu 2>&1 | grep -E "PASS|FAIL|SKIP|passed"
fi
el done
