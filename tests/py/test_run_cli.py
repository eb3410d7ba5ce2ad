"""test_run_cli.py - `pagoda run` end to end: greedy text on stories260K equals llama.cpp's greedy
continuations (../shared/testdata/models/stories260K.greedy.jsonl), seeded sampling is
reproducible, and bad input exits non-zero with a clear message."""
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
    return subprocess.run([BIN, "run", *args], capture_output=True, timeout=timeout)


def greedy_cases():
    if not GREEDY.exists():
        return []
    return [json.loads(line) for line in GREEDY.read_text().splitlines() if line.strip()]


@needs_model
@pytest.mark.parametrize("case", greedy_cases(), ids=lambda c: c["prompt"][:24])
def test_greedy_matches_llama_cpp(case):
    r = run("-m", str(MODEL), "-p", case["prompt"], "--raw", "--temperature", "0",
            "-n", str(case["max_tokens"]))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() == case["continuation"]
    err = r.stderr.decode()
    assert "tokens/s" in err and "Prefix caching enabled (block-level, PagedAttention)." in err


@needs_model
def test_greedy_same_with_other_engine_settings():
    case = greedy_cases()[0]
    base = ["-m", str(MODEL), "-p", case["prompt"], "--raw", "--temperature", "0", "-n", "64"]
    for extra in (["--pa-block-size", "8"], ["--prefix-cache-n", "0"], ["--prefill-chunk-size", "2"],
                  ["--pa-context-len", "2048", "--max-num-seqs", "1"]):
        r = run(*base, *extra)
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout.decode() == case["continuation"], extra
    r = run(*base, "--prefix-cache-n", "0")
    assert "Prefix caching disabled." in r.stderr.decode()


@needs_model
def test_seeded_sampling_is_reproducible():
    args = ["-m", str(MODEL), "-p", "Once upon a time", "--raw", "--temperature", "0.8", "-n", "48"]
    a = run(*args, "--seed", "7")
    b = run(*args, "--seed", "7")
    c = run(*args, "--seed", "8")
    assert a.returncode == b.returncode == c.returncode == 0
    assert a.stdout == b.stdout
    assert a.stdout != c.stdout


@needs_model
def test_stop_string_ends_output():
    case = greedy_cases()[0]
    r = run("-m", str(MODEL), "-p", case["prompt"], "--raw", "--temperature", "0", "-n", "64",
            "--stop", "Lily")
    assert r.returncode == 0
    assert r.stdout.decode() == case["continuation"].split("Lily")[0]


def test_missing_model():
    r = run("-m", "/nonexistent/model.gguf", "-p", "hi")
    assert r.returncode != 0
    assert b"/nonexistent/model.gguf" in r.stderr


def test_no_model_uses_pagoda_model():
    # without -m: $PAGODA_MODEL, then the default model (tests/py/test_default_model.py)
    r = subprocess.run([BIN, "run", "-p", "hi"], capture_output=True,
                       env={**os.environ, "PAGODA_MODEL": "/nonexistent/env-model.gguf"})
    assert r.returncode == 1 and r.stderr.startswith(b"error: ") and b"/nonexistent/env-model.gguf" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--pa-block-size", "12"], b"--pa-block-size must be 8, 16 or 32"),
    (["--temperature", "abc"], b"--temperature"),
    (["--bogus"], b"unknown option '--bogus'"),
    (["-n"], b"-n needs a value"),
    (["--paged-attn", "maybe"], b"--paged-attn must be auto, on or off"),
])
def test_bad_flags(args, needle):
    r = run("-m", str(MODEL), "-p", "hi", *args)
    assert r.returncode == 2
    assert needle in r.stderr


@needs_model
def test_impossible_budget_names_the_flag():
    r = run("-m", str(MODEL), "-p", "hi", "--pa-memory-mb", "1")
    assert r.returncode == 1
    assert b"raise --pa-memory-mb" in r.stderr
    # mutually exclusive flags are a usage error (exit 2), found before the model is loaded
    r = run("-m", str(MODEL), "-p", "hi", "--pa-memory-mb", "64", "--pa-context-len", "512")
    assert r.returncode == 2 and r.stderr.startswith(b"error: ") and b"mutually exclusive" in r.stderr


@needs_model
def test_prompt_too_long_is_rejected():
    r = run("-m", str(MODEL), "-p", "Once upon a time " * 600, "--raw", "-n", "8")
    assert r.returncode == 1
    assert b"exceeds the maximum sequence length" in r.stderr


@needs_model
def test_interactive_chat_without_template():
    # stories260K has no chat template: the lines and replies form one raw transcript
    r = subprocess.run([BIN, "run", "-m", str(MODEL), "--temperature", "0", "-n", "12"],
                       input=b"Once upon a time\nThe dog\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().split("\n")
    assert out[0] == ", there was a little girl named Lily. She loved to"[:len(out[0])] and len(out[0]) > 10
    assert r.stderr.decode().count("prompt: ") == 2


@needs_model
def test_contiguous_cache_same_greedy_text():
    case = greedy_cases()[0]
    r = run("-m", str(MODEL), "-p", case["prompt"], "--raw", "--temperature", "0", "-n", "64",
            "--paged-attn", "off")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() == case["continuation"]
    assert "Prefix caching enabled (sequence-level, contiguous cache" in r.stderr.decode()


@pytest.mark.parametrize("args", [["-n", "abc"], ["-n", "0"], ["--max-tokens", "x"], ["--top-p", "2"],
                                  ["--pa-block-size", "12"]])
def test_bad_flag_value_is_one_error_line_exit_2(args):
    """A bad value is a usage error (exit 2) reported by exactly one `error:` line."""
    r = run("-m", str(MODEL), "-p", "hi", *args)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.decode().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and args[0] in lines[0], lines


@needs_model
def test_ignored_options_say_so():
    """Options that cannot apply are named on stderr instead of being dropped silently:
    --system without a chat template, --revision / --hf-file with a local path."""
    r = run("-m", str(MODEL), "--system", "be brief", "--revision", "v1", "--hf-file", "x.gguf",
            "-p", "Once upon a time", "-n", "4", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "note: --system ignored: the model has no chat template" in err
    assert "--revision v1 ignored" in err and "--hf-file x.gguf ignored" in err
    r = run("-m", str(MODEL), "--system", "be brief", "--raw", "-p", "Once", "-n", "2")
    assert "note: --system ignored: --raw sends the prompt as is" in r.stderr.decode()
