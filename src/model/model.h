/* model.h - a loaded model: config, weights on a backend, KV pool, and the forward pass. */
#ifndef PAGODA_MODEL_H
#define PAGODA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

enum rope_scaling_type {
  ROPE_SCALING_NONE,
  ROPE_SCALING_LLAMA3,
  ROPE_SCALING_LINEAR,
  ROPE_SCALING_LONGROPE /* Phi-3 "longrope" / "su": short and long per-frequency factors */
};

#define ROPE_MAX_FACTORS 256 /* longrope factors per list (rot_dim / 2 <= 256) */

struct model_config {
  char arch[32];          /* struct arch's name: "llama", "mistral", "qwen2", "phi3", "qwen3" */
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
  int rope_dim;           /* rotated dims per head: head_dim * partial_rotary_factor (even) */
  /* longrope: inv_freq[i] = 1 / (factor[i] * theta^(2i/rope_dim)), short_factor while the
   * sequence is at most rope_orig_max_pos tokens long, long_factor beyond (docs/model-formats.md);
   * cos and sin are scaled by rope_attn_factor. */
  float rope_short_factor[ROPE_MAX_FACTORS], rope_long_factor[ROPE_MAX_FACTORS];
  float rope_attn_factor; /* 1 unless longrope */
  int sliding_window;     /* 0: none; else a query sees the last sliding_window positions */
  int swa_first_layer;    /* layers >= this one use the window (Qwen2's max_window_layers) */
  int swa_pattern;        /* 0: every such layer; N: layer l is global when (l + 1) % N == 0
                             (transformers' sliding_window_pattern: Gemma 2 N = 2, Gemma 3 6) */
  int tie_embeddings;
  int qkv_bias;           /* Qwen2 */
  /* Gemma 2: the window of the even (local) layers; the odd ones are global. Kept apart from
   * sliding_window (0 then), which the KV manager may use to release blocks: Gemma 2's global
   * layers read every block, so none may go. */
  int local_window;
  /* Gemma 2 (arch_gemma2.c): scores scaled by query_pre_attn_scalar^-0.5, attention and final
   * logits softcapped (0: off); norm_plus_one: the file stores w where the forward needs 1 + w
   * (HF), so model_file adds 1 to every norm weight once at load. */
  float query_pre_attn_scalar, attn_softcap, final_softcap;
  int norm_plus_one;
  int n_experts, n_experts_used; /* Mixtral (arch_mixtral.c): experts per layer, chosen per token */
  enum dtype weight_dtype; /* dtype of the projection weights in the file */
  int bos_id, eos_id;     /* from config.json / GGUF metadata; -1 when absent */
};

struct model;

/* Loads PATH (an HF directory with config.json + safetensors, or a .gguf file) onto BE.
 * Returns NULL with err_last() naming the file and tensor on any problem.
 * The model borrows BE (which must outlive it). Free with model_free. */
struct model *model_load(const char *path, struct backend *be);
/* As model_load, with the float weight matrices quantized at load to ISQ (an --isq value:
 * "q4_0", "q4_k", "q5_k", "q6_k", "q8_0", "4", "8"; NULL: none). See model/quant_isq.h. */
struct model *model_load_isq(const char *path, struct backend *be, const char *isq);
void model_free(struct model *m);

/* Tensor parallelism (docs/distributed.md): the model split over the world = tp_group_world(G)
 * backends BES (rank r's backend BES[r], made on rank r's thread). Each rank loads its shard on
 * its thread (q/k/v, gate/up split by output rows; o, down by input columns; KV heads split, or
 * replicated when fewer than ranks; Phi-3's fused tensors part by part, Mixtral's experts each),
 * joins one communicator (ops->comm_id / comm_init), and splits the lm_head by vocabulary rows
 * (model_tp_vocab_split; rank 0 alone holds it when world does not divide the vocabulary). The
 * returned model is rank 0's: every model_* call on it runs
 * on all ranks (its configuration, weight and KV sizes are one GPU's share); model_free frees
 * them all. G and BES must outlive it. World 1: model_load_isq(path, bes[0], isq). */
struct tp_group;
struct model *model_load_tp(const char *path, struct backend *const *bes, struct tp_group *g, const char *isq);

/* Multi-process tensor parallelism (src/dist/mp.c, docs/distributed.md): one process per rank.
 * model_load_rank loads rank RANK's shard of WORLD on BE alone (no communicator: the caller
 * joins one, ops->comm_init or cpu_comm_attach_rdv, before the first forward). On rank 0,
 * model_set_mirror makes every public call (the allocations, model_profile, model_forward,
 * model_copy_blocks) call MIRROR instead, which sends the call to the workers and runs it
 * here with model_run_call; a worker runs each call it receives with model_run_call (LOGITS:
 * rank 0's host logits or NULL; ignored on ranks > 0, which compute none). */
struct step_msg;
struct model *model_load_rank(const char *path, struct backend *be, const char *isq, int rank, int world);
void model_set_mirror(struct model *m, int (*mirror)(struct model *m, const struct step_msg *call, float *logits,
                                                     void *user),
                      void *user);
int model_run_call(struct model *m, const struct step_msg *call, float *logits);
const struct model_config *model_get_config(const struct model *m);
/* Tensor parallelism: the output head's rows each rank holds when the vocabulary is split over
 * the ranks (vocab / world, when world divides it; the logits are gathered to rank 0), else 0
 * (world 1, or rank 0 holds the whole head and computes every logit). */
int model_tp_vocab_split(const struct model *m);
/* Whether asynchronous steps may run on this model: always without tensor parallelism; under
 * single-process tensor parallelism when the ranks > 0 read the ids rank 0 sampled on its device
 * (backend.h peer_ar_connect); never on rank 0 of a multi-process group (model_set_mirror: its
 * workers take their ids from each step's message). */
int model_tp_async_ok(const struct model *m);

/* The sliding window every layer attends within (tokens), or 0 when some layer attends to the
 * whole context: what the KV manager may free blocks by (kv_manager_set_window). */
int model_kv_window(const struct model_config *c);
/* 1 when the checkpoint carries per-layer f8 KV-cache scales (self_attn.k_scale / v_scale), which
 * an f8e4m3 cache then uses instead of 1.0 (docs/kv-cache.md). */
int model_has_kv_scales(const struct model *m);

/* Bytes one KV block takes over all layers (K and V, scales included). */
size_t model_kv_block_bytes(const struct model_config *c, int block_size, enum dtype kv_dtype);

/* Bytes of the weights on the backend (in the backend's dtypes; a tied lm_head counted once). */
size_t model_weight_bytes(const struct model *m);

/* Start-up, in this order (the engine's sizing, docs/kv-cache.md):
 *   model_alloc_workspace  the step workspace: activations for max_tokens tokens; on a device
 *                          also the batch metadata and logits for max_seqs sequences of at most
 *                          max_blocks_per_seq blocks;
 *   model_profile          (device backends) one forward pass at the largest batch, so that
 *                          whatever a step allocates lazily (kernel modules, cuBLAS) is taken;
 *   model_alloc_kv         the KV pool, sized by the caller from the memory left after both.
 * Each replaces an earlier allocation of its kind and returns 0 or -1 with err_last() set (on
 * OOM naming the --pa-* / --max-num-* flag to lower). model_alloc_cache = workspace then pool,
 * for tests and benches. All are freed by model_free. */
int model_alloc_workspace(struct model *m, int max_tokens, int max_seqs, int max_blocks_per_seq);
size_t model_workspace_bytes(const struct model *m); /* backend bytes; 0 before the allocation */

/* Runs one forward pass of min(max_tokens, max_seqs * max_blocks_per_seq * block_size) tokens
 * spread evenly over up to max_seqs sequences (logits for each), through a temporary pool of one
 * block: every block-table entry is the null block 0 and every slot -1, so nothing is written and
 * the output is meaningless. The pool is freed before it returns; call it before model_alloc_kv. */
int model_profile(struct model *m, int block_size, enum dtype kv_dtype);

/* The KV pool: num_blocks (>= 2, block 0 the null block) per layer of block_size tokens in
 * kv_dtype, one of the backend's caps.kv_dtypes (cpu: f32, f16, f8e4m3; cuda: bf16, f8e4m3). */
int model_alloc_kv(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype);
int model_alloc_cache(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype,
                      int max_tokens, int max_seqs, int max_blocks_per_seq);

/* Runs one step. BATCH is in host memory (the model copies it to the backend in one copy);
 * LOGITS is host memory of (batch->num_logits, vocab_size) floats, or NULL on a device backend
 * (caps.host_memory 0) to leave the first min(num_logits, max_seqs) rows in
 * model_logits_device (the others come from model_logits_rows), with the step still running
 * on the backend's stream (no sync). Returns 0 or -1 with err_last() set. */
int model_forward(struct model *m, const struct batch *batch, float *logits);
/* model_forward for a decode batch padded to one of the engine's graph sizes (caps.graphs):
 * T = B, one query and one logits row per sequence, max_blocks_per_seq the model's bound and
 * max_seq_len / max_query_len upper bounds (the largest context, 1); rows past the real ones
 * have input id 0, position 0, slot -1, seq_len 1 and a block-table row of zeros (the null
 * block). Its launches depend only on B, so the backend replays the graph captured for B
 * (ops->graph_run; on host backends it is model_forward). */
int model_forward_graph(struct model *m, const struct batch *batch, float *logits);
/* The device logits of the last model_forward(..., NULL): (max_seqs, vocab) F32; NULL on host
 * backends. model_logits_download copies rows [row0, row0 + n) into DST and synchronises. */
float *model_logits_device(struct model *m);
/* After model_forward(..., NULL): rows [r0, r0 + n) of its logits (n <= max_seqs) into rows
 * [0, n) of model_logits_device, replacing what was there. No sync. */
int model_logits_rows(struct model *m, int r0, int n);
int model_logits_download(struct model *m, int row0, int n, float *dst);

/* Copy-on-write support: copies KV blocks src[i] -> dst[i] in every layer (host arrays). */
int model_copy_blocks(struct model *m, const int32_t *src, const int32_t *dst, int n);

/* The per-layer caches (n_layers entries), for tests and the CUDA graph path. */
struct kv_layer *model_kv_layers(struct model *m);

#endif
