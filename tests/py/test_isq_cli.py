"""test_isq_cli.py - `pagoda run --isq`: stories260K (an F32 GGUF) quantized at load gives greedy
continuations close to the float model's, with progress on stderr; bad values are refused."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
TESTDATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "models" / "stories260K.gguf"
GREEDY = TESTDATA / "models" / "stories260K.greedy.jsonl"

needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"shared test data absent: {MODEL}")


def run(*args, timeout=60):
    return subprocess.run([BIN, "run", "-m", str(MODEL), "--max-model-len", "256", *args],
                          capture_output=True, timeout=timeout)


def cases():
    if not GREEDY.exists():
        return []
    return [json.loads(line) for line in GREEDY.read_text().splitlines() if line.strip()]


@needs_model
def test_isq_q8_0_greedy_mostly_equal():
    """--isq 8: Q8_0 rounds each weight to 1/254 of its block maximum; greedy text may part from
    the float model's after a near-tie, so at least 90% of the prompts must agree on their first
    48 characters (the bar the issue sets against llama.cpp)."""
    same = 0
    all_cases = cases()
    for case in all_cases:
        r = run("--isq", "8", "-p", case["prompt"], "--raw", "--temperature", "0",
                "-n", str(case["max_tokens"]))
        assert r.returncode == 0, r.stderr.decode()
        err = r.stderr.decode()
        assert "isq q8_0: 100%" in err and "q8_0 weights on cpu" in err
        same += r.stdout.decode()[:48] == case["continuation"][:48]
    assert all_cases and same * 10 >= len(all_cases) * 9, f"{same} of {len(all_cases)}"


@needs_model
@pytest.mark.parametrize("value,dtype", [("q4_0", "q4_0"), ("q4_k", "q5_0"), ("4", "q5_0"),
                                         ("q5_k", "q5_1"), ("q6_k", "q8_0")])
def test_isq_types_run(value, dtype):
    """Every --isq value loads and generates; stories260K's 64-wide rows fall back from the
    K-quants (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0) as llama.cpp does."""
    r = run("--isq", value, "-p", "Once upon a time", "--raw", "--temperature", "0", "-n", "16")
    assert r.returncode == 0, r.stderr.decode()
    assert f"{dtype} weights on cpu" in r.stderr.decode()
    assert len(r.stdout.decode()) > 0


@needs_model
@pytest.mark.parametrize("value", ["q3_k", "f16", "5", ""])
def test_isq_bad_value(value):
    r = run("--isq", value, "-p", "hi")
    assert r.returncode != 0
    err = r.stderr.decode()
    assert err.startswith("error: --isq must be q4_0, q4_k, q5_k, q6_k, q8_0, 4 (q4_k) or 8 (q8_0)"), err
