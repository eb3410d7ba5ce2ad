"""Greedy generation with the default model (SmolLM2-135M-Instruct Q4_1) and its requantized
copies against llama.cpp: tests/fixtures/smollm2/NAME.greedy.jsonl hold llama.cpp's greedy
continuations (tools/llamacpp_greedy.py, llama-cpp-python 0.3.36's vendored llama.cpp, CPU, its
default f16 KV cache: key "continuation") of the 30 raw prompts in
tests/fixtures/smollm2/llamacpp_prompts.json, with the sha256 of the file generated from.
`pagoda run --raw --temperature 0` must give the same prompt ids on all prompts and the same
first 48 characters on as many as REQUIRED says (the issue's 90%: every copy reaches it). A copy
absent here (llama-quantize makes them; CI does not have
it) or of a weight type this build cannot compute yet is skipped with the reason."""
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
FIXDIR = ROOT / "tests" / "fixtures" / "smollm2"
MODELS = {"Q4_1": ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"}
for t in ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"):
    MODELS[t] = ROOT / "models" / "requant" / f"SmolLM2-135M-Instruct.{t}.gguf"
PREFIX = 48
# Share of prompts whose first 48 characters must equal llama.cpp's. The issue asks for 90% (27
# of 30). Every CPU op sums as llama.cpp's CPU build does: in decode, the F16-cache attention in
# llama.cpp's two orders (by the sequence's query length) and the K-quant matmuls in its prefill
# orders by the step's token count (Q4_K from 4 tokens, Q5_K/Q6_K from 8: docs/cpu-backend.md,
# "Fidelity to llama.cpp", "K-quant batch rule"); every copy reaches 30/30. Before the K-quant
# batch rule: Q5_K_M 26, Q6_K 24, Q4_K_M 20; before the attention orders: Q4_1 20, Q8_0 22, Q4_0
# 21, Q5_K_M 24, Q6_K 20, Q4_K_M 17. The 8-bit activations of the next matmul amplify any ulp, so
# the texts part at close calls; each model is held at its measured count less one (slack for
# summation order on other core counts) so that a regression still fails.
MEASURED = {"Q4_1": 30, "Q8_0": 30, "Q4_0": 30, "Q5_K_M": 30, "Q4_K_M": 30, "Q6_K": 30}
REQUIRED = {k: v - 1 for k, v in MEASURED.items()}


def fixtures():
    return sorted(p.name.split(".")[0] for p in FIXDIR.glob("*.greedy.jsonl"))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_fixtures_cover_every_copy():
    assert "Q4_1" in fixtures() and set(fixtures()) <= set(MODELS), fixtures()
    prompts = json.loads((FIXDIR / "llamacpp_prompts.json").read_text(encoding="utf-8"))
    assert len(prompts) == 30
    for name in fixtures():
        lines = [json.loads(x) for x in (FIXDIR / f"{name}.greedy.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [c["prompt"] for c in lines[1:]] == prompts
        # 32 tokens give >= 48 characters except after an early EOS or short pieces (then the
        # whole, shorter text is compared)
        assert sum(len(c["continuation"]) >= PREFIX for c in lines[1:]) >= 25, name


@pytest.mark.parametrize("name", fixtures())
def test_greedy_prefix_matches_llamacpp(name):
    head, *cases = [json.loads(x) for x in (FIXDIR / f"{name}.greedy.jsonl").read_text(encoding="utf-8").splitlines()]
    m = MODELS[name]
    if not m.exists():
        pytest.skip(f"{m} not here (made by tools/llamacpp_fixtures.sh with llama-quantize)")
    assert sha256(m) == head["sha256"], f"{m} is not the file llama.cpp generated from"
    same = 0
    misses = []
    for c in cases:
        ids = subprocess.run([BIN, "tokenize", "-m", str(m), "--add-special"], input=c["prompt"].encode(),
                             capture_output=True, timeout=120)
        assert ids.returncode == 0, ids.stderr.decode()
        assert [int(t) for t in ids.stdout.split()] == c["prompt_ids"], c["prompt"]
        r = subprocess.run([BIN, "run", "-m", str(m), "--raw", "--temperature", "0", "-n", str(c["max_tokens"]),
                            "-p", c["prompt"], "--device", "cpu", "--max-model-len", "256"], capture_output=True, timeout=300)
        err = r.stderr.decode(errors="replace")
        if r.returncode != 0 and re.search(r"dtype \S+ (is|are) not supported", err):
            pytest.skip(f"this build cannot compute {m.name}'s weight type yet: {err.strip().splitlines()[-1]}")
        assert r.returncode == 0, err
        got, want = r.stdout.decode("utf-8", errors="replace")[:PREFIX], c["continuation"][:PREFIX]
        same += got == want
        if got != want:
            misses.append((c["prompt"], want, got))
    assert same >= REQUIRED[name], f"{same}/{len(cases)} equal; misses: {misses}"
