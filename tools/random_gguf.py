#!/usr/bin/env python3
"""random_gguf.py - a random-weight f16 GGUF of the Llama-3.2-1B or Llama-3.1-8B shape, in seconds.

For the GPU machine's side-by-side runs (pagoda and llama.cpp read the same file; weights' values
do not change their speed). ../shared/peers/make_random_gguf.py draws every weight afresh, which
takes about five minutes of a ten-minute device call for the 8B shape (16 GB); this draws one pool
of normal values (0.02 standard deviation, f16) as large as the largest matrix once, and every
matrix is a view of it at its own offset, so the time is the disk's. Norm weights are ones, the
vocabulary is the llama-spm test vocabulary padded with <extra_N> tokens to 128256.

Usage: python3 tools/random_gguf.py GGUF_PY_DIR OUT.gguf 1b|8b VOCAB.gguf [--seed N]
  GGUF_PY_DIR  the gguf-py folder of the llama.cpp source (peers/llama.cpp-*.tgz)
  VOCAB.gguf   ../shared/testdata/vocab/ggml-vocab-llama-spm.gguf
"""
import argparse
import os
import sys

SHAPES = {  # layers, hidden, ffn, heads, kv heads, tied embeddings
    "1b": (16, 2048, 8192, 32, 8, True),
    "8b": (32, 4096, 14336, 32, 8, False),
}
VOCAB = 128256


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf_py")
    ap.add_argument("out")
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("vocab")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import numpy as np
    try:
        import gguf
    except ImportError as e:
        sys.exit(f"error: cannot import gguf from {a.gguf_py} ({e}): give the gguf-py folder of the llama.cpp source")
    if not os.path.isfile(a.vocab):
        sys.exit(f"error: {a.vocab}: no such file (the llama-spm vocabulary GGUF)")

    layers, d, ff, nh, nkv, tied = SHAPES[a.shape]
    hd = d // nh
    reader = gguf.GGUFReader(a.vocab)

    def field(name):
        f = reader.fields[name]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(p).decode("utf-8") for p in field("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in field("tokenizer.ggml.scores")]
    ttypes = [int(p[0]) for p in field("tokenizer.ggml.token_type")]
    if len(tokens) > VOCAB:
        sys.exit(f"error: {a.vocab} has {len(tokens)} tokens, more than {VOCAB}")
    pad = VOCAB - len(tokens)
    tokens += ["<extra_%d>" % i for i in range(pad)]
    scores += [0.0] * pad
    ttypes += [4] * pad  # user-defined

    matrices = [("token_embd.weight", (VOCAB, d))]
    if not tied:
        matrices.append(("output.weight", (VOCAB, d)))
    for i in range(layers):
        b = f"blk.{i}."
        matrices += [(b + "attn_q.weight", (nh * hd, d)), (b + "attn_k.weight", (nkv * hd, d)),
                     (b + "attn_v.weight", (nkv * hd, d)), (b + "attn_output.weight", (d, nh * hd)),
                     (b + "ffn_gate.weight", (ff, d)), (b + "ffn_up.weight", (ff, d)),
                     (b + "ffn_down.weight", (d, ff))]
    largest = max(r * c for _, (r, c) in matrices)
    rng = np.random.default_rng(a.seed)
    span = largest + (1 << 20)  # room for offsets
    pool = np.empty(span, dtype=np.float16)
    step = 1 << 24
    for o in range(0, span, step):  # in slices, so the f32 draw never holds the whole pool
        n = min(step, span - o)
        pool[o:o + n] = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random-{a.shape}")
    w.add_context_length(131072)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(hd)
    w.add_file_type(1)  # mostly f16
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(ttypes)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    ones = np.ones(d, dtype=np.float32)
    w.add_tensor("output_norm.weight", ones)
    offset = 0
    for name, (r, c) in matrices:
        if name.endswith("attn_q.weight"):
            layer = name.split(".")[0] + "." + name.split(".")[1] + "."
            w.add_tensor(layer + "attn_norm.weight", ones)
            w.add_tensor(layer + "ffn_norm.weight", ones)
        n = r * c
        offset = (offset * 1103515245 + 12345 + n) % (span - n + 1)  # a different window each time
        w.add_tensor(name, pool[offset:offset + n].reshape(r, c))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: {a.shape}, {len(matrices)} matrices from a pool of {span} f16 values")


if __name__ == "__main__":
    main()
