/* model.h - a loaded model: config, weights on a backend, KV pool, and the forward pass. */
#ifndef PAGODA_MODEL_H
#define PAGODA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

enum rope_scaling_type { ROPE_SCALING_NONE, ROPE_SCALING_LLAMA3, ROPE_SCALING_LINEAR };

struct model_config {
  char arch[32];          /* "llama", "mistral", "qwen2" */
  int vocab_size;
  int dim;                /* hidden size */
  int n_layers;
  int n_heads, n_kv_heads, head_dim;
  int ffn_dim;            /* intermediate size */
  int max_seq_len;        /* max_position_embeddings / context_length */
  float rms_eps;
  float rope_theta;
  int rope_neox;          /* 1 for HF safetensors (rotate_half); GGUF llama: 0 */
  enum rope_scaling_type rope_scaling;
  float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_orig_max_pos;
  int tie_embeddings;
  int qkv_bias;           /* Qwen2 */
  enum dtype weight_dtype; /* dtype of the projection weights in the file */
  int bos_id, eos_id;     /* from config.json / GGUF metadata; -1 when absent */
};

struct model;

/* Loads PATH (an HF directory with config.json + safetensors, or a .gguf file) onto BE.
 * Returns NULL with err_last() naming the file and tensor on any problem.
 * The model borrows BE (which must outlive it). Free with model_free. */
struct model *model_load(const char *path, struct backend *be);
void model_free(struct model *m);
const struct model_config *model_get_config(const struct model *m);

/* Bytes one KV block takes over all layers (K and V, scales included). */
size_t model_kv_block_bytes(const struct model_config *c, int block_size, enum dtype kv_dtype);

/* Allocates the KV pool (num_blocks per layer, block 0 included) and the step workspace sized
 * for max_tokens tokens and max_seqs sequences of at most max_blocks_per_seq blocks. Once, at
 * start-up. Returns 0 or -1 with err_last() set (naming the --pa-* flag to lower on OOM). */
int model_alloc_cache(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype,
                      int max_tokens, int max_seqs, int max_blocks_per_seq);

/* Runs one step. BATCH is in host memory (the model copies it to the backend); LOGITS is host
 * memory of (batch->num_logits, vocab_size) floats. Returns 0 or -1 with err_last() set. */
int model_forward(struct model *m, const struct batch *batch, float *logits);

/* Copy-on-write support: copies KV blocks src[i] -> dst[i] in every layer (host arrays). */
int model_copy_blocks(struct model *m, const int32_t *src, const int32_t *dst, int n);

/* The per-layer caches (n_layers entries), for tests and the CUDA graph path. */
struct kv_layer *model_kv_layers(struct model *m);

#endif
