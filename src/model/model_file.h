/* model_file.h - an opened model on disk: its config and its tensors, memory-mapped (host). */
#ifndef PAGODA_MODEL_FILE_H
#define PAGODA_MODEL_FILE_H

#include <stdint.h>

#include "model/model.h"
#include "util/dtype.h"

struct host_tensor {
  const void *data;  /* into a mapped file; NULL when the tensor is absent (optional tensors) */
  enum dtype dtype;
  int64_t rows, cols; /* torch shape (rows, cols) = (out, in); 1-D tensors: rows = 1 */
};

struct layer_tensors {
  struct host_tensor attn_norm;          /* (1, dim) */
  struct host_tensor wq, wk, wv, wo;     /* (n_heads*hd, dim), (n_kv*hd, dim) x2, (dim, n_heads*hd) */
  struct host_tensor bq, bk, bv;         /* qwen2 only: (1, n_heads*hd), (1, n_kv*hd) x2 */
  struct host_tensor ffn_norm;           /* (1, dim) */
  struct host_tensor w_gate, w_up;       /* (ffn, dim) */
  struct host_tensor w_down;             /* (dim, ffn) */
  struct host_tensor wqkv;               /* phi3: (n_heads*hd + 2*n_kv*hd, dim), q | k | v rows */
  struct host_tensor w_gate_up;          /* phi3: (2*ffn, dim), gate rows then up rows */
  struct host_tensor q_norm, k_norm;     /* qwen3: (1, head_dim) */
  struct host_tensor post_attn_norm, post_ffw_norm; /* gemma2: (1, dim) */
  struct host_tensor moe_router;         /* mixtral: (n_experts, dim) */
  struct host_tensor exps_gate, exps_up; /* mixtral: (n_experts * ffn, dim), experts stacked */
  struct host_tensor exps_down;          /* mixtral: (n_experts * dim, ffn) */
};
/* Which of these an architecture has, and their names: its table in model/arch.h. */

struct model_file {
  struct model_config config;
  struct host_tensor tok_embd;   /* (vocab, dim) */
  struct host_tensor out_norm;   /* (1, dim) */
  struct host_tensor lm_head;    /* (vocab, dim); equals tok_embd when embeddings are tied */
  struct host_tensor rope_freqs; /* GGUF llama3-style models only: (1, head_dim/2) divisors of
                                    inv_freq (llama.cpp's rope_freqs.weight); else data NULL */
  struct layer_tensors *layers;  /* (n_layers) */
  float *kv_scales;              /* (n_layers, 2): the checkpoint's f8 KV-cache scales (k, v) of each
                                    layer, or NULL when it has none (load_kv_scales); owned */
  void *priv;                    /* mapped files, owned */
};

/* Opens PATH: an HF directory (config.json + model.safetensors or sharded
 * model.safetensors.index.json) or a .gguf file. Validates the architecture, every tensor's
 * presence, dtype and shape. NULL with err_last() naming the file and tensor.
 * Free with model_file_close (tensor data stays valid until then). */
struct model_file *model_file_open(const char *path);
void model_file_close(struct model_file *f);
/* Hands BUF (malloc'd, e.g. a tensor quantized at load) to F: freed by model_file_close. */
int model_file_own(struct model_file *f, void *buf);

#endif
