#!/usr/bin/env bash
# arch_shapes_h200.sh - on the GPU machine (issue 10's must-hold): random weights for the real
# config.json of Mistral-7B-v0.1 and Phi-3.5-mini (the Phi-3-mini-128k shape: 3072 hidden, 32
# layers, 32/32 heads, LongRoPE over 131072 positions) written by tools/make_random_model.py, and
# the Llama-3.1-8B shape (tools/make_dummy_model.py), each with a synthetic byte-level tokenizer
# of its vocabulary size; each loads, `pagoda run` generates, and `pagoda bench` runs the same two
# workloads (batch 1 and 64 parallel x (512 in, 128 out)). From a folder staged by
# tools/device_stage.sh. Usage: bash tools/arch_shapes_h200.sh     (logs under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_env.sh # root, out, P, B, el; the libraries' paths
S=$root/tests/fuzz/seeds/fuzz_model_config; [[ -d $S ]] || S=$root/../tests/fuzz/seeds/fuzz_model_config # staged folder: the tree above
tok() { # DIR VOCAB BOS EOS: the synthetic tokenizer of make_dummy_model.py
  python3 -c "import sys; sys.path.insert(0, 'tools'); import make_dummy_model as m; m.write_tokenizer('$1', $2, $3, $4)"
}
el "weights"
python3 tools/make_random_model.py --config $S/mistral_7b_v01.json --out /tmp/mistral7b >"$out/mk_mistral.log" 2>&1 || tail -3 "$out/mk_mistral.log"
tok /tmp/mistral7b 32000 1 2
python3 tools/make_random_model.py --config $S/phi35_mini_instruct.json --out /tmp/phi3mini >"$out/mk_phi3.log" 2>&1 || tail -3 "$out/mk_phi3.log"
tok /tmp/phi3mini 32064 1 32000
python3 tools/make_dummy_model.py --shape llama-3.1-8b --out /tmp/llama8b >"$out/mk_llama.log" 2>&1 || tail -3 "$out/mk_llama.log"
for m in mistral7b phi3mini llama8b; do
  el "$m: pagoda run (greedy, 5000 positions: past Mistral's 4096 window and Phi-3's 4096 original length)"
  "$P" run -m /tmp/$m --device cuda --raw --temperature 0 -n 8 -p "hello" 2>"$out/run_$m.err" | head -c 200; echo " rc=${PIPESTATUS[0]}"
  grep -E "error|window|KV pool" "$out/run_$m.err" | head -4
  "$P" bench -m /tmp/$m --device cuda --num-prompts 1 --input-len 4992 --output-len 16 --temperature 0 --json 2>>"$out/run_$m.err" | head -c 400; echo
  for n in 1 64; do
    el "$m: pagoda bench $n x (512, 128)"
    "$P" bench -m /tmp/$m --device cuda --num-prompts $n --input-len 512 --output-len 128 --temperature 0 --json \
      2>"$out/bench_${m}_$n.err" | tee "$out/bench_${m}_$n.json"; echo
    grep -E "error" "$out/bench_${m}_$n.err" | head -3
  done
done
el done
