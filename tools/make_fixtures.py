#!/usr/bin/env python3
"""make_fixtures.py - tiny random-weight transformers models and their logits, for pagoda's tests.

Each fixture is a directory written by transformers' save_pretrained (config.json, safetensors
weights), plus tokens.json (the input token ids, a JSON list) and logits.bin (float32
little-endian, shape (n_tokens, vocab_size): model(input_ids).logits of one sequence, computed
in float32 eval mode with eager attention on the CPU). Seeds are fixed; the script reloads every
saved fixture and checks that the reloaded model reproduces the logits it wrote.

Usage: python3 make_fixtures.py --out DIR [--only NAME ...]
Needs torch and transformers (4.45+ or 5.x).
"""
import argparse
import json
import math
import os
import platform
import sys
import traceback

# Input ids shared by every fixture: spread over the vocabulary, with repeats (the same token at
# two positions must give different logits through RoPE) and the first and last ids.
TOKENS = [1, 17, 200, 43, 43, 255, 0, 128, 77, 17, 9, 250]
VOCAB = 256


def specs():
    """name -> (class name, config kwargs, extra). All: vocab 256, hidden 64, 2 layers."""
    base = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, max_position_embeddings=256,
                initializer_range=0.1, bos_token_id=1, eos_token_id=2, hidden_act="silu")
    return {
        # Llama-2-like: multi-head attention, untied classifier.
        "llama": ("LlamaForCausalLM",
                  dict(base, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False), {}),
        # Llama-3-like: GQA, llama3 RoPE scaling, tied embeddings, eos as a list. The scaling
        # factors are Llama-3.1's (8, 1, 4); original_max_position_embeddings is 64 instead of
        # 8192 so that, at these 12 positions, all three frequency bands (kept, smoothed,
        # divided by 8) change the logits measurably.
        "llama3": ("LlamaForCausalLM",
                   dict(base, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                        eos_token_id=[2, 3],
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0,
                                          original_max_position_embeddings=64)), {}),
        # head_dim (32) != hidden / heads (16), with GQA.
        "llama_hd": ("LlamaForCausalLM",
                     dict(base, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                          rope_theta=10000.0, tie_word_embeddings=False), {}),
        "mistral": ("MistralForCausalLM",
                    dict(base, intermediate_size=112, num_attention_heads=8,
                         num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=1000000.0,
                         sliding_window=None, tie_word_embeddings=False), {}),
        "qwen2": ("Qwen2ForCausalLM",
                  dict(base, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
                       tie_word_embeddings=False), {}),
        "llama_bf16": ("LlamaForCausalLM",
                       dict(base, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                            tie_word_embeddings=False), {"bf16": True}),
        "llama_sharded": ("LlamaForCausalLM",
                          dict(base, intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                               tie_word_embeddings=False), {"shards": 2}),
        # Mistral v0.1's sliding window, small enough (5) that the 12 tokens and the greedy
        # prompts cross it.
        "mistral_sw": ("MistralForCausalLM",
                       dict(base, intermediate_size=112, num_attention_heads=4,
                            num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                            sliding_window=5, tie_word_embeddings=False), {"greedy": True}),
        # Qwen3: q_norm / k_norm per head, head_dim 32 != hidden / heads, tied embeddings.
        "qwen3": ("Qwen3ForCausalLM",
                  dict(base, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       use_sliding_window=False, tie_word_embeddings=True),
                  {"greedy": True, "gguf": True}),
        # Phi-3: fused qkv_proj / gate_up_proj, LongRoPE with original_max_position_embeddings 8
        # (so the 12 tokens use the long factors in one prompt, and one token at a time switches
        # from short to long at the 9th), partial_rotary_factor 0.75 (12 of 16 dims rotated),
        # attention factor sqrt(1 + ln(64/8) / ln 8).
        "phi3": ("Phi3ForCausalLM",
                 dict(base, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, original_max_position_embeddings=8,
                      partial_rotary_factor=0.75, rms_norm_eps=1e-5, rope_theta=10000.0,
                      pad_token_id=0, sliding_window=None, tie_word_embeddings=False,
                      rope_scaling=dict(rope_type="longrope", original_max_position_embeddings=8,
                                        short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                        long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0])),
                 {"greedy": True, "gguf": True}),
    }


def version_tuple(v):
    out = []
    for part in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def make_config(transformers, cls_name, kw):
    """The config object; transformers 5 takes RoPE settings as one rope_parameters dict."""
    kw = dict(kw)
    cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    if version_tuple(transformers.__version__) >= (5, 0):
        rope = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
        scaling = kw.pop("rope_scaling", None)
        if scaling:
            rope.update(scaling)
        kw["rope_parameters"] = rope
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def randomize_extras(torch, model, seed):
    """transformers initialises RMSNorm weights to 1 and biases to 0; give them random values so
    that a loader or forward pass that drops or misplaces them changes the logits."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def logits_of(torch, model):
    ids = torch.tensor([TOKENS], dtype=torch.long)
    with torch.no_grad():
        return model(input_ids=ids).logits[0].float().contiguous()


# Greedy prompts of the "greedy" fixtures: one that starts inside the sliding window / LongRoPE's
# original length and crosses it while decoding, one past it from the prompt on.
GREEDY_PROMPTS = [TOKENS[:3], TOKENS]
GREEDY_NEW = 16


def step_logits(torch, model, ids):
    """Logits of IDS fed one token at a time through the cache (LongRoPE then switches from the
    short to the long factors mid-sequence, as in generation)."""
    past, rows = None, []
    with torch.no_grad():
        for t in ids:
            out = model(input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows).contiguous()


def greedy(torch, model, prompt, n):
    """Greedy continuation of PROMPT: the prompt in one step, then one token a step with the
    cache, argmax each time (what generate(do_sample=False) does, with no stop token)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        past, toks = out.past_key_values, []
        for _ in range(n):
            t = int(out.logits[0, -1].argmax())
            toks.append(t)
            out = model(input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
    return toks


def write_byte_tokenizer(out):
    """OUT/tokenizer.json: a byte-level BPE over exactly the VOCAB (256) byte symbols, no merges
    and no special tokens, so that the engine (which loads a tokenizer with the model) can run a
    fixture; id i is byte i in GPT-2's byte-to-symbol mapping."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    syms, extra = {}, 0
    for b in range(256):
        if b in keep:
            syms[b] = chr(b)
        else:
            syms[b] = chr(256 + extra)
            extra += 1
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": byte_level,
           "post_processor": None, "decoder": byte_level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": True, "vocab": {syms[b]: b for b in range(256)}, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
        f.write("\n")


def write_gguf(torch, name, model, cfg, out):
    """OUT/model.gguf: the fixture converted with gguf-py in llama.cpp's layout (the keys and
    tensor names of convert_hf_to_gguf.py: Phi3MiniModel for phi3, its Qwen3 layout for qwen3),
    F32, with a placeholder vocabulary of VOCAB tokens. llama.cpp's converter itself needs the
    model's tokenizer files, which these random models do not have. Phi-3's longrope factors go
    in the tensors rope_factors_short/long.weight and rope.dimension_count is the rotated dims
    (head_dim * partial_rotary_factor, as later llama.cpp versions write it)."""
    import gguf
    import numpy as np
    arch = {"phi3": "phi3", "qwen3": "qwen3"}[name]
    c = cfg.to_dict()
    rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
    nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    hd = c.get("head_dim") or d // nh
    w = gguf.GGUFWriter(os.path.join(out, "model.gguf"), arch)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "qwen3":
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([1] * VOCAB)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"] if isinstance(c["eos_token_id"], int) else c["eos_token_id"][0])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight",
                 "self_attn.qkv_proj.weight": "attn_qkv.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
                 "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight"}
    if arch == "phi3":
        prf = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
        rot = int(hd * prf)
        orig = rp.get("original_max_position_embeddings", c.get("original_max_position_embeddings"))
        scale = c["max_position_embeddings"] / orig
        w.add_rope_dimension_count(rot)
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_sliding_window(c.get("sliding_window") or 0)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.asarray(rp["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rp["short_factor"], dtype=np.float32))
    sd = model.state_dict()
    for k, v in sd.items():
        if k == "lm_head.weight" and c.get("tie_word_embeddings"):
            continue
        if k in names:
            gname = names[k]
        else:
            parts = k.split(".")
            gname = f"blk.{parts[2]}." + per_layer[".".join(parts[3:])]
        w.add_tensor(gname, v.detach().float().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def save(model, out, max_shard_size=None):
    kw = {}
    if max_shard_size is not None:
        kw["max_shard_size"] = max_shard_size
    try:
        model.save_pretrained(out, safe_serialization=True, **kw)
    except TypeError:  # transformers 5 always writes safetensors and dropped the flag
        model.save_pretrained(out, **kw)


def load(transformers, torch, cls_name, out):
    cls = getattr(transformers, cls_name)
    try:
        return cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        return cls.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager")


def total_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.state_dict().values())


def build(torch, transformers, name, cls_name, kw, extra, out, seed):
    torch.manual_seed(seed)
    cfg = make_config(transformers, cls_name, kw)
    model = getattr(transformers, cls_name)(cfg).float().eval()
    randomize_extras(torch, model, seed)
    if extra.get("bf16"):
        # Save bf16 weights; the reference logits come from those same (rounded) weights upcast.
        # save_pretrained records the parameters' dtype in config.json (checked below).
        model = model.to(torch.bfloat16)
        save(model, out)
    elif extra.get("shards"):
        # Shards hold whole tensors: find a limit that gives exactly the wanted count.
        for frac in (0.6, 0.55, 0.7, 0.5, 0.8, 0.45, 0.9):
            for f in os.listdir(out):
                os.remove(os.path.join(out, f))
            save(model, out, max_shard_size=int(total_bytes(model) * frac))
            n = sum(f.endswith(".safetensors") for f in os.listdir(out))
            if n == extra["shards"]:
                break
    else:
        save(model, out)
    if extra.get("bf16"):
        # The reference is the saved bf16 weights upcast to float32: reload them. (The model in
        # memory is not it: .to(bfloat16) also rounded the RoPE inv_freq buffer, which a float32
        # load recomputes.) Its parameters must equal the bf16 ones exactly.
        reloaded = load(transformers, torch, cls_name, out).eval()
        got = dict(reloaded.named_parameters())
        for pname, p in model.named_parameters():
            assert torch.equal(got[pname].float(), p.float()), f"{name}: {pname} changed on reload"
        model = reloaded
    logits = logits_of(torch, model)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(TOKENS, f)
        f.write("\n")
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))

    if extra.get("gguf"):
        write_gguf(torch, name, model, cfg, out)
    if extra.get("greedy"):
        write_byte_tokenizer(out)
        step_logits(torch, model, TOKENS).numpy().astype("<f4").tofile(
            os.path.join(out, "logits_step.bin"))
        with open(os.path.join(out, "greedy.json"), "w") as f:
            json.dump([{"prompt": p, "output": greedy(torch, model, p, GREEDY_NEW)}
                       for p in GREEDY_PROMPTS], f)
            f.write("\n")

    # Checks: the files reproduce the logits; shapes, sharding and dtype are what was asked.
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    if extra.get("shards"):
        assert "model.safetensors.index.json" in files, files
        assert len(shards) == extra["shards"], shards
    else:
        assert shards == ["model.safetensors"], shards
    with open(os.path.join(out, "config.json")) as f:
        saved_cfg = json.load(f)
    if extra.get("bf16"):
        assert (saved_cfg.get("torch_dtype") or saved_cfg.get("dtype")) == "bfloat16", saved_cfg
    reloaded = load(transformers, torch, cls_name, out).eval()
    again = logits_of(torch, reloaded)
    diff = (again - logits).abs().max().item()
    assert diff < 1e-5, f"{name}: reloaded model's logits differ by {diff}"
    assert logits.shape == (len(TOKENS), VOCAB), logits.shape
    std = logits.std().item()
    assert std > 0.1, f"{name}: logits std {std} too small to test anything"
    size = sum(os.path.getsize(os.path.join(out, f)) for f in files)
    print(f"{name}: {cls_name}, files {files}, {size} bytes, logits std {std:.3f}, "
          f"reload max diff {diff:.2e}", flush=True)
    return size


README = """# Test fixtures: tiny random-weight transformers models

Made by `tools/make_fixtures.py` (fixed seeds) on the project's GPU machine's CPU:

    python3 tools/make_fixtures.py --out tests/fixtures

Versions: {versions}

Each directory holds what `save_pretrained` wrote (`config.json`, `generation_config.json`,
`model.safetensors` or `model.safetensors.index.json` + shards), plus

- `tokens.json`: the input token ids (a JSON list, the same for every fixture);
- `logits.bin`: float32 little-endian, shape (n_tokens, vocab_size): `model(input_ids).logits`
  for that one sequence, computed in float32, eval mode, eager attention, on the CPU.

All have vocab 256, hidden 64, 2 layers, max_position_embeddings 256 and initializer_range 0.1;
RMSNorm weights are set to 1 + 0.2 N(0,1) and biases to 0.5 N(0,1) (transformers would make
them 1 and 0, which would hide a loader that drops them).

| name | class | what it covers |
|---|---|---|
| llama | LlamaForCausalLM | Llama-2-like: 4 heads (MHA), ffn 128, untied lm_head |
| llama3 | LlamaForCausalLM | GQA 4/2, ffn 96, rope_theta 5e5, rope_scaling llama3 (factor 8, low 1, high 4, original_max_position_embeddings 64 so that all three frequency bands matter at 12 positions), tie_word_embeddings, eos_token_id a list |
| llama_hd | LlamaForCausalLM | head_dim 32 != hidden/heads 16, GQA 4/2 |
| mistral | MistralForCausalLM | GQA 8/2, ffn 112, rope_theta 1e6, sliding_window null |
| qwen2 | Qwen2ForCausalLM | q/k/v biases, GQA 4/2, ffn 160, rope_theta 1e6 |
| llama_bf16 | LlamaForCausalLM | weights saved in bfloat16; logits from those weights upcast to float32 (the saved directory reloaded with `from_pretrained(dtype=float32)`) |
| llama_sharded | LlamaForCausalLM | max_shard_size small: model.safetensors.index.json + 2 shards |
| mistral_sw | MistralForCausalLM | sliding_window 5 (the 12 tokens and the greedy prompts cross it), GQA 4/2, ffn 112 |
| qwen3 | Qwen3ForCausalLM | q_norm / k_norm per head, head_dim 32 != hidden/heads 16, GQA 4/2, ffn 96, tied embeddings |
| phi3 | Phi3ForCausalLM | fused qkv_proj / gate_up_proj, GQA 4/2, ffn 96, LongRoPE (6 short and 6 long factors, original_max_position_embeddings 8, max_position_embeddings 64: attention factor sqrt(2)), partial_rotary_factor 0.75 (12 of 16 dims rotated) |

`mistral_sw`, `qwen3` and `phi3` also hold `logits_step.bin` (float32, (n_tokens, vocab_size):
the same tokens fed one at a time through transformers' cache; for phi3 it differs from
`logits.bin`, since LongRoPE uses the short factors while the sequence is at most 8 tokens long)
and `greedy.json` (a list of {{"prompt", "output"}}: 16 greedy tokens after the prompt in one step,
then one token a step with the cache, no stop token; prompts of 3 and 12 tokens, so one crosses
the window / the LongRoPE switch while decoding and one from the prompt on).
They also hold `tokenizer.json`: a byte-level BPE of the 256 byte symbols, no merges, no special
tokens, so that the engine can load them (`tests/c/test_engine_window.c`).
`qwen3` and `phi3` also hold `model.gguf`: the same weights converted with gguf-py in llama.cpp's
layout (the keys and tensor names of convert_hf_to_gguf.py: Phi3MiniModel's `phi3.*` keys,
`attn_qkv`, fused `ffn_up`, `rope_factors_short/long.weight`, `rope.scaling.attn_factor` and
`.original_context_length`; Qwen3's `attn_q_norm` / `attn_k_norm`), F32, with a placeholder
vocabulary of 256 tokens (llama.cpp's converter itself needs the model's tokenizer files, which
these random models lack; the llama.cpp commit in ../shared/peers has no Qwen3 support, and
writes phi3's rope.dimension_count as head_dim, which later versions correct for
partial_rotary_factor: this file has the rotated dims, 12). `tests/c/test_model_fixtures.c`
checks it against the same logits.

The script reloads each saved directory with `from_pretrained` and checks that it reproduces
`logits.bin` (max abs difference printed by the script), so the files and the logits agree.

Log of the run:

```
{log}
```
"""


# ---- Gemma 2 and Mixtral (issue 10): fixtures with a longer prompt, greedy continuations that
# cross the sliding window, and GGUF conversions written with gguf-py the way llama.cpp's
# convert_hf_to_gguf.py lays them out (Gemma 2: norm weights + 1, lm_head dropped as tied;
# Mixtral: GGUF arch "llama", Q/K rows permuted for interleaved RoPE, experts stacked into
# ffn_{gate,up,down}_exps of shape (n_expert, rows, cols)).

# 40 prompt tokens: spread over the vocabulary with repeats; 5x Gemma 2's window of 8.
ARCH_TOKENS = [1, 17, 200, 43, 43, 255, 0, 128, 77, 17, 9, 250, 33, 64, 64, 101, 5, 199, 230, 12,
               17, 88, 3, 145, 167, 43, 2, 99, 210, 71, 71, 130, 18, 240, 6, 57, 190, 11, 222, 1]
GREEDY_PROMPT = 12   # greedy.json: the first 12 prompt tokens, then
GREEDY_NEW = 28      # 28 greedy tokens (positions 12..39: far past the window of 8)


def arch_specs():
    """name -> (class name, config kwargs). vocab 256, hidden 64."""
    base = dict(vocab_size=VOCAB, hidden_size=64, max_position_embeddings=256, initializer_range=0.1,
                bos_token_id=1, eos_token_id=2, rope_theta=10000.0)
    return {
        # Gemma 2: 4 layers (local, global, local, global), window 8, head_dim 32 != 64/4,
        # query_pre_attn_scalar 24 != head_dim, softcaps small enough to bend these scores/logits.
        "gemma2": ("Gemma2ForCausalLM",
                   dict(base, num_hidden_layers=4, intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                        sliding_window=8, attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
                        tie_word_embeddings=True, pad_token_id=0)),
        # Mixtral: 8 experts, top 2, GQA 4/2, no sliding window.
        "mixtral": ("MixtralForCausalLM",
                    dict(base, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
                         num_key_value_heads=2, rms_norm_eps=1e-5, num_local_experts=8,
                         num_experts_per_tok=2, sliding_window=None, router_jitter_noise=0.0,
                         tie_word_embeddings=False, hidden_act="silu")),
    }


def randomize_arch_extras(torch, model, seed, gemma):
    """Norm weights random: Gemma's RMSNorm scales by (1 + w), so there w = 0.2 N(0,1)."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn(p.shape, generator=g))


def full_logits(torch, model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0].float().contiguous()


def greedy_full(torch, model, prompt, n_new):
    """Greedy tokens by a full forward pass per step (no KV cache: the plain definition)."""
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(int(full_logits(torch, model, ids)[-1].argmax().item()))
    return ids[len(prompt):]


def saved_tensors(out):
    from safetensors.numpy import load_file
    sd = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(out, f)))
    return sd


def write_gguf(name, sd, cfg, path):
    """GGUF (all f32) of a saved fixture with gguf-py; llama.cpp's tensor names and layout."""
    import numpy as np
    import gguf
    L = cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    arch = "gemma2" if name.startswith("gemma2") else "llama"
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(0)  # ALL_F32
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(rope))
    t = {}
    t["token_embd.weight"] = sd["model.embed_tokens.weight"]
    t["output_norm.weight"] = sd["model.norm.weight"]
    if arch == "gemma2":
        hd = cfg["head_dim"]
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
        # Not a llama.cpp key: llama.cpp derives the query scale from the model size (27B:
        # hidden/heads, else head_dim). pagoda reads this key when present (docs/model-formats.md),
        # so the fixture's query_pre_attn_scalar != head_dim survives the conversion.
        w.add_uint32("gemma2.attention.query_pre_attn_scalar", int(cfg["query_pre_attn_scalar"]))
        names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                 "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
        for i in range(L):
            for hf, gg in names.items():
                t[f"blk.{i}.{gg}.weight"] = sd[f"model.layers.{i}.{hf}.weight"]
        for k in list(t):  # llama.cpp's converter stores Gemma's (1 + w) norm weights
            if k.endswith("norm.weight"):
                t[k] = t[k] + 1.0
    else:
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_rope_dimension_count(cfg["hidden_size"] // H)
        t["output.weight"] = sd["lm_head.weight"]

        def permute(x, n_head):  # HF rotate_half order -> GGUF llama's interleaved pairs
            return (x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:])
                    .swapaxes(1, 2).reshape(x.shape))
        for i in range(L):
            p = f"model.layers.{i}."
            t[f"blk.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
            t[f"blk.{i}.ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
            t[f"blk.{i}.attn_q.weight"] = permute(sd[p + "self_attn.q_proj.weight"], H)
            t[f"blk.{i}.attn_k.weight"] = permute(sd[p + "self_attn.k_proj.weight"], KV)
            t[f"blk.{i}.attn_v.weight"] = sd[p + "self_attn.v_proj.weight"]
            t[f"blk.{i}.attn_output.weight"] = sd[p + "self_attn.o_proj.weight"]
            e = mixtral_experts(sd, p, cfg["num_local_experts"])
            t[f"blk.{i}.ffn_gate_inp.weight"] = e["router"]
            t[f"blk.{i}.ffn_gate_exps.weight"] = e["gate"]
            t[f"blk.{i}.ffn_up_exps.weight"] = e["up"]
            t[f"blk.{i}.ffn_down_exps.weight"] = e["down"]
    for k, v in t.items():
        w.add_tensor(k, np.ascontiguousarray(v.astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mixtral_experts(sd, p, n):
    """Router and stacked experts (E, rows, cols) from either checkpoint layout: per-expert
    block_sparse_moe.experts.N.w1/w3/w2 (gate/up/down), or fused mlp.experts tensors."""
    import numpy as np
    if p + "block_sparse_moe.gate.weight" in sd:
        q = p + "block_sparse_moe."
        return {"router": sd[q + "gate.weight"],
                "gate": np.stack([sd[f"{q}experts.{x}.w1.weight"] for x in range(n)]),
                "up": np.stack([sd[f"{q}experts.{x}.w3.weight"] for x in range(n)]),
                "down": np.stack([sd[f"{q}experts.{x}.w2.weight"] for x in range(n)])}
    q = p + "mlp."
    gu = sd[q + "experts.gate_up_proj"]  # (E, 2F, D): gate rows first
    F = gu.shape[1] // 2
    return {"router": sd[q + "gate.weight"], "gate": gu[:, :F], "up": gu[:, F:],
            "down": sd[q + "experts.down_proj"]}


def build_arch(torch, transformers, name, cls_name, kw, out, seed):
    torch.manual_seed(seed)
    cfg = make_config(transformers, cls_name, kw)
    model = getattr(transformers, cls_name)(cfg).float().eval()
    randomize_arch_extras(torch, model, seed, name.startswith("gemma2"))
    save(model, out)
    reloaded = load(transformers, torch, cls_name, out).eval()
    logits = full_logits(torch, reloaded, ARCH_TOKENS)
    diff = (full_logits(torch, model, ARCH_TOKENS) - logits).abs().max().item()
    assert diff < 1e-5, f"{name}: reloaded model's logits differ by {diff}"
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(ARCH_TOKENS, f)
        f.write("\n")
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))
    prompt = ARCH_TOKENS[:GREEDY_PROMPT]
    greedy = greedy_full(torch, reloaded, prompt, GREEDY_NEW)
    # transformers' own generate() (with its caches) must agree with the full recomputation
    with torch.no_grad():
        gen = reloaded.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_NEW, do_sample=False,
                                min_new_tokens=GREEDY_NEW)[0, len(prompt):].tolist()
    if gen != greedy:  # reported, not fatal: min_new_tokens masks eos, which argmax may pick
        print(f"{name}: NOTE generate() {gen} != full recomputation {greedy}", flush=True)
    with open(os.path.join(out, "greedy.json"), "w") as f:
        json.dump([{"prompt": prompt, "output": greedy}], f)  # test_model_greedy.c's format
        f.write("\n")
    sd = saved_tensors(out)
    keys = sorted(sd)
    print(f"{name}: saved tensors: " + ", ".join(f"{k}{list(sd[k].shape)}" for k in keys), flush=True)
    with open(os.path.join(out, "config.json")) as f:
        saved_cfg = json.load(f)
    try:
        write_gguf(name, sd, saved_cfg, out + ".gguf")  # beside the directory: NAME.gguf
        print(f"{name}: wrote {out}.gguf ({os.path.getsize(out + '.gguf')} bytes)", flush=True)
    except ImportError as e:
        print(f"{name}: no GGUF ({e}); put llama.cpp's gguf-py on PYTHONPATH", flush=True)
    if name.startswith("mixtral"):
        mixtral_router_gaps(out)
    std = logits.std().item()
    assert std > 0.1, f"{name}: logits std {std} too small to test anything"
    files = sorted(os.listdir(out))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in files)
    print(f"{name}: {cls_name}, files {files}, {size} bytes, logits std {std:.3f}, greedy {greedy}",
          flush=True)
    return size


def mixtral_router_gaps(out):
    """router_gaps.json for a Mixtral fixture: per layer and position, the gap between the k-th
    and (k+1)-th largest router logits of transformers' routing, from an independent float64
    numpy forward pass over the saved weights (checked against logits.bin). A gap below what bf16
    activations move (~0.05 here) may pick another expert on a bf16 backend, and a token routed
    differently gets other outputs: tests compare such positions separately."""
    import numpy as np
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(out, "tokens.json")) as f:
        toks = json.load(f)
    sd = {k: v.astype(np.float64) for k, v in saved_tensors(out).items()}
    D, H, KV, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    hd, E, K, eps = D // H, cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["rms_norm_eps"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    T = len(toks)
    inv = 1.0 / (theta ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]
    x, gaps = sd["model.embed_tokens.weight"][toks], []
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = rope((h @ sd[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd))
        k = np.repeat(rope((h @ sd[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd)), H // KV, 1)
        v = np.repeat((h @ sd[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd), H // KV, 1)
        sc = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + np.triu(np.full((T, T), -1e30), 1)[None]
        a = np.exp(sc - sc.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(T, D) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        r = h @ mixtral_experts(sd, p, E)["router"].T
        srt = -np.sort(-r, -1)
        gaps.append([round(float(g), 6) for g in srt[:, K - 1] - srt[:, K]])
        pr = np.exp(r - r.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        ex = mixtral_experts(sd, p, E)
        moe = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-pr[t], kind="stable")[:K]
            for e, w in zip(top, pr[t, top] / pr[t, top].sum()):
                g, u = ex["gate"][e] @ h[t], ex["up"][e] @ h[t]
                moe[t] += w * (ex["down"][e] @ (g / (1 + np.exp(-g)) * u))
        x = x + moe
    logits = rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T
    want = np.fromfile(os.path.join(out, "logits.bin"), dtype="<f4").reshape(T, -1)
    err = float(np.linalg.norm(logits - want) / np.linalg.norm(want))
    assert err < 1e-5, f"numpy Mixtral reference differs from logits.bin: rel L2 {err}"
    with open(os.path.join(out, "router_gaps.json"), "w") as f:
        json.dump({"note": "per layer, per position: k-th minus (k+1)-th largest router logit",
                   "numpy_vs_transformers_rel_l2": float(f"{err:.3g}"), "gaps": gaps}, f)
        f.write("\n")
    print(f"{os.path.basename(out)}: router_gaps.json (numpy reference rel L2 {err:.3g}; smallest gaps "
          f"{sorted((g, l, t) for l, row in enumerate(gaps) for t, g in enumerate(row))[:3]})", flush=True)


def rewrite_ggufs(out_dir):
    """Only the GGUF conversions, from fixtures already saved in OUT_DIR (needs numpy,
    safetensors and gguf-py, not torch): python3 tools/make_fixtures.py --out DIR --gguf-only"""
    for name in arch_specs():
        out = os.path.join(out_dir, name)
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        write_gguf(name, saved_tensors(out), cfg, out + ".gguf")
        print(f"{name}: wrote {out}.gguf ({os.path.getsize(out + '.gguf')} bytes)", flush=True)
        if name.startswith("mixtral"):
            mixtral_router_gaps(out)


def build_archops_fixtures(torch, transformers, args, failed):
    """Builds the arch_specs() fixtures; yields (name, size)."""
    for i, (name, (cls_name, kw)) in enumerate(arch_specs().items()):
        if args.only and name not in args.only:
            continue
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(out):
            os.remove(os.path.join(out, f))
        try:
            yield name, build_arch(torch, transformers, name, cls_name, kw, out, seed=4321 + i)
        except Exception:
            traceback.print_exc()
            failed.append(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--gguf-only", action="store_true",
                    help="only rewrite the Gemma 2 / Mixtral GGUFs from the saved fixtures")
    args = ap.parse_args()
    if args.gguf_only:
        rewrite_ggufs(args.out)
        return 0
    import torch
    import transformers
    import safetensors

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    versions = (f"python {platform.python_version()}, torch {torch.__version__}, transformers "
                f"{transformers.__version__}, safetensors {safetensors.__version__}")
    print(versions, flush=True)
    log = [versions]
    os.makedirs(args.out, exist_ok=True)
    total = 0
    failed = []
    for i, (name, (cls_name, kw, extra)) in enumerate(specs().items()):
        if args.only and name not in args.only:
            continue
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(out):
            os.remove(os.path.join(out, f))
        try:
            size = build(torch, transformers, name, cls_name, kw, extra, out, seed=1234 + i)
        except Exception:  # report and go on: one run should yield every fixture it can
            traceback.print_exc()
            failed.append(name)
            continue
        total += size
        log.append(f"{name}: {size} bytes")
    for name, size in build_archops_fixtures(torch, transformers, args, failed):
        total += size
        log.append(f"{name}: {size} bytes")
    log.append(f"total {total} bytes")
    print(f"total {total} bytes", flush=True)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(README.format(versions=versions, log="\n".join(log)))
    if failed:
        print("FAILED: " + " ".join(failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
