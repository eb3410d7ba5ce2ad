/* arch_gemma2.c - Gemma 2 (Gemma2ForCausalLM, GGUF gemma2).
 *
 * Differences from the Llama decoder (transformers' modeling_gemma2.py):
 * - embeddings scaled by sqrt(hidden_size) (on CUDA the factor is rounded to bf16 first, as HF
 *   multiplies by a normalizer tensor of the activations' dtype);
 * - RMSNorm scales by (1 + w): the HF weights get 1 added once at load (gemma2_fixup); llama.cpp's
 *   converter already stores 1 + w in GGUF, so GGUF weights are used as they are;
 * - four norms per layer: x += post_attn_norm(attn(attn_norm(x))); x += post_ffw_norm(mlp(
 *   ffn_norm(x))) (ffn_norm is HF's pre_feedforward_layernorm);
 * - GeGLU MLP with the tanh GELU (hidden_activation gelu_pytorch_tanh);
 * - attention scores scaled by query_pre_attn_scalar^-0.5 and softcapped (attn_logit_softcapping);
 *   even layers (0, 2, ...) attend inside sliding_window, odd layers globally (config.local_window;
 *   config.sliding_window stays 0 so that no KV block the global layers read is released);
 * - the logits softcapped by final_logit_softcapping (model.c, from config.final_softcap);
 * - tied embeddings.
 * Tensor parallelism splits it as Llama (heads, ffn columns); attention and the MLP all-reduce
 * their outputs before post_attn_norm / post_ffw_norm, which like every other norm work on the
 * whole hidden state. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "util/log.h"

static const struct arch_tensor gemma2_tensors[] = {
    ARCH_T(attn_norm, "input_layernorm.weight", "attn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(wq, "self_attn.q_proj.weight", "attn_q.weight", AD_Q, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wk, "self_attn.k_proj.weight", "attn_k.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wv, "self_attn.v_proj.weight", "attn_v.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wo, "self_attn.o_proj.weight", "attn_output.weight", AD_MODEL, AD_Q, AN_ALWAYS, 1),
    ARCH_T(post_attn_norm, "post_attention_layernorm.weight", "post_attention_norm.weight", AD_ONE, AD_MODEL,
           AN_ALWAYS, 0),
    ARCH_T(ffn_norm, "pre_feedforward_layernorm.weight", "ffn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(post_ffw_norm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight", AD_ONE, AD_MODEL,
           AN_ALWAYS, 0),
    ARCH_T(w_gate, "mlp.gate_proj.weight", "ffn_gate.weight", AD_FFN, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_up, "mlp.up_proj.weight", "ffn_up.weight", AD_FFN, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(w_down, "mlp.down_proj.weight", "ffn_down.weight", AD_MODEL, AD_FFN, AN_ALWAYS, 1),
};
#define N_GEMMA2_TENSORS ((int)(sizeof gemma2_tensors / sizeof gemma2_tensors[0]))

/* A softcap value: a number, or null / absent (off). */
static int softcap_key(const cJSON *root, const char *key, float *out, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  *out = 0.0f;
  if (!v || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0))
    return ERR("%s: %s must be a non-negative number or null", name, key);
  *out = (float)v->valuedouble;
  return 0;
}

static int gemma2_hf(struct model_config *c, const cJSON *root, const char *name) {
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_activation");
  if (!act)
    act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "gelu_pytorch_tanh")))
    return ERR("%s: hidden_activation must be \"gelu_pytorch_tanh\" for Gemma 2", name);
  c->query_pre_attn_scalar = (float)c->head_dim;
  if (cfg_json_float(root, "query_pre_attn_scalar", &c->query_pre_attn_scalar, 0, name) ||
      softcap_key(root, "attn_logit_softcapping", &c->attn_softcap, name) ||
      softcap_key(root, "final_logit_softcapping", &c->final_softcap, name) ||
      cfg_sliding_window(c, root, NULL, name))
    return -1;
  if (!(c->query_pre_attn_scalar > 0))
    return ERR("%s: query_pre_attn_scalar must be positive", name);
  /* layer_types (transformers 5), when present, must be the alternation Gemma 2 has */
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
  if (lt && !cJSON_IsNull(lt)) {
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
      return ERR("%s: layer_types must list %d layer types", name, c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
      const cJSON *t = cJSON_GetArrayItem(lt, l);
      const char *want = l % 2 == 0 ? "sliding_attention" : "full_attention";
      if (!cJSON_IsString(t) || strcmp(t->valuestring, want))
        return ERR("%s: layer_types[%d] must be \"%s\" (Gemma 2 alternates local and global layers)",
                   name, l, want);
    }
  }
  c->local_window = c->sliding_window; /* on the even layers only (see model.h) */
  c->sliding_window = 0;
  c->norm_plus_one = 1; /* HF stores w; the forward needs 1 + w */
  return 0;
}

static int gemma2_gguf(struct model_config *c, const struct gguf_file *g, const char *name) {
  /* llama.cpp's rule when the file lacks pagoda's query_pre_attn_scalar key: 27B (46 layers)
   * scales by hidden/heads, the others by head_dim */
  int qpas = 0;
  c->query_pre_attn_scalar = c->n_layers == 46 ? (float)c->dim / c->n_heads : (float)c->head_dim;
  if (cfg_gguf_int(g, "gemma2", "attention.query_pre_attn_scalar", &qpas, 0, name) ||
      cfg_gguf_float(g, "gemma2", "attn_logit_softcapping", &c->attn_softcap, 0, name) ||
      cfg_gguf_float(g, "gemma2", "final_logit_softcapping", &c->final_softcap, 0, name) ||
      cfg_gguf_int(g, "gemma2", "attention.sliding_window", &c->local_window, 0, name))
    return -1;
  if (qpas > 0)
    c->query_pre_attn_scalar = (float)qpas;
  c->norm_plus_one = 0; /* the converter stored 1 + w */
  return 0;
}

/* MLP of layer L: f->xb -> f->xb2 = down(gelu_tanh(gate(x)) * up(x)). */
static int gemma2_mlp(const struct fwd *f, int l) {
  struct backend *be = f->be;
  const struct layer_weights *L = &f->layers[l];
  const int T = f->T, F = f->c->ffn_dim;
  TRY(be->ops->matmul(be, f->gate, f->xb, &L->w_gate, NULL, T, 0));
  TRY(be->ops->matmul(be, f->up, f->xb, &L->w_up, NULL, T, 0));
  TRY(be->ops->gelu_tanh_mul(be, f->gate, f->gate, f->up, T, F));
  TRY(be->ops->matmul(be, f->xb2, f->gate, &L->w_down, NULL, T, 0));
  if (f->tp_world > 1) /* row-parallel down_proj; post_ffw_norm then sees the whole sum */
    TRY(be->ops->all_reduce_sum(be, f->xb2, (size_t)T * f->c->dim));
  return 0;
}

static int gemma2_forward(const struct fwd *f) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  const int T = f->T, dim = c->dim;
  const float eps = c->rms_eps;
  TRY(op->embed(be, f->x, f->tok_embd, f->b->input_ids, T));
  TRY(op->scale(be, f->x, (size_t)T * dim, (float)sqrt((double)dim)));
  for (int l = 0; l < c->n_layers; l++) {
    const struct layer_weights *L = &f->layers[l];
    /* x += (previous layer's post-MLP output); xb = attn_norm(x) */
    if (l == 0)
      TRY(op->rmsnorm(be, f->xb, NULL, f->x, &L->attn_norm, T, dim, eps));
    else
      TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, &L->attn_norm, T, dim, eps));
    const struct attn_params ap = {.n_heads = c->n_heads,
                                   .scale = 1.0f / sqrtf(c->query_pre_attn_scalar),
                                   .softcap = c->attn_softcap,
                                   .window = block_layer_window(c, l)};
    TRY(block_attention(f, l, &ap, NULL));
    TRY(op->rmsnorm(be, f->xb2, NULL, f->xb2, &L->post_attn_norm, T, dim, eps)); /* in place */
    TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, &L->ffn_norm, T, dim, eps));       /* x += ...; xb = norm */
    TRY(gemma2_mlp(f, l));
    TRY(op->rmsnorm(be, f->xb2, NULL, f->xb2, &L->post_ffw_norm, T, dim, eps));
  }
  TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, f->out_norm, T, dim, eps));
  return 0;
}

static const char *const gemma2_classes[] = {"Gemma2ForCausalLM", NULL};

const struct arch arch_gemma2 = {.name = "gemma2",
                                 .hf_classes = gemma2_classes,
                                 .gguf_name = "gemma2",
                                 .default_ctx = 8192,
                                 .rope_neox_gguf = 1,
                                 .hf_config = gemma2_hf,
                                 .gguf_config = gemma2_gguf,
                                 .tensors = gemma2_tensors,
                                 .num_tensors = N_GEMMA2_TENSORS,
                                 .forward = gemma2_forward};
