/* arch.h - the table of model architectures: one row per architecture, one file per family.
 *
 * A row names the architecture as HF config.json's "architectures" and GGUF's
 * general.architecture spell it, parses the config fields only it has (after the shared reader in
 * config.c has read the common ones), lists its per-layer tensors under both formats' names, and
 * runs its forward pass from the shared blocks of blocks.c. docs/adding-a-model.md walks through
 * adding one (Qwen3 as the example).
 *
 * Invariants every row keeps:
 * - every tensor in its table is a field of struct layer_tensors (host, model_file.h) and of
 *   struct layer_weights (backend, below) with the same name, reached through the same ARCH_T
 *   entry; tensors absent from the table stay NULL (data == NULL) and blocks skip them;
 * - forward leaves the final-normed hidden states of all T tokens in f->xb; model.c computes the
 *   logits from there (the tail is shared);
 * - everything forward decides for a token must be computable from device data (the staged
 *   batch) so that a captured CUDA graph replays it correctly: no host-side branching on the
 *   batch's contents. */
#ifndef PAGODA_ARCH_H
#define PAGODA_ARCH_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "backend/backend.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/model_file.h"

/* One layer's weights on the backend; fields mirror struct layer_tensors. */
struct layer_weights {
  struct weight attn_norm;
  struct weight wq, wk, wv, wo;
  struct weight bq, bk, bv;
  struct weight ffn_norm;
  struct weight w_gate, w_up, w_down;
  struct weight wqkv;      /* fused (n_heads*hd + 2*n_kv*hd, dim): Phi-3 qkv_proj; wq/wk/wv NULL */
  struct weight w_gate_up; /* fused (2*ffn, dim), gate rows first: Phi-3 gate_up_proj */
  struct weight q_norm, k_norm; /* (1, head_dim) RMSNorm per head before RoPE: Qwen3 */
  struct weight post_attn_norm, post_ffw_norm; /* (1, dim) Gemma 2's norms after attention / MLP */
  struct weight moe_router;     /* (n_experts, dim) Mixtral's router */
  /* Mixtral's experts stacked by rows: gate/up (n_experts * ffn, dim), down (n_experts * dim,
   * ffn); expert e is rows [e * rows / n_experts, (e + 1) * rows / n_experts) */
  struct weight exps_gate, exps_up, exps_down;
};

/* The shape of a tensor dimension, resolved against the config. */
enum arch_dim { AD_ONE, AD_MODEL, AD_Q, AD_KV, AD_FFN, AD_QKV, AD_FFN2, AD_HEAD,
                AD_EXPERTS /* n_experts */, AD_EXP_FFN /* n_experts * ffn */,
                AD_EXP_MODEL /* n_experts * dim */ };

/* When a tensor of the table must be present. */
enum arch_need { AN_ALWAYS, AN_QKV_BIAS /* only when config.qkv_bias */,
                 /* experts stacked by rows: GGUF one 3-D tensor (n_experts, rows, cols); HF one
                  * tensor per expert, the name a format with the expert's index (%d), copied
                  * into the stacked layout at load */
                 AN_EXPERTS };

struct arch_tensor {
  size_t host_off;         /* into struct layer_tensors */
  size_t w_off;            /* into struct layer_weights */
  const char *hf, *gguf;   /* after "model.layers.N." / "blk.N." */
  enum arch_dim rows, cols; /* rows AD_ONE: a vector of cols */
  enum arch_need need;
  int isq;                 /* 1: a projection matrix that --isq quantizes */
};

/* One table entry: FIELD of both layer structs, its names and shape. */
#define ARCH_T(field, hf, gguf, rows, cols, need, isq)                                          \
  {offsetof(struct layer_tensors, field), offsetof(struct layer_weights, field), hf, gguf, rows, \
   cols, need, isq}

/* What an architecture's forward pass works with (built by model_forward for one step). All
 * buffers are backend memory of act_dtype with room for the workspace's max_tokens tokens. */
struct fwd {
  struct backend *be;
  const struct model_config *c;
  const struct layer_weights *layers; /* (n_layers) */
  const struct weight *tok_embd, *out_norm;
  struct kv_layer *kv;                /* (n_layers) */
  const struct batch *b;              /* staged (backend memory) */
  const struct rope_params *rope;
  int T;
  int max_tokens;                     /* the workspace's; sizes split_idx's parts */
  void *x;    /* (T, dim) residual stream */
  void *xb;   /* (T, dim) normed input of each sub-block; on return the final normed states */
  void *xb2;  /* (T, dim) sub-block output */
  void *q, *k, *v, *att; /* (T, n_heads|n_kv_heads, head_dim) */
  void *gate, *up;       /* (T, ffn_dim) */
  void *fused;           /* (T, arch_fused_cols(c)) fused-projection output, or NULL */
  const int32_t *split_idx; /* the fused split's gather indices (see blocks.h), or NULL */
  void *arch_ws;         /* MoE models (config.n_experts > 0): moe_scratch_bytes of scratch for
                            max_tokens tokens (model/moe_block.h); else NULL */
  int tp_world;          /* tensor parallelism: > 1 when c holds one rank's heads and ffn columns;
                            the o_proj and down_proj outputs are then partial sums, all-reduced */
};

/* Rows are written with designated initializers (.name = ...), so that fields added later
 * default to 0 / NULL in every row. */
struct arch {
  const char *name;              /* config.arch: "llama", "mistral", "qwen2", "phi3", "qwen3" */
  const char *const *hf_classes; /* NULL-terminated "architectures" values */
  const char *gguf_name;         /* general.architecture, or NULL (no GGUF support) */
  int default_ctx;               /* max_position_embeddings when config.json has none */
  int rope_neox_gguf;            /* GGUF: 1 rotate_half pairs, 0 adjacent pairs (llama.cpp's
                                    permuted Q/K of "llama") */
  int gguf_partial_rope;         /* GGUF: rope.dimension_count may be below head_dim */
  /* Reads what only this architecture has (biases, norms, RoPE variants, sliding window). Called
   * after the shared reader, before validation. NULL: nothing more. */
  int (*hf_config)(struct model_config *c, const cJSON *root, const char *name);
  int (*gguf_config)(struct model_config *c, const struct gguf_file *g, const char *name);
  const struct arch_tensor *tensors;
  int num_tensors;
  /* Embedding, every layer and the final norm: the normed hidden states in f->xb. */
  int (*forward)(const struct fwd *f);
};

/* Lookups; NULL when unknown (callers name the supported ones with arch_list). */
const struct arch *arch_by_hf_class(const char *cls);
const struct arch *arch_by_gguf(const char *name, size_t len);
const struct arch *arch_by_name(const char *name);
/* "A, B and C" of every row's HF classes (gguf = 0) or GGUF names (gguf = 1), for messages. */
const char *arch_list(int gguf);


/* Shared config readers (config.c) for the architectures' hooks: KEY of O into *OUT; absent or
 * null keeps *OUT unless REQUIRED. Errors name NAME and KEY. */
int cfg_json_int(const cJSON *o, const char *key, int *out, int required, const char *name);
int cfg_json_float(const cJSON *o, const char *key, float *out, int required, const char *name);
int cfg_json_bool(const cJSON *o, const char *key, int *out, const char *name);
int cfg_gguf_int(const struct gguf_file *g, const char *arch, const char *suffix, int *out,
                 int required, const char *name);
int cfg_gguf_float(const struct gguf_file *g, const char *arch, const char *suffix, float *out,
                   int required, const char *name);
/* sliding_window: an integer, or null / absent (none); USE_KEY (e.g. "use_sliding_window") when
 * non-NULL and false switches it off. */
int cfg_sliding_window(struct model_config *c, const cJSON *root, const char *use_key,
                       const char *name);

/* The rows, one per file (arch_*.c). */
extern const struct arch arch_llama, arch_mistral, arch_qwen2, arch_phi3, arch_qwen3;
extern const struct arch arch_gemma2, arch_mixtral;

#endif
