"""Differential fuzz test of the text stack (fixed seeds, well under a minute): random strings
through several tokenizers trained with HF's trainer (pagoda `tokenize` vs HF `tokenizers`),
random id lists through `detokenize` (vs HF decode), and the shared chat templates with random
contexts (pagoda `render-template` vs Jinja2 configured as transformers configures it).

Known, documented differences are excluded by code point, never by case (docs/text.md, "Known
differences"): the random text never holds a code point that is unassigned in Unicode 14.0 (the
version of PCRE2 10.42 and of Python's unicodedata here; utf8proc 2.8 has Unicode 15.0 and HF's
Rust and Oniguruma tables are newer), since character classes of such code points differ by
table version, not by implementation."""
import json
import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
tk = pytest.importorskip("tokenizers")
jinja2 = pytest.importorskip("jinja2")
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers  # noqa: E402

import test_render_template as RT  # noqa: E402
import test_tokenizer_hf as TH  # noqa: E402

BIN = TH.BIN
SEED = 20261123


def excluded(cp):
    """Code points whose classes depend on the Unicode version (see the module docstring)."""
    return unicodedata.category(chr(cp)) in ("Cn", "Cs")


ASSIGNED = [chr(c) for c in range(0x80, 0x32000) if not excluded(c)]
MARKS = [c for c in ASSIGNED[:20000] if unicodedata.category(c).startswith("M")]
WORDS = ["the", "The", "hello", "hello_", "_hello", "world", "don't", "I'M", "it's", "you'll", "naïve", "Straße", "foo_bar",
         "über", "中文", "日本語", "한국어", "Привет", "مرحبا", "नमस्ते", "🦙", "👨‍👩‍👧", "x²", "①", "ﬁ", "Ａ"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2009", " \n ", "\u200b", "\u2028", "\x0b"]
PUNCT = list(".,;:!?'\"-_()[]{}<>|/\\@#$%^&*+=~`") + ["...", "--", "'s", "'ll", "```"]
SPECIAL_TEXT = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<unk>"]


def rand_text(r, n=None, special=True):
    out = []
    for _ in range(n if n is not None else r.randint(0, 12)):
        k = r.random()
        if k < 0.3:
            out.append(r.choice(WORDS))
        elif k < 0.45:
            out.append(r.choice(SPACES))
        elif k < 0.55:
            out.append(r.choice(PUNCT))
        elif k < 0.65:
            out.append(str(r.randint(0, 10 ** r.randint(1, 9))))
        elif k < 0.8:
            out.append("".join(r.choice(ASSIGNED) for _ in range(r.randint(1, 4))))
        elif k < 0.88:
            out.append(r.choice(WORDS) + r.choice(MARKS))
        elif k < 0.95 or not special:
            out.append("".join(chr(r.randint(0x20, 0x7e)) for _ in range(r.randint(1, 6))))
        else:
            out.append(r.choice(SPECIAL_TEXT))
    return "".join(out)


def run(args, data):
    return subprocess.run([BIN, *args], input=data, capture_output=True, timeout=60)


# ---- tokenizers ----

def tokenizers_under_test():
    l3 = TH.byte_level_bpe(TH.split_then_bytelevel(pre_tokenizers.Split(Regex(TH.LLAMA3), "isolated")),
                           ignore_merges=True)
    l3.add_tokens([AddedToken("hello", single_word=True), AddedToken("wörld", lstrip=True),
                   AddedToken("  ", normalized=False), AddedToken("[END]", rstrip=True)])
    q2 = TH.byte_level_bpe(TH.split_then_bytelevel(pre_tokenizers.Split(Regex(TH.QWEN2), "isolated")),
                           normalizer=normalizers.NFC())
    g2 = TH.byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True))
    ll2 = TH.train(TH.spm_like(pre=pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
                               decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                                          decoders.Fuse(), decoders.Strip(" ", 1, 0)])),
                   fallback=True)
    mi = TH.train(TH.spm_like(pre=pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                              decoder=decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)),
                  fallback=True)
    return {"llama3": l3, "qwen2": q2, "gpt2": g2, "llama2": ll2, "mistral": mi}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_tok")
    out = {}
    for name, t in tokenizers_under_test().items():
        (d / name).mkdir()
        t.save(str(d / name / "tokenizer.json"))
        out[name] = (t, d / name)
    return out


@pytest.mark.parametrize("name", ["llama3", "qwen2", "gpt2", "llama2", "mistral"])
def test_random_strings_encode_as_hf(trained, name):
    t, path = trained[name]
    r = random.Random(SEED + len(name))
    failures = []
    for _ in range(70):
        text = rand_text(r)
        want = t.encode(text, add_special_tokens=False).ids
        p = run(["tokenize", "-m", str(path), "--parse-special"], text.encode())
        got = [int(x) for x in p.stdout.split()]
        if p.returncode != 0 or got != want:
            failures.append((text, want, got, p.stderr[-200:]))
    assert not failures, failures[:3]


@pytest.mark.parametrize("name", ["llama3", "gpt2", "llama2", "mistral"])
def test_random_ids_decode_as_hf(trained, name):
    t, path = trained[name]
    r = random.Random(SEED * 3 + len(name))
    vocab = t.get_vocab()
    n = t.get_vocab_size()
    byte_ids = [i for k, i in vocab.items() if k.startswith("<0x") and len(k) == 6]
    special = [vocab[s] for s in TH.SPECIAL if s in vocab]
    failures = []
    for _ in range(40):
        ids = []
        for _ in range(r.randint(0, 12)):
            k = r.random()
            pool = byte_ids if k < 0.4 and byte_ids else special if k < 0.5 else range(n)
            ids.append(r.choice(pool))
        skip = r.random() < 0.3
        want = t.decode(ids, skip_special_tokens=skip)
        p = run(["detokenize", "-m", str(path)] + (["--skip-special"] if skip else []),
                " ".join(map(str, ids)).encode())
        if p.returncode != 0 or p.stdout.decode("utf-8", "replace") != want:
            failures.append((ids, skip, want, p.stdout, p.stderr[-200:]))
    assert not failures, failures[:3]


# ---- chat templates ----

def rand_args(r):
    return {rand_text(r, 1, special=False)[:12] or "k": r.choice([1, 2.5, "x", True, None, [1, "a"], {"u": "c"}])
            for _ in range(r.randint(0, 3))}


def rand_message(r):
    role = r.choice(["user", "assistant", "system", "tool", "user", "assistant", "ipython", "developer"])
    m = {"role": role, "content": rand_text(r, r.randint(0, 8), special=r.random() < 0.3)}
    if role == "assistant" and r.random() < 0.3:
        if r.random() < 0.3:
            m["content"] = None if r.random() < 0.5 else ""
        ident = "".join(r.choice("abcdefghijKLM0123456789") for _ in range(r.choice([9, 9, 9, 5])))
        m["tool_calls"] = [{"type": "function", "id": ident,
                            "function": {"name": r.choice(["get_weather", "f", "search"]),
                                         "arguments": rand_args(r) if r.random() < 0.7 else json.dumps(rand_args(r))}}
                           for _ in range(r.randint(1, 2))]
    if role == "tool":
        m["name"] = r.choice(["get_weather", "f"])
        if r.random() < 0.5:
            m["tool_call_id"] = "".join(r.choice("abc123") for _ in range(9))
    return m


def rand_context(r):
    ctx = {"messages": [rand_message(r) for _ in range(r.randint(0, 6))],
           "add_generation_prompt": r.random() < 0.6, "bos_token": "<s>", "eos_token": "</s>",
           "date_string": "22 Nov 2026"}
    if r.random() < 0.5:  # roles that alternate as most templates demand, so renders get far
        for i, m in enumerate(ctx["messages"]):
            m["role"] = "user" if i % 2 == 0 else "assistant"
            m.pop("name", None)
    if r.random() < 0.3:
        ctx["tools"] = [{"type": "function", "function": {
            "name": "get_weather", "description": rand_text(r, 3, special=False),
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}},
                           "required": ["city"]}}}]
    return ctx


def template_cases():
    ts = sorted(RT.TEMPLATES.glob("*.jinja")) if RT.TEMPLATES.is_dir() else []
    return [pytest.param(t, id=t.stem) for t in ts]


@pytest.mark.parametrize("tmpl", template_cases())
def test_shared_templates_random_contexts_match_jinja2(tmp_path, tmpl):
    source = tmpl.read_text(encoding="utf-8")
    compiled = RT.ENV.from_string(source)
    r = random.Random(SEED + len(tmpl.stem))
    failures, rendered = [], 0
    for i in range(40):
        ctx = rand_context(r)
        try:
            want, err = compiled.render(**ctx), None
        except jinja2.exceptions.TemplateError as e:
            want, err = None, str(e)
        except Exception as e:  # a Python-level error (TypeError, ...): pagoda must fail too
            want, err = None, e
        c = tmp_path / f"c{i}.json"
        c.write_text(json.dumps(ctx, ensure_ascii=r.random() < 0.5), encoding="utf-8")
        p = subprocess.run([BIN, "render-template", str(tmpl), str(c)], capture_output=True, timeout=60)
        if want is not None:
            rendered += 1
            ok = p.returncode == 0 and p.stdout.decode("utf-8") == want
        elif isinstance(err, str):
            ok = p.returncode == 1 and p.stderr.decode("utf-8") == err + "\n"
        else:
            ok = p.returncode == 1 and p.stdout == b""
        if not ok:
            failures.append((ctx, want, err, p.returncode, p.stdout[-300:], p.stderr[-300:]))
    assert not failures, failures[:2]
    assert rendered >= 10
