"""tool_model.py - writes a tiny Llama (HF directory: config.json, model.safetensors, tokenizer
files) whose greedy output is a fixed Hermes tool call, for the end-to-end tool-call test.

How it works: hidden size = vocabulary size; embeddings are one-hot; every attention and MLP
weight is zero, so the residual stream stays the current token's one-hot and the final RMSNorm
scales it; lm_head row NEXT(t) has a 1 in column t, so the next token is NEXT(t): a bigram
chain. The tokenizer is byte-level BPE (ids 0-255 the bytes) plus added tokens "<tool_call>",
the whole call JSON, "</tool_call>" and the chat specials, so the chain
  any byte -> <tool_call> -> {"name": "get_weather", ...} -> </tool_call> -> <|im_end|> (EOS)
makes the model answer every prompt ending in a byte (Qwen's generation prompt ends in "\\n")
with exactly one tool call. The weights are real; only the network is trivially small."""
import json
import os
import struct

CALL_JSON = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
V = 288  # vocabulary = hidden size; 4 heads of 72


def byte_symbols():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    IM_START, IM_END, TC, CALL, TC_END = 256, 257, 258, 259, 260
    syms = byte_symbols()
    vocab = {s: i for i, s in enumerate(syms)}
    for i in range(261, V):
        vocab[f"<filler_{i}>"] = i
    added = [
        {"id": IM_START, "content": "<|im_start|>", "special": True},
        {"id": IM_END, "content": "<|im_end|>", "special": True},
        {"id": TC, "content": "<tool_call>", "special": False},
        {"id": CALL, "content": CALL_JSON, "special": False},
        {"id": TC_END, "content": "</tool_call>", "special": False},
    ]
    for a in added:
        a.update({"single_word": False, "lstrip": False, "rstrip": False, "normalized": False})
        vocab[a["content"]] = a["id"]
    tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": True, "vocab": vocab, "merges": []}}
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": IM_END}, f)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": V, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 4, "head_dim": V // 4, "vocab_size": V, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
           "mlp_bias": False, "eos_token_id": IM_END, "torch_dtype": "float32"}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)

    def nxt(t):
        return {TC: CALL, CALL: TC_END, TC_END: IM_END, IM_END: IM_END}.get(t, TC if t <= IM_START else IM_END)

    def mat(rows, cols, fn=None):
        m = [0.0] * (rows * cols)
        if fn:
            fn(m)
        return m

    def eye(m):
        for i in range(V):
            m[i * V + i] = 1.0

    def head(m):
        for t in range(V):
            m[nxt(t) * V + t] = 1.0

    tensors = {"model.embed_tokens.weight": ((V, V), mat(V, V, eye)),
               "lm_head.weight": ((V, V), mat(V, V, head)),
               "model.norm.weight": ((V,), [1.0] * V),
               "model.layers.0.input_layernorm.weight": ((V,), [1.0] * V),
               "model.layers.0.post_attention_layernorm.weight": ((V,), [1.0] * V)}
    for name, shape in (("self_attn.q_proj", (V, V)), ("self_attn.k_proj", (V, V)), ("self_attn.v_proj", (V, V)),
                        ("self_attn.o_proj", (V, V)), ("mlp.gate_proj", (32, V)), ("mlp.up_proj", (32, V)),
                        ("mlp.down_proj", (V, 32))):
        tensors[f"model.layers.0.{name}.weight"] = (shape, [0.0] * (shape[0] * shape[1]))
    header, blobs, off = {}, [], 0
    for name, (shape, data) in tensors.items():
        b = struct.pack(f"<{len(data)}f", *data)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return out_dir


if __name__ == "__main__":
    import sys
    write(sys.argv[1])
