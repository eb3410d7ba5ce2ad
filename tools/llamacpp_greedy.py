#!/usr/bin/env python3
"""llamacpp_greedy.py - greedy continuations of a GGUF model made by llama.cpp (llama-cpp-python).

Reference generator for tests/fixtures/stories260K.llamacpp_greedy.jsonl: for each prompt it adds
BOS, evaluates the prompt in one batch, then picks argmax of the last position's logits (greedy:
temperature 0 / top_k 1, no repetition penalty, no other sampler) one token at a time, for
max_tokens tokens or until an end-of-generation token (which is not printed). The continuation is
the concatenation of the generated tokens' pieces (llama_token_to_piece, special=False, no lstrip),
i.e. the text after the prompt, exactly what the shared file models/stories260K.greedy.jsonl holds.

Output: one JSON object per line:
  {"prompt", "max_tokens", "continuation", "prompt_ids" (llama.cpp's tokenization with BOS),
   "ids" (the generated token ids)}

Usage:
  python3 tools/llamacpp_greedy.py -m MODEL.gguf --prompts prompts.json [-n 64] > out.jsonl
  python3 tools/llamacpp_greedy.py -m MODEL.gguf --check shared.greedy.jsonl
--prompts takes a JSON list of strings (exact text, so newlines/CRLF/tabs survive); --check
regenerates every line of an existing file and reports the lines that differ (exit 1 if any).
Needs `pip install llama-cpp-python` (tested with 0.3.36, built from its sdist for the CPU).
"""
import argparse
import ctypes
import json
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama


class Greedy:
    """One llama.cpp model + context; generate() resets the KV cache for every prompt."""

    def __init__(self, model_path, n_ctx=2048, seed=0, flash_attn=False, kv_type=None):
        kv = {} if kv_type is None else {"type_k": kv_type, "type_v": kv_type}
        self.llm = Llama(model_path=model_path, n_ctx=n_ctx, n_batch=n_ctx, seed=seed,
                         logits_all=False, verbose=False, flash_attn=flash_attn, **kv)
        self.vocab = self.llm._model.vocab
        self.ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()

    def tokenize(self, prompt: str):
        return self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)

    def piece(self, tok: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, 256, 0, False)
        if n < 0:
            raise RuntimeError(f"piece of token {tok} longer than 256 bytes")
        return buf.raw[:n]

    def last_logits(self):
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def generate(self, prompt: str, max_tokens: int):
        prompt_ids = self.tokenize(prompt)
        self.llm.reset()  # n_tokens = 0: eval() then drops every KV cell from position 0 on
        self.llm.eval(prompt_ids)
        out_ids, text = [], b""
        self.min_gap = float("inf")  # smallest top-1 minus top-2 logit over the chosen tokens
        for _ in range(max_tokens):
            logits = self.last_logits()
            tok = int(np.argmax(logits))  # first maximum, as llama.cpp's greedy sampler
            top2 = np.partition(logits, -2)[-2:]
            self.min_gap = min(self.min_gap, float(top2[1] - top2[0]))
            if llama_cpp.llama_vocab_is_eog(self.vocab, tok):
                break
            out_ids.append(tok)
            text += self.piece(tok)
            self.llm.eval([tok])
        return prompt_ids, out_ids, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompts", help="JSON file: a list of prompt strings")
    ap.add_argument("--check", help="JSONL file to regenerate and compare")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash attention (default off)")
    ap.add_argument("--kv-f32", action="store_true", help="F32 KV cache (default: llama.cpp's F16)")
    ap.add_argument("--variants", action="store_true",
                    help="also store the continuations with llama.cpp's default F16 KV cache, flash "
                         "attention off (continuation_kv_f16) and on (continuation_kv_f16_fa)")
    args = ap.parse_args()
    g = Greedy(args.model, n_ctx=args.n_ctx, flash_attn=args.flash_attn,
               kv_type=0 if args.kv_f32 else None)  # 0 = GGML_TYPE_F32
    variants = {}
    if args.variants:
        variants = {"continuation_kv_f16": Greedy(args.model, n_ctx=args.n_ctx),
                    "continuation_kv_f16_fa": Greedy(args.model, n_ctx=args.n_ctx, flash_attn=True)}
    if args.check:
        bad = 0
        lines = [json.loads(l) for l in open(args.check, encoding="utf-8") if l.strip()]
        for case in lines:
            _, _, text = g.generate(case["prompt"], case["max_tokens"])
            ok = text.decode("utf-8", errors="replace") == case["continuation"]
            bad += not ok
            print(("OK  " if ok else "DIFF"), json.dumps(case["prompt"]))
            if not ok:
                print("   want:", json.dumps(case["continuation"]))
                print("   got: ", json.dumps(text.decode("utf-8", errors="replace")))
        print(f"{len(lines) - bad}/{len(lines)} reproduced")
        return 1 if bad else 0
    prompts = json.load(open(args.prompts, encoding="utf-8"))
    for p in prompts:
        prompt_ids, ids, text = g.generate(p, args.max_tokens)
        try:
            cont = text.decode("utf-8")
        except UnicodeDecodeError:
            # A continuation cut inside a UTF-8 sequence cannot be stored as JSON text exactly.
            print(f"skipped (continuation not valid UTF-8): {p!r}", file=sys.stderr)
            continue
        line = {"prompt": p, "max_tokens": args.max_tokens, "continuation": cont,
                "prompt_ids": prompt_ids, "ids": ids, "min_gap": round(g.min_gap, 6)}
        for key, v in variants.items():
            line[key] = v.generate(p, args.max_tokens)[2].decode("utf-8", errors="replace")
        print(json.dumps(line, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
