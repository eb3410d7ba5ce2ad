"""`pagoda tokenize` / `pagoda detokenize` end to end: the exact stdin/stdout format, the shared
vocabulary cases (ids made by HF tokenizers) through GGUF and tokenizer.json, and bad input
(clear message, exit code 1, no crash)."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
DATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
SEP = "\n__ggml_vocab_test__\n"

needs_data = pytest.mark.skipif(not (DATA / "vocab").is_dir(), reason="shared test data absent")


def run(args, stdin: bytes):
    return subprocess.run([BIN, *args], input=stdin, capture_output=True, timeout=60)


def cases(inp: Path, out: Path):
    texts = inp.read_text(encoding="utf-8").split(SEP)[:-1]
    ids = out.read_text(encoding="utf-8").split("\n")[: len(texts)]
    return list(zip(texts, ids))


SUITES = [
    ("vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-llama-spm.gguf"),
    ("vocab/ggml-vocab-phi-3.gguf", "vocab/ggml-vocab-phi-3.gguf"),
    ("tokenizers/phi-3-mini/tokenizer.json", "vocab/ggml-vocab-phi-3.gguf"),
    ("tokenizers/phi-3-mini", "vocab/ggml-vocab-phi-3.gguf"),
    ("vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-gpt-2.gguf"),
]


@needs_data
@pytest.mark.parametrize("model,suite", SUITES)
def test_vocab_cases_through_cli(model, suite):
    for text, line in cases(DATA / (suite + ".inp"), DATA / (suite + ".out")):
        r = run(["tokenize", "-m", str(DATA / model)], text.encode())
        assert r.returncode == 0, r.stderr
        out = r.stdout.decode()
        # One line: ids separated by single spaces, then the newline.
        assert out.endswith("\n") and out.count("\n") == 1
        body = out[:-1]
        assert body == " ".join(line.split()), (text, body, line)
        assert body == "" or all(tok.isdigit() for tok in body.split(" "))
        d = run(["detokenize", "-m", str(DATA / model)], out.encode())
        assert d.returncode == 0, d.stderr
        assert d.stdout == text.encode(), (text, d.stdout)


@needs_data
def test_phi2_directory_against_hf_ids():
    for text, line in cases(DATA / "vocab/ggml-vocab-gpt-2.gguf.inp", DATA / "tokenizers/phi-2/vocab-test.out"):
        r = run(["tokenize", "-m", str(DATA / "tokenizers/phi-2")], text.encode())
        assert r.returncode == 0 and r.stdout.decode().split() == line.split(), text


@needs_data
def test_special_flags():
    gguf = str(DATA / "vocab/ggml-vocab-llama-spm.gguf")
    plain = run(["tokenize", "-m", gguf], b"Hello").stdout.split()
    bos = run(["tokenize", "-m", gguf, "--add-special"], b"Hello").stdout.split()
    assert bos == [b"1"] + plain  # llama.cpp's SPM default adds BOS (id 1)
    assert run(["tokenize", "-m", gguf], b"<s>").stdout.split() != [b"1"]
    assert run(["tokenize", "-m", gguf, "--parse-special"], b"<s>").stdout.split() == [b"1"]
    both = run(["detokenize", "-m", gguf], b"1 15043").stdout
    skip = run(["detokenize", "-m", gguf, "--skip-special"], b"1 15043").stdout
    assert both == b"<s> Hello" and skip == b"Hello"


@needs_data
def test_empty_input_and_separators():
    gguf = str(DATA / "vocab/ggml-vocab-gpt-2.gguf")
    r = run(["tokenize", "-m", gguf], b"")
    assert r.returncode == 0 and r.stdout == b"\n"
    r = run(["detokenize", "-m", gguf], b"")
    assert r.returncode == 0 and r.stdout == b""
    # Newlines and repeated spaces between ids are accepted, as is a trailing newline.
    r = run(["detokenize", "-m", gguf], b"15496  995\n")
    assert r.returncode == 0 and r.stdout == b"Hello world"


def bad(args, stdin=b"", code=1):
    r = run(args, stdin)
    assert r.returncode == code, (args, r.returncode, r.stderr)
    err = r.stderr.decode()
    assert err.startswith("error: ") and "Traceback" not in err and len(err) < 2000
    return err


@needs_data
def test_bad_ids():
    gguf = str(DATA / "vocab/ggml-vocab-gpt-2.gguf")
    assert "not a token id" in bad(["detokenize", "-m", gguf], b"15496 abc 995")
    assert "not a token id" in bad(["detokenize", "-m", gguf], b"12x")
    assert "out of range" in bad(["detokenize", "-m", gguf], b"15496 50257")
    assert "out of range" in bad(["detokenize", "-m", gguf], b"-1")
    assert "not a token id" in bad(["detokenize", "-m", gguf], b"99999999999999999999")


def test_missing_and_malformed_files(tmp_path):
    assert "no such file" in bad(["tokenize", "-m", str(tmp_path / "nope.json")], b"hi")
    assert "no such file" in bad(["detokenize", "-m", str(tmp_path / "nope.gguf")], b"1")
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [')
    assert "malformed JSON" in bad(["tokenize", "-m", str(broken)], b"a")
    broken.write_text("{}")
    assert "vocab" in bad(["tokenize", "-m", str(tmp_path)], b"a")
    broken.write_text('{"model": {"type": "WordPiece", "vocab": {"a": 0}}}')
    assert "not supported" in bad(["tokenize", "-m", str(broken)], b"a")
    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    bad(["tokenize", "-m", str(fake)], b"a")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert "tokenizer.json" in bad(["tokenize", "-m", str(empty_dir)], b"a")


def test_usage_errors():
    bad(["tokenize"], code=2)
    bad(["tokenize", "-m"], code=2)
    bad(["detokenize", "--bogus"], code=2)
    r = run(["tokenize", "-h"], b"")
    assert r.returncode == 0 and b"--add-special" in r.stdout
