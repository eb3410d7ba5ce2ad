/* arch_phi3.c - Phi-3 / Phi-3.5 (Phi3ForCausalLM, GGUF phi3): Llama's layer with q/k/v in one
 * fused qkv_proj and gate/up in one gate_up_proj (each one matmul, split by views; see
 * blocks.h), LongRoPE (config.c reads rope_scaling longrope/su; the short/long rule is in
 * docs/model-formats.md), partial_rotary_factor, and sliding_window on every layer.
 * Tensor parallelism: each rank keeps its rows of every part of the fused tensors (its q heads,
 * its KV heads of k and of v; its ffn rows of gate and of up: model.c's shard_ranges, the same for
 * HF and GGUF, whose parts are in the same order), so its fused output is q | k | v (gate | up)
 * of its share and the split above applies unchanged; RoPE is per head, also unchanged. */
#include <math.h>
#include <string.h>

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

/* GGUF phi3 (llama.cpp's converter): phi3.rope.scaling.original_context_length,
 * phi3.rope.scaling.attn_factor and the factors as the tensors rope_factors_short.weight /
 * rope_factors_long.weight (F32, rope_dim / 2 each; both or neither), phi3.attention.sliding_window
 * (0: none). Longrope is on when the factor tensors are present. */
static int phi3_factors(const struct gguf_file *g, const char *tname, float *out, int n,
                        const char *name) {
  const struct gguf_tensor *t = gguf_find_tensor(g, tname);
  if (!t)
    return ERR("%s: tensor '%s' is missing (longrope needs both factor lists)", name, tname);
  if (t->dtype != DTYPE_F32 || t->num_dims != 1 || t->ne[0] != n)
    return ERR("%s: tensor '%s' must be %d F32 values (rotated dims / 2)", name, tname, n);
  memcpy(out, t->data, sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++)
    if (!(out[i] > 0) || !isfinite(out[i]))
      return ERR("%s: tensor '%s'[%d] = %g is not a positive factor", name, tname, i, (double)out[i]);
  return 0;
}

static int phi3_gguf(struct model_config *c, const struct gguf_file *g, const char *name) {
  if (cfg_gguf_int(g, "phi3", "attention.sliding_window", &c->sliding_window, 0, name))
    return -1;
  if (c->sliding_window >= c->max_seq_len)
    c->sliding_window = 0; /* covers the whole context */
  int has_long = gguf_find_tensor(g, "rope_factors_long.weight") != NULL;
  int has_short = gguf_find_tensor(g, "rope_factors_short.weight") != NULL;
  if (!has_long && !has_short)
    return 0;
  int half = c->rope_dim / 2;
  if (half > ROPE_MAX_FACTORS)
    return ERR("%s: longrope with %d rotated dims (at most %d)", name, c->rope_dim, 2 * ROPE_MAX_FACTORS);
  c->rope_scaling = ROPE_SCALING_LONGROPE;
  c->rope_attn_factor = 1.0f;
  if (phi3_factors(g, "rope_factors_short.weight", c->rope_short_factor, half, name) ||
      phi3_factors(g, "rope_factors_long.weight", c->rope_long_factor, half, name) ||
      cfg_gguf_int(g, "phi3", "rope.scaling.original_context_length", &c->rope_orig_max_pos, 1, name) ||
      cfg_gguf_float(g, "phi3", "rope.scaling.attn_factor", &c->rope_attn_factor, 0, name))
    return -1;
  if (c->rope_orig_max_pos <= 0 || !(c->rope_attn_factor > 0))
    return ERR("%s: phi3.rope.scaling.original_context_length %d / attn_factor %g must be positive",
               name, c->rope_orig_max_pos, (double)c->rope_attn_factor);
  return 0;
}

static const char *const phi3_classes[] = {"Phi3ForCausalLM", NULL};

const struct arch arch_phi3 = {.name = "phi3",
                               .hf_classes = phi3_classes,
                               .gguf_name = "phi3",
                               .default_ctx = 4096,
                               .rope_neox_gguf = 1,
                               .gguf_partial_rope = 1,
                               .hf_config = phi3_hf,
                               .gguf_config = phi3_gguf,
                               .tensors = phi3_tensors,
                               .num_tensors = (int)(sizeof phi3_tensors / sizeof phi3_tensors[0]),
                               .forward = blocks_prenorm_forward};
