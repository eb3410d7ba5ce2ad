/* arch_qwen3.c - Qwen3 (dense): Llama's layer without biases, plus RMSNorm over each head of q
 * and k (q_norm, k_norm, weights of head_dim) between the projections and RoPE. The norms' weights
 * are shared by all heads, so under tensor parallelism every rank keeps them whole and applies
 * them to the heads it holds. */
#include "model/arch.h"
#include "model/blocks.h"

static const struct arch_tensor qwen3_tensors[] = {
    ARCH_T(attn_norm, "input_layernorm.weight", "attn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(wq, "self_attn.q_proj.weight", "attn_q.weight", AD_Q, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wk, "self_attn.k_proj.weight", "attn_k.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wv, "self_attn.v_proj.weight", "attn_v.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(q_norm, "self_attn.q_norm.weight", "attn_q_norm.weight", AD_ONE, AD_HEAD, AN_ALWAYS, 0),
    ARCH_T(k_norm, "self_attn.k_norm.weight", "attn_k_norm.weight", AD_ONE, AD_HEAD, AN_ALWAYS, 0),
    ARCH_T(wo, "self_attn.o_proj.weight", "attn_output.weight", AD_MODEL, AD_Q, AN_ALWAYS, 1),
    ARCH_T(ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(w_gate, "mlp.gate_proj.weight", "ffn_gate.weight", AD_FFN, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_up, "mlp.up_proj.weight", "ffn_up.weight", AD_FFN, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_down, "mlp.down_proj.weight", "ffn_down.weight", AD_MODEL, AD_FFN, AN_ALWAYS, 1),
};

/* Like Qwen2, the window applies only with use_sliding_window, from max_window_layers on. */
static int qwen3_hf(struct model_config *c, const cJSON *root, const char *name) {
  int use = 0;
  if (cfg_json_bool(root, "use_sliding_window", &use, name))
    return -1;
  if (!use)
    return 0;
  if (cfg_sliding_window(c, root, NULL, name) ||
      cfg_json_int(root, "max_window_layers", &c->swa_first_layer, 0, name))
    return -1;
  return 0;
}

static const char *const qwen3_classes[] = {"Qwen3ForCausalLM", NULL};

const struct arch arch_qwen3 = {.name = "qwen3",
                                .hf_classes = qwen3_classes,
                                .gguf_name = "qwen3",
                                .default_ctx = 40960,
                                .rope_neox_gguf = 1,
                                .hf_config = qwen3_hf,
                                .tensors = qwen3_tensors,
                                .num_tensors = (int)(sizeof qwen3_tensors / sizeof qwen3_tensors[0]),
                                .forward = blocks_prenorm_forward};
