"""The default model, SmolLM2-135M-Instruct Q4_1 (models/, fetched by scripts/setup.sh --model,
which `make test` runs): its tokenizer (pre `smollm`) against HF tokenizers built from the same
GGUF vocabulary and merges with SmolLM2's tokenizer.json pipeline (Digits(individual) then
ByteLevel regex, no normalizer), its ChatML template from the metadata rendered by pagoda
against jinja2 (what HF's apply_chat_template runs), a chat answer from it without -m, and the
default-model resolution."""
import json
import os
import subprocess
from pathlib import Path

import pytest

tk = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
jinja2 = pytest.importorskip("jinja2")
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PAGODA_BIN", str(ROOT / "build" / "pagoda"))
DATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def reader():
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing: run scripts/setup.sh --model")
    return gguf.GGUFReader(str(MODEL))


def field_str(r, key):
    f = r.fields[key]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def field_list(r, key):
    f = r.fields[key]
    return [f.parts[i] for i in f.data]


@pytest.fixture(scope="module")
def hf(reader):
    assert field_str(reader, "tokenizer.ggml.model") == "gpt2"
    assert field_str(reader, "tokenizer.ggml.pre") == "smollm"
    toks = [bytes(p).decode("utf-8") for p in field_list(reader, "tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in field_list(reader, "tokenizer.ggml.token_type")]
    merges = [tuple(bytes(p).decode("utf-8").split(" ", 1)) for p in field_list(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(toks, types) if ty == 3])  # control tokens
    return tok


def pagoda(args, data: bytes):
    p = subprocess.run([BIN, *args], input=data, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p.stdout.decode("utf-8")


def strings():
    s = ["Hello world! The quick brown fox, 12345 tokens.\n  Indented   text",
         "What is the capital of France? Answer in one sentence.",
         "Über straße café naïve 你好世界 こんにちは Привет мир 🦙🚀 3.14159 don't I'M YOU'LL it's\t\ttabs\n\n\n",
         "def f(x):\n    return x**2  # 2024-01-31\r\n", "   ", "\n", "a  b   c    d", "1234567890 12 1"]
    shakespeare = DATA / "corpus" / "tinyshakespeare.txt"
    if shakespeare.exists():
        text = shakespeare.read_text(encoding="utf-8")
        s += [text[i:i + 700] for i in range(0, 14000, 1400)]
    return s


def test_tokenizer_matches_hf(hf):
    for s in strings():
        ids = [int(x) for x in pagoda(["tokenize", "-m", str(MODEL)], s.encode()).split()]
        assert ids == hf.encode(s, add_special_tokens=False).ids, repr(s[:80])


def test_special_tokens_parse_like_hf(hf):
    s = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    ids = [int(x) for x in pagoda(["tokenize", "-m", str(MODEL), "--parse-special"], s.encode()).split()]
    assert ids == hf.encode(s, add_special_tokens=False).ids
    assert ids[0] == hf.token_to_id("<|im_start|>")


def test_chat_template_renders_as_jinja2(reader, tmp_path):
    tmpl = field_str(reader, "tokenizer.chat_template")
    assert "<|im_start|>" in tmpl  # ChatML
    (tmp_path / "t.jinja").write_text(tmpl, encoding="utf-8")
    toks = [bytes(p).decode("utf-8") for p in field_list(reader, "tokenizer.ggml.tokens")]
    eos = toks[int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])]
    bos = toks[int(reader.fields["tokenizer.ggml.bos_token_id"].parts[-1][0])]
    convs = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # transformers' settings
    for msgs in convs:
        for agp in (True, False):
            ctx = {"messages": msgs, "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
            (tmp_path / "c.json").write_text(json.dumps(ctx), encoding="utf-8")
            got = pagoda(["render-template", str(tmp_path / "t.jinja"), str(tmp_path / "c.json")], b"")
            assert got == env.from_string(tmpl).render(**ctx)
    assert got.startswith("<|im_start|>system\n")


def test_pagoda_model_env_resolution(tmp_path):
    # PAGODA_MODEL wins over the default; an empty one falls back to it.
    p = subprocess.run([BIN, "run", "-p", "x", "-n", "1"], capture_output=True, timeout=120,
                       env={**os.environ, "PAGODA_MODEL": str(tmp_path / "nope.gguf")})
    assert p.returncode == 1 and b"nope.gguf" in p.stderr and p.stderr.startswith(b"error: ")
    p = subprocess.run([BIN, "run", "-p", "Once upon a time", "-n", "4", "--temperature", "0"], capture_output=True,
                       timeout=120, env={**os.environ, "PAGODA_MODEL": str(DATA / "models" / "stories260K.gguf")})
    assert p.returncode == 0 and p.stdout, p.stderr


def test_default_model_chats(reader):
    # no -m and no PAGODA_MODEL: the default model answers a user turn through its ChatML template
    env = {k: v for k, v in os.environ.items() if k != "PAGODA_MODEL"}
    p = subprocess.run([BIN, "run", "-p", "What is the capital of France? Answer in one sentence.", "--temperature",
                        "0", "-n", "24", "--max-model-len", "512"], capture_output=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert "Paris" in p.stdout.decode(), p.stdout
