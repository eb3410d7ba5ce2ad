/* arch_phi3.c - Phi-3 / Phi-3.5 (Phi3ForCausalLM, GGUF phi3): Llama's layer with q/k/v in one
 * fused qkv_proj and gate/up in one gate_up_proj (each one matmul, split by views; see
 * blocks.h), LongRoPE (config.c reads rope_scaling longrope/su; the short/long rule is in
 * docs/model-formats.md), partial_rotary_factor, and sliding_window on every layer. */
#include "model/arch.h"
#include "model/blocks.h"

static const struct arch_tensor phi3_tensors[] = {
    ARCH_T(attn_norm, "input_layernorm.weight", "attn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(wqkv, "self_attn.qkv_proj.weight", "attn_qkv.weight", AD_QKV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wo, "self_attn.o_proj.weight", "attn_output.weight", AD_MODEL, AD_Q, AN_ALWAYS, 1),
    ARCH_T(ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(w_gate_up, "mlp.gate_up_proj.weight", "ffn_up.weight", AD_FFN2, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_down, "mlp.down_proj.weight", "ffn_down.weight", AD_MODEL, AD_FFN, AN_ALWAYS, 1),
};

/* transformers' Phi3 attends within sliding_window on every layer (null: everywhere). */
static int phi3_hf(struct model_config *c, const cJSON *root, const char *name) {
  return cfg_sliding_window(c, root, NULL, name);
}

static const char *const phi3_classes[] = {"Phi3ForCausalLM", NULL};

const struct arch arch_phi3 = {"phi3", phi3_classes, NULL, 4096, 1, phi3_hf, NULL, phi3_tensors,
                               (int)(sizeof phi3_tensors / sizeof phi3_tensors[0]),
                               blocks_prenorm_forward};
