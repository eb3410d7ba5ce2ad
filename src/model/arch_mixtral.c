/* arch_mixtral.c - Mixtral (MixtralForCausalLM; GGUF "llama" with llama.expert_count > 0).
 *
 * The Llama decoder with the MLP replaced by a sparse mixture of experts (model/moe_block.h):
 * router (block_sparse_moe.gate / ffn_gate_inp), top-k of the softmax renormalised over the
 * chosen experts, the chosen experts' SiLU-gated MLPs (w1 = gate, w3 = up, w2 = down), their
 * outputs summed with the routing weights (transformers' MixtralSparseMoeBlock).
 *
 * Experts are held stacked, one weight per kind and layer: (n_experts * ffn, dim) for gate and
 * up, (n_experts * dim, ffn) for down, as GGUF's ffn_{gate,up,down}_exps store them; expert e's
 * matrix is a view of rows [e * rows, (e + 1) * rows). HF checkpoints store one tensor per
 * expert: model_file copies them into the stacked layout at load.
 *
 * The block reads the number of tokens routed to each expert back to the host once per layer
 * (to size one GEMM per expert), so a Mixtral step cannot be captured in a CUDA graph.
 *
 * Tensor parallelism: attention as Llama's; every expert's w1 / w3 keep the rank's ffn rows
 * (column-parallel) and w2 its ffn columns (row-parallel), the router is replicated, so every rank
 * routes every token the same way and its experts' combined output is a partial sum over its ffn
 * columns: one all-reduce after the MoE block (moe_combine is linear in the experts' outputs). */
#include <math.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "model/moe_block.h"
#include "util/dtype.h"
#include "util/log.h"

static const struct arch_tensor mixtral_tensors[] = {
    ARCH_T(attn_norm, "input_layernorm.weight", "attn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(wq, "self_attn.q_proj.weight", "attn_q.weight", AD_Q, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wk, "self_attn.k_proj.weight", "attn_k.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wv, "self_attn.v_proj.weight", "attn_v.weight", AD_KV, AD_MODEL, AN_ALWAYS, 1),
    ARCH_T(wo, "self_attn.o_proj.weight", "attn_output.weight", AD_MODEL, AD_Q, AN_ALWAYS, 1),
    ARCH_T(ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", AD_ONE, AD_MODEL, AN_ALWAYS, 0),
    ARCH_T(moe_router, "block_sparse_moe.gate.weight", "ffn_gate_inp.weight", AD_EXPERTS, AD_MODEL,
           AN_ALWAYS, 0),
    /* AN_EXPERTS: the HF name is a format with the expert's index; GGUF's is one 3-D tensor */
    ARCH_T(exps_gate, "block_sparse_moe.experts.%d.w1.weight", "ffn_gate_exps.weight", AD_EXP_FFN, AD_MODEL,
           AN_EXPERTS, 1),
    ARCH_T(exps_up, "block_sparse_moe.experts.%d.w3.weight", "ffn_up_exps.weight", AD_EXP_FFN, AD_MODEL,
           AN_EXPERTS, 1),
    ARCH_T(exps_down, "block_sparse_moe.experts.%d.w2.weight", "ffn_down_exps.weight", AD_EXP_MODEL, AD_FFN,
           AN_EXPERTS, 1),
};
#define N_MIXTRAL_TENSORS ((int)(sizeof mixtral_tensors / sizeof mixtral_tensors[0]))

static int check_experts(const struct model_config *c, const char *name) {
  if (c->n_experts < 1 || c->n_experts > MOE_MAX_EXPERTS)
    return ERR("%s: %d experts (1 to %d are supported)", name, c->n_experts, MOE_MAX_EXPERTS);
  if (c->n_experts_used < 1 || c->n_experts_used > c->n_experts || c->n_experts_used > MOE_MAX_TOP_K)
    return ERR("%s: %d experts per token of %d (1 to min(experts, %d) are supported)", name,
               c->n_experts_used, c->n_experts, MOE_MAX_TOP_K);
  return 0;
}

static int mixtral_hf(struct model_config *c, const cJSON *root, const char *name) {
  float jitter = 0;
  if (cfg_json_int(root, "num_local_experts", &c->n_experts, 1, name) ||
      cfg_json_int(root, "num_experts_per_tok", &c->n_experts_used, 1, name) ||
      cfg_json_float(root, "router_jitter_noise", &jitter, 0, name) ||
      cfg_sliding_window(c, root, NULL, name))
    return -1;
  (void)jitter; /* training-time noise only: inference routes without it */
  return check_experts(c, name);
}

static int mixtral_gguf(struct model_config *c, const struct gguf_file *g, const char *name) {
  if (cfg_gguf_int(g, "llama", "expert_count", &c->n_experts, 1, name) ||
      cfg_gguf_int(g, "llama", "expert_used_count", &c->n_experts_used, 1, name))
    return -1;
  return check_experts(c, name);
}

/* Expert E's matrix in a stacked weight of N experts. */
static struct weight expert_view(const struct weight *stacked, int n, int e) {
  struct weight w = *stacked;
  w.rows = stacked->rows / n;
  w.data = (char *)stacked->data + dtype_row_bytes(stacked->dtype, stacked->cols) * (size_t)w.rows * e;
  return w;
}

static int mixtral_moe(const struct fwd *f, int l, const struct moe_scratch *s) {
  const struct model_config *c = f->c;
  const struct layer_weights *L = &f->layers[l];
  int E = c->n_experts;
  struct weight g[MOE_MAX_EXPERTS], u[MOE_MAX_EXPERTS], d[MOE_MAX_EXPERTS];
  for (int e = 0; e < E; e++) {
    g[e] = expert_view(&L->exps_gate, E, e);
    u[e] = expert_view(&L->exps_up, E, e);
    d[e] = expert_view(&L->exps_down, E, e);
  }
  struct moe_weights mw = {E, c->n_experts_used, L->moe_router, g, u, d};
  TRY(moe_ffn(f->be, f->xb2, f->xb, &mw, s, f->T));
  if (f->tp_world > 1) /* each rank's experts hold its ffn columns: partial sums, one all-reduce */
    TRY(f->be->ops->all_reduce_sum(f->be, f->xb2, (size_t)f->T * c->dim));
  return 0;
}

static int mixtral_forward(const struct fwd *f) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  const int T = f->T, dim = c->dim;
  int32_t start_host[MOE_MAX_EXPERTS + 1];
  struct moe_scratch s;
  moe_scratch_carve(be, &s, f->arch_ws, f->max_tokens, c->n_experts, c->n_experts_used, dim, c->ffn_dim,
                    start_host);
  TRY(op->embed(be, f->x, f->tok_embd, f->b->input_ids, T));
  TRY(op->rmsnorm(be, f->xb, NULL, f->x, &f->layers[0].attn_norm, T, dim, c->rms_eps));
  for (int l = 0; l < c->n_layers; l++) {
    const struct attn_params ap = {.n_heads = c->n_heads,
                                   .scale = 1.0f / sqrtf((float)c->head_dim),
                                   .window = block_layer_window(c, l)};
    TRY(block_attention(f, l, &ap, NULL));
    TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, &f->layers[l].ffn_norm, T, dim, c->rms_eps));
    TRY(mixtral_moe(f, l, &s));
    const struct weight *next = l + 1 < c->n_layers ? &f->layers[l + 1].attn_norm : f->out_norm;
    TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, next, T, dim, c->rms_eps));
  }
  return 0;
}

static const char *const mixtral_classes[] = {"MixtralForCausalLM", NULL};

/* GGUF: the "llama" row hands files with llama.expert_count > 0 to this one (config.c). */
const struct arch arch_mixtral = {.name = "mixtral",
                                  .hf_classes = mixtral_classes,
                                  .gguf_name = NULL,
                                  .default_ctx = 32768,
                                  .rope_neox_gguf = 0,
                                  .hf_config = mixtral_hf,
                                  .gguf_config = mixtral_gguf,
                                  .tensors = mixtral_tensors,
                                  .num_tensors = N_MIXTRAL_TENSORS,
                                  .forward = mixtral_forward};
