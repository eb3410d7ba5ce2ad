#!/usr/bin/env bash
# llamacpp_fixtures.sh - regenerates the llama.cpp fixtures of the default model:
#  - tests/fixtures/llamacpp_perplexity.json: llama-perplexity figures for stories260K, the default
#    model and its requantized copies, on bytes [0, 20000) of tinyshakespeare, --ctx 128, 8 chunks
#    (defaults otherwise: -b 2048, f16 KV);
#  - tests/fixtures/smollm2/NAME.greedy.jsonl: greedy continuations (tools/llamacpp_greedy.py,
#    32 tokens, f16 KV) of tests/fixtures/smollm2/llamacpp_prompts.json for each copy.
#
#   tools/llamacpp_fixtures.sh LLAMA_BIN_DIR LLAMA_CPP_PYTHON_SRC
#
# LLAMA_BIN_DIR holds llama-perplexity, llama-quantize and libllama.so built for the CPU from the
# llama-cpp-python 0.3.36 sdist's vendor/llama.cpp; LLAMA_CPP_PYTHON_SRC is the unpacked sdist
# (its llama_cpp package, loading that libllama.so; docs/fidelity.md says how). The requantized
# copies are made first (llama-quantize --allow-requantize from the Q4_1 default model) into
# models/requant/, which is git-ignored. Nothing of llama.cpp is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: tools/llamacpp_fixtures.sh LLAMA_BIN_DIR LLAMA_CPP_PYTHON_SRC}
PYSRC=${2:?usage: tools/llamacpp_fixtures.sh LLAMA_BIN_DIR LLAMA_CPP_PYTHON_SRC}
PY=${PYTHON:-.venv/bin/python}
DATA=${PAGODA_TESTDATA:-../shared/testdata}
SRC=models/SmolLM2-135M-Instruct.Q4_1.gguf
[[ -f $SRC ]] || scripts/setup.sh --model
mkdir -p models/requant
for t in Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0; do
  out=models/requant/SmolLM2-135M-Instruct.$t.gguf
  [[ -f $out ]] || "$BIN/llama-quantize" --allow-requantize "$SRC" "$out" "$t" 2 >/dev/null 2>&1
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 20000 "$DATA/corpus/tinyshakespeare.txt" > "$tmp/text.txt"
models=("stories260K:\$TESTDATA/models/stories260K.gguf" "SmolLM2-Q4_1:\$ROOT/$SRC")
for t in Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0; do
  models+=("SmolLM2-$t:\$ROOT/models/requant/SmolLM2-135M-Instruct.$t.gguf")
done
: > "$tmp/results"
for m in "${models[@]}"; do
  name=${m%%:*} path=${m#*:}
  real=${path/\$TESTDATA/$DATA}
  real=${real/\$ROOT/$PWD}
  "$BIN/llama-perplexity" -m "$real" -f "$tmp/text.txt" -c 128 --chunks 8 -t 2 > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
  line=$(grep "Final estimate" "$tmp/out")
  echo "$name $path $(sha256sum "$real" | cut -d' ' -f1) $line" | tee -a "$tmp/results"
done
python3 - "$tmp/results" "$(sha256sum "$tmp/text.txt" | cut -d' ' -f1)" > "$tmp/ppl.json" <<'PY'
import json, re, sys
res = []
for line in open(sys.argv[1]):
    name, path, sha, rest = line.split(" ", 3)
    m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", rest)
    how = ("llama-quantize --allow-requantize of the Q4_1 default model (tools/llamacpp_fixtures.sh)"
           if "requant" in path else "scripts/setup.sh --model" if "$ROOT" in path else "shared test data")
    res.append({"name": name, "path": path, "sha256": sha, "ppl": float(m.group(1)),
                "ppl_sd": float(m.group(2)), "how": how})
print(json.dumps({"llama_cpp": "llama-cpp-python 0.3.36 vendor/llama.cpp, CPU build: llama-perplexity "
                  "-c 128 --chunks 8 -t 2 (-b 2048, f16 KV cache)", "ctx": 128, "chunks": 8,
                  "text": {"file": "corpus/tinyshakespeare.txt", "begin": 0, "end": 20000, "sha256": sys.argv[2]},
                  "results": res}, indent=1))
PY
cp "$tmp/ppl.json" tests/fixtures/llamacpp_perplexity.json

for t in Q4_1 Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0; do
  m=models/SmolLM2-135M-Instruct.$t.gguf
  [[ $t == Q4_1 ]] || m=models/requant/SmolLM2-135M-Instruct.$t.gguf
  out=tests/fixtures/smollm2/$t.greedy.jsonl
  printf '{"model": "%s", "sha256": "%s", "llama_cpp": "llama-cpp-python 0.3.36 vendor/llama.cpp, CPU, f16 KV cache, tools/llamacpp_greedy.py -n 32"}\n' \
    "$m" "$(sha256sum "$m" | cut -d' ' -f1)" > "$out.part"
  PYTHONPATH="$PYSRC" LLAMA_CPP_LIB_PATH="$BIN" "$PY" tools/llamacpp_greedy.py -m "$m" \
    --prompts tests/fixtures/smollm2/llamacpp_prompts.json -n 32 >> "$out.part"
  mv "$out.part" "$out"
  echo "$out: $(($(wc -l < "$out") - 1)) prompts"
done
