#!/usr/bin/env python3
"""Tokenization throughput, one thread: pagoda (bench/tokenizer_bench, C) against HF tokenizers
(PyPI) on the same text and the same tokenizer.json, side by side in one run. Also checks that
both produce the same ids. Prints a Markdown table.

usage: bench/tokenizer_bench.py [--harness build/bench/tokenizer_bench] [--text FILE]
                                [--repeats N] [TOKENIZER_JSON ...]
Default: ../shared/testdata/corpus/tinyshakespeare.txt with the phi-2 (byte-level BPE) and
phi-3-mini (SentencePiece-style BPE) tokenizers of ../shared/testdata.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One thread for HF as well: its Rayon pool and the Python-side parallelism are both pinned.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402
import tokenizers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PAGODA_TESTDATA", ROOT.parent / "shared" / "testdata"))


def hf_time(tok, text, lines, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        if lines is None:
            out = tok.encode(text, add_special_tokens=False).ids
        else:
            out = [i for e in tok.encode_batch(lines, add_special_tokens=False) for i in e.ids]
        best = min(best, time.perf_counter() - t0)
    return best, out


def pagoda_run(harness, model, text_path, repeats, lines):
    with tempfile.NamedTemporaryFile("r", suffix=".ids") as f:
        cmd = [harness, "-m", str(model), "-f", str(text_path), "-r", str(repeats), "--ids", f.name]
        if lines:
            cmd.append("--lines")
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        ids = [int(x) for x in f.read().split()]
    return res, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--harness", default=str(ROOT / "build" / "bench" / "tokenizer_bench"))
    ap.add_argument("--text", default=str(DATA / "corpus" / "tinyshakespeare.txt"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("tokenizers", nargs="*")
    a = ap.parse_args()
    models = a.tokenizers or [str(DATA / "tokenizers/phi-2/tokenizer.json"),
                              str(DATA / "tokenizers/phi-3-mini/tokenizer.json")]
    text = Path(a.text).read_bytes().decode("utf-8")
    nbytes = len(text.encode("utf-8"))
    # Lines end at '\n' only (as the C harness splits them), each keeping its newline.
    lines = re.findall(r"[^\n]*\n|[^\n]+$", text)
    print(f"text: {a.text} ({nbytes} bytes, {len(lines)} lines); HF tokenizers {tokenizers.__version__}; "
          f"{platform.processor() or platform.machine()}, best of {a.repeats}, one thread\n")
    print("| tokenizer | mode | tokens | pagoda MB/s | HF tokenizers MB/s | speed-up | same ids |")
    print("|---|---|---:|---:|---:|---:|---|")
    ok = True
    for m in models:
        tok = Tokenizer.from_file(m)
        name = Path(m).parent.name
        for mode in ("whole text", "per line"):
            per_line = mode == "per line"
            hf_s, hf_ids = hf_time(tok, text, lines if per_line else None, a.repeats)
            res, ids = pagoda_run(a.harness, m, a.text, a.repeats, per_line)
            same = ids == hf_ids
            ok &= same
            hf_mb = nbytes / hf_s / 1e6
            print(f"| {name} | {mode} | {len(ids)} | {res['encode_mb_s']:.2f} | {hf_mb:.2f} | "
                  f"{res['encode_mb_s'] / hf_mb:.1f}x | {'yes' if same else 'NO'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
