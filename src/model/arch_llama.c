/* arch_llama.c - Llama and the models that are Llama with other defaults: Mistral (sliding
 * window), Qwen2 (q/k/v biases, sliding window on the layers from max_window_layers). */
#include "model/arch.h"
#include "model/blocks.h"

/* The Llama layer; Qwen2 adds the biases (present when config.qkv_bias). */
static const struct arch_tensor llama_tensors[] = {
    ARCH_T(attn_norm, "input_layernorm.weight", "attn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(wq, "self_attn.q_proj.weight", "attn_q.weight", AD_Q, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wk, "self_attn.k_proj.weight", "attn_k.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wv, "self_attn.v_proj.weight", "attn_v.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wo, "self_attn.o_proj.weight", "attn_output.weight", AD_MODEL, AD_Q, AN_ALWAYS, 1),
    ARCH_T(bq, "self_attn.q_proj.bias", "attn_q.bias", AD_ONE, AD_Q, AN_QKV_BIAS, 0),
    ARCH_T(bk, "self_attn.k_proj.bias", "attn_k.bias", AD_ONE, AD_KV, AN_QKV_BIAS, 0),
    ARCH_T(bv, "self_attn.v_proj.bias", "attn_v.bias", AD_ONE, AD_KV, AN_QKV_BIAS, 0),
    ARCH_T(ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(w_gate, "mlp.gate_proj.weight", "ffn_gate.weight", AD_FFN, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_up, "mlp.up_proj.weight", "ffn_up.weight", AD_FFN, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_down, "mlp.down_proj.weight", "ffn_down.weight", AD_MODEL, AD_FFN, AN_ALWAYS, 1),
};
#define N_LLAMA_TENSORS ((int)(sizeof llama_tensors / sizeof llama_tensors[0]))

/* Mistral v0.1 attends within sliding_window (4096) on every layer; v0.2+ set it to null. */
static int mistral_hf(struct model_config *c, const cJSON *root, const char *name) {
  return cfg_sliding_window(c, root, NULL, name);
}

/* Qwen2: biases on q/k/v; sliding_window only when use_sliding_window, on the layers from
 * max_window_layers on (transformers' Qwen2Config.layer_types). */
static int qwen2_hf(struct model_config *c, const cJSON *root, const char *name) {
  c->qkv_bias = 1;
  int use = 0;
  if (cfg_json_bool(root, "use_sliding_window", &use, name))
    return -1;
  if (!use)
    return 0;
  c->swa_first_layer = 0;
  if (cfg_sliding_window(c, root, NULL, name) ||
      cfg_json_int(root, "max_window_layers", &c->swa_first_layer, 0, name))
    return -1;
  return 0;
}

static int qwen2_gguf(struct model_config *c, const struct gguf_file *g, const char *name) {
  (void)g;
  (void)name;
  c->qkv_bias = 1;
  return 0;
}

/* llama.cpp's converter writes no window for Mistral v0.1 (llama.cpp runs it without one); a file
 * that carries llama.attention.sliding_window gets it on every layer, as the HF config would. */
static int llama_gguf(struct model_config *c, const struct gguf_file *g, const char *name) {
  return cfg_gguf_int(g, "llama", "attention.sliding_window", &c->sliding_window, 0, name);
}

static const char *const llama_classes[] = {"LlamaForCausalLM", NULL};
static const char *const mistral_classes[] = {"MistralForCausalLM", NULL};
static const char *const qwen2_classes[] = {"Qwen2ForCausalLM", NULL};

/* GGUF "llama" (llama.cpp's converter permutes Q/K so RoPE rotates adjacent pairs) covers Llama
 * and Mistral (see llama_gguf for the window). */
const struct arch arch_llama = {.name = "llama",
                                .hf_classes = llama_classes,
                                .gguf_name = "llama",
                                .default_ctx = 2048,
                                .rope_neox_gguf = 0,
                                .gguf_config = llama_gguf,
                                .tensors = llama_tensors,
                                .num_tensors = N_LLAMA_TENSORS,
                                .forward = blocks_prenorm_forward};
const struct arch arch_mistral = {.name = "mistral",
                                  .hf_classes = mistral_classes,
                                  .default_ctx = 4096 * 32,
                                  .hf_config = mistral_hf,
                                  .tensors = llama_tensors,
                                  .num_tensors = N_LLAMA_TENSORS,
                                  .forward = blocks_prenorm_forward};
const struct arch arch_qwen2 = {.name = "qwen2",
                                .hf_classes = qwen2_classes,
                                .gguf_name = "qwen2",
                                .default_ctx = 32768,
                                .rope_neox_gguf = 1,
                                .hf_config = qwen2_hf,
                                .gguf_config = qwen2_gguf,
                                .tensors = llama_tensors,
                                .num_tensors = N_LLAMA_TENSORS,
                                .forward = blocks_prenorm_forward};
