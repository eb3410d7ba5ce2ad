#!/usr/bin/env python3
"""make_random_model.py - random bf16 weights for a real config.json of any architecture pagoda
loads (Llama, Mistral, Qwen2, Qwen3, Phi-3), for loading and timing the real shapes on the GPU
machine without downloading weights (like vLLM's --load-format dummy). The output only runs: its
text is noise.

Weights are N(0, 0.02), norm weights 1 + N(0, 0.02), biases N(0, 0.02), drawn on the GPU when there
is one, written as one model.safetensors under the architecture's HF names (Phi-3: fused qkv_proj
and gate_up_proj; Qwen2: q/k/v biases; Qwen3: q_norm / k_norm).

Usage: tools/make_random_model.py --config CONFIG.json --out DIR [--tokenizer DIR] [--seed 0]
--tokenizer copies tokenizer.json / tokenizer_config.json from DIR (pagoda bench needs one).
Needs torch and safetensors.
"""
import argparse
import json
import os
import shutil
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    with open(args.config) as f:
        cfg = json.load(f)
    arch = cfg["architectures"][0]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    d, ff, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or d // nh
    vocab = cfg["vocab_size"]

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=dev) * 0.02).to(torch.bfloat16).cpu()

    def norm(n):
        return (1.0 + torch.randn(n, generator=gen, device=dev) * 0.02).to(torch.bfloat16).cpu()

    t0 = time.time()
    t = {"model.embed_tokens.weight": rnd(vocab, d), "model.norm.weight": norm(d)}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = rnd(vocab, d)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        t[p + "self_attn.o_proj.weight"] = rnd(d, nh * hd)
        t[p + "mlp.down_proj.weight"] = rnd(d, ff)
        if arch == "Phi3ForCausalLM":
            t[p + "self_attn.qkv_proj.weight"] = rnd((nh + 2 * nkv) * hd, d)
            t[p + "mlp.gate_up_proj.weight"] = rnd(2 * ff, d)
            continue
        t[p + "self_attn.q_proj.weight"] = rnd(nh * hd, d)
        t[p + "self_attn.k_proj.weight"] = rnd(nkv * hd, d)
        t[p + "self_attn.v_proj.weight"] = rnd(nkv * hd, d)
        t[p + "mlp.gate_proj.weight"] = rnd(ff, d)
        t[p + "mlp.up_proj.weight"] = rnd(ff, d)
        if arch == "Qwen2ForCausalLM":
            for n, k in (("q", nh), ("k", nkv), ("v", nkv)):
                t[p + f"self_attn.{n}_proj.bias"] = rnd(k * hd)
        if arch == "Qwen3ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
    os.makedirs(args.out, exist_ok=True)
    cfg = dict(cfg, torch_dtype="bfloat16")
    cfg.pop("auto_map", None)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if args.tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(args.tokenizer, name)
            if os.path.exists(src):
                shutil.copy(src, os.path.join(args.out, name))
    save_file(t, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    n = sum(x.numel() for x in t.values())
    print(f"{arch}: {n / 1e9:.2f} B parameters, {n * 2 / 2**30:.2f} GiB bf16 -> {args.out} "
          f"({time.time() - t0:.1f} s on {dev})", file=sys.stderr)


if __name__ == "__main__":
    main()
