#!/usr/bin/env python3
"""make_dummy_model.py - writes a random-weight Llama with the real shapes of Llama-3.2-1B or
Llama-3.1-8B (config.json + model.safetensors, bf16), like vLLM's --load-format dummy, so that
speed work on the GPU machine has real sizes without downloading weights.

Weights are N(0, 0.02) (the HF initializer_range), norm weights 1 + N(0, 0.02); they are drawn
on the GPU when there is one (fast), then written with safetensors. The output is only for
timing: generation from it is noise, so benchmarks ignore EOS.

Usage: tools/make_dummy_model.py --shape llama-3.2-1b --out /tmp/llama-1b [--seed 0]
Also writes a synthetic byte-level tokenizer.json of the same vocabulary size (ids 0-255 the
bytes, then filler, then Llama 3's special-token ids) so that `pagoda bench` can load the
directory; it is not Llama 3's tokenizer. Needs torch and safetensors (both on the GPU
machine's image).
"""
import argparse
import json
import os
import sys
import time

SHAPES = {
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         tie_word_embeddings=True, rope_factor=32.0),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         tie_word_embeddings=False, rope_factor=8.0),
}


def make_config(s):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "num_hidden_layers": s["num_hidden_layers"],
        "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_key_value_heads"],
        "head_dim": s["head_dim"],
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": s["rope_factor"], "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": s["tie_word_embeddings"],
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
    }


def byte_symbols():
    """GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves, the other bytes
    for the code points from 256 up, in byte order (what the ByteLevel pre-tokenizer expects)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write_tokenizer(out_dir, vocab_size, bos, eos):
    """A synthetic byte-level BPE tokenizer.json of the model's vocabulary size (not Llama 3's
    merges: ids 0-255 are the bytes, the rest filler), so that engines which load a tokenizer
    with the model can run; prompts in benchmarks are random token ids anyway."""
    syms = byte_symbols()
    vocab = {sym: i for i, sym in enumerate(syms)}
    n_normal = bos  # Llama 3: the special tokens start at 128000
    for i in range(256, n_normal):
        vocab[f"<filler_{i}>"] = i
    added = []
    for i in range(n_normal, vocab_size):
        name = {bos: "<|begin_of_text|>", eos: "<|end_of_text|>"}.get(i, f"<|reserved_special_token_{i - n_normal}|>")
        added.append({"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    tok = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                                     "ids": [bos], "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True, "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as fp:
        json.dump(tok, fp, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fp:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, fp, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as fp:
        json.dump({"bos_token_id": bos, "eos_token_id": eos}, fp, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from safetensors.torch import save_file

    s = SHAPES[args.shape]
    cfg = make_config(s)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    d, f, hd = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    nh, nkv, vocab = s["num_attention_heads"], s["num_key_value_heads"], cfg["vocab_size"]

    def rnd(*shape):
        t = torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02
        return t.to(torch.bfloat16).cpu()

    def norm(n):
        return (1.0 + torch.randn(n, generator=gen, device=dev) * 0.02).to(torch.bfloat16).cpu()

    t0 = time.time()
    tensors = {"model.embed_tokens.weight": rnd(vocab, d), "model.norm.weight": norm(d)}
    if not s["tie_word_embeddings"]:
        tensors["lm_head.weight"] = rnd(vocab, d)
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm(d)
        tensors[p + "post_attention_layernorm.weight"] = norm(d)
        tensors[p + "self_attn.q_proj.weight"] = rnd(nh * hd, d)
        tensors[p + "self_attn.k_proj.weight"] = rnd(nkv * hd, d)
        tensors[p + "self_attn.v_proj.weight"] = rnd(nkv * hd, d)
        tensors[p + "self_attn.o_proj.weight"] = rnd(d, nh * hd)
        tensors[p + "mlp.gate_proj.weight"] = rnd(f, d)
        tensors[p + "mlp.up_proj.weight"] = rnd(f, d)
        tensors[p + "mlp.down_proj.weight"] = rnd(d, f)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as fp:
        json.dump(cfg, fp, indent=2)
    write_tokenizer(args.out, vocab, cfg["bos_token_id"], cfg["eos_token_id"])
    save_file(tensors, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    n = sum(t.numel() for t in tensors.values())
    print(f"{args.shape}: {n / 1e9:.2f} B parameters, {n * 2 / 2**30:.2f} GiB bf16 -> {args.out} "
          f"({time.time() - t0:.1f} s on {dev})", file=sys.stderr)


if __name__ == "__main__":
    main()
