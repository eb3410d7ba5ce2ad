/* backend.h - the op interface the forward pass calls; one implementation per device (cpu, cuda).
 *
 * Contract (every implementation):
 * - All pointers passed to ops are in the backend's memory (host memory for cpu, device memory
 *   for cuda) unless a comment says "host". Memory comes from be->ops->alloc at start-up only;
 *   nothing is allocated per step or per token.
 * - Activation buffers hold be->act_dtype elements (cpu: F32; cuda: BF16 or F32, its choice).
 *   Logits are always F32. Integer metadata is int32.
 * - Ops are asynchronous on the backend's stream; ->sync waits. Every op returns 0, or -1 with
 *   err_last() set (file:line of the failing call).
 * - Weights are row-major (rows = output features, cols = input features), as in HF Linear
 *   and GGUF (ne[0] = cols). Q8_0 weights are blocks of 32 along cols.
 */
#ifndef PAGODA_BACKEND_H
#define PAGODA_BACKEND_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/log.h"

struct backend;

struct weight {
  void *data;      /* (rows, cols) of dtype, in backend memory; 1-D tensors have rows = 1 */
  enum dtype dtype;
  int64_t rows, cols;
};

/* The K/V cache of one layer. Block ids are shared by all layers; block 0 is the null block. */
struct kv_layer {
  void *k;         /* (num_blocks, n_kv_heads, block_size, head_dim) of dtype */
  void *v;         /* (num_blocks, n_kv_heads, block_size, head_dim) of dtype */
  /* F8E4M3 only (1.0 otherwise): one scale per layer for K and one for V. The cache holds
   * e4m3(x / scale) (rounded to nearest even, saturated to +-448) and attention reads
   * e4m3 * scale. The checkpoint's k_scale / v_scale when it has them, else 1.0 (as mistral.rs
   * and vLLM without calibration); no per-token storage, so an F8E4M3 pool holds exactly twice
   * the tokens of a bf16 one in the same memory. */
  float k_scale, v_scale;
  enum dtype dtype;
  int num_blocks, block_size, n_kv_heads, head_dim;
};

/* One step's batch, flattened over sequences (see BLUEPRINT §2), in backend memory. */
struct batch {
  int num_tokens;               /* T */
  int num_seqs;                 /* B */
  int max_blocks_per_seq;       /* row stride of block_tables */
  int max_seq_len;              /* max over seq_lens (host-side bound for kernels) */
  int max_query_len;            /* max over query lengths */
  const int32_t *input_ids;     /* (T) */
  const int32_t *positions;     /* (T) position of each token in its sequence */
  const int32_t *slot_mapping;  /* (T) block_id * block_size + offset where its K/V go; -1 skips */
  const int32_t *query_start;   /* (B+1) token b's queries are [query_start[b], query_start[b+1]) */
  const int32_t *seq_lens;      /* (B) tokens in the sequence after this step, cached ones included */
  const int32_t *block_tables;  /* (B, max_blocks_per_seq) logical block -> physical block id */
  int num_logits;               /* rows of logits wanted, usually B */
  const int32_t *logits_idx;    /* (num_logits) token indices (into T) whose logits are wanted */
};
/* Asynchronous steps: on a backend with ops->resolve_ids an input id may be < 0, standing for an
 * id the previous step sampled that is still on the device: -1 - (slot * max_seqs + i) is entry i
 * of what the last sample_async into SLOT wrote (max_seqs as given to reserve). The model
 * resolves them on the device right after the batch goes up. */

/* How attention scores are formed and which keys a query sees. The kernels take this from the
 * model, one per layer, so architectures differ only in these values:
 * - score = softcap * tanh(q.k * scale / softcap) when softcap > 0 (Gemma 2), else q.k * scale;
 * - a query at position p sees the keys at positions max(0, p - window + 1) .. p when window > 0
 *   (sliding window: Mistral v0.1, Gemma 2's local layers, as transformers masks it: the key at
 *   p - window is the first one outside), else 0 .. p. */
struct attn_params {
  int n_heads;   /* query heads; head h reads KV head h / (n_heads / kv->n_kv_heads) */
  float scale;   /* usually 1 / sqrt(head_dim) */
  float softcap; /* 0: off */
  int window;    /* 0: off */
};

/* RoPE parameters; inv_freq already includes any scaling (llama3), computed once by the model. */
struct rope_params {
  const float *inv_freq; /* (rot_dim / 2) in backend memory */
  int rot_dim;           /* rotated dims per head (= head_dim for Llama; less with Phi-3's
                            partial_rotary_factor: dims rot_dim.. pass through unrotated) */
  int neox;              /* 1: pairs (i, i + rot_dim/2) as HF rotate_half; 0: pairs (2i, 2i+1) */
  /* LongRoPE (Phi-3); inv_freq_long NULL: off. A token rotates with inv_freq_long instead of
   * inv_freq when its sequence (the s with query_start[s] <= t < query_start[s + 1]) holds more
   * than long_after tokens after this step (seq_lens[s]), as transformers picks the factors from
   * the length of the sequence it runs. query_start (num_seqs + 1) and seq_lens (num_seqs) are
   * the step's batch arrays in backend memory. */
  const float *inv_freq_long; /* (rot_dim / 2) in backend memory */
  int long_after;
  const int32_t *query_start, *seq_lens;
  int num_seqs;
  /* cos and sin are multiplied by mscale (LongRoPE's attention factor), so the rotated dims of
   * q and k are scaled by it and the others are not; 0 means 1. */
  float mscale;
};

/* The RMSNorm a fused matmul applies to its input first (matmul_n, matmul_silu_mul; NULL: none),
 * so that the residual stream goes straight into the next block's matmuls with no rmsnorm
 * launch between them (blocks.c, struct block_res): the matmul reads
 * x * rsqrt(mean(x^2) + eps) * w, rounded to act_dtype as op rmsnorm (residual NULL) writes it.
 * XN is a (T, K) act_dtype buffer of the caller's that the backend may write the normalized rows
 * to (the CPU does; CUDA normalizes on chip and leaves it alone). */
struct backend_prenorm {
  const struct weight *w; /* (K) */
  float eps;
  void *xn;
};

/* One row's sampling settings for backend_ops.sample; U is a uniform draw in [0, 1) made by
 * the host sampler, so GPU and host sampling pick the same token from the same draw. */
struct backend_sample_params {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float u;
};

/* One entry of backend_ops.process: what the logits processors do to one token of one row, in
 * the host sampler's order (sampler_apply_processors): the logit_bias values of the token, added
 * in request order; the repetition penalty (l > 0 ? l / r : l * r) when REP; minus SUB (the
 * presence and frequency penalties, computed by the host as sampler_penalty_sub); -inf when
 * SUPPRESS. The entries of one row name distinct tokens. */
struct backend_proc_entry {
  int32_t row, id;       /* logits row and token id */
  int32_t bias0, num_bias; /* its values: bias[bias0 .. bias0 + num_bias) */
  float rep;             /* 1: no repetition penalty for this token */
  float sub;             /* 0: no presence / frequency penalty */
  int32_t suppress;      /* 1: the logit becomes -inf last */
};

struct backend_ops {
  const char *name; /* for logs and messages only: callers decide by be->caps, never by name */
  /* memory (start-up only) */
  void *(*alloc)(struct backend *be, size_t bytes); /* NULL with err_last() set when out of memory */
  void (*free)(struct backend *be, void *p);
  int (*upload)(struct backend *be, void *dst, const void *host_src, size_t bytes);
  int (*download)(struct backend *be, void *host_dst, const void *src, size_t bytes);
  int (*memset0)(struct backend *be, void *dst, size_t bytes);
  int (*sync)(struct backend *be);
  /* Bytes of memory free for the KV pool after what is allocated so far (cpu: RAM). */
  size_t (*mem_available)(struct backend *be);
  /* Makes a backend weight from a host tensor (e.g. an mmap'd file region) of dtype SRC_T.
   * cpu may alias the host memory when it can use it as is; cuda copies (and may convert to
   * its preferred dtype). The host memory must outlive the weight when aliased. */
  int (*weight_from_host)(struct backend *be, struct weight *w, const void *host, enum dtype src_t,
                          int64_t rows, int64_t cols);
  void (*weight_free)(struct backend *be, struct weight *w);

  /* ops */
  /* out(T, dim) = emb[ids[t]] */
  int (*embed)(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T);
  /* If residual != NULL: residual(T,dim) += x(T,dim) first (fused add), then normalize residual.
   * out(T,dim) = rmsnorm(residual or x) * w(dim). */
  int (*rmsnorm)(struct backend *be, void *out, void *residual, const void *x, const struct weight *w,
                 int T, int dim, float eps);
  /* out(T, w->rows) = x(T, w->cols) @ w^T (+ bias(w->rows) when bias != NULL). out is act_dtype,
   * or F32 when out_f32 (used for logits). */
  int (*matmul)(struct backend *be, void *out, const void *x, const struct weight *w,
                const struct weight *bias, int T, int out_f32);
  /* In place on q(T, n_heads, head_dim) and k(T, n_kv_heads, head_dim) at positions(T). */
  int (*rope)(struct backend *be, void *q, void *k, const int32_t *positions, int T, int n_heads,
              int n_kv_heads, int head_dim, const struct rope_params *rp);
  /* out(T, F) = silu(gate(T, F)) * up(T, F); out may alias gate. */
  int (*silu_mul)(struct backend *be, void *out, const void *gate, const void *up, int T, int F);
  /* Writes k,v(T, n_kv_heads, head_dim) into the cache at batch->slot_mapping. */
  int (*kv_write)(struct backend *be, const struct kv_layer *kv, const void *k, const void *v,
                  const struct batch *b);
  /* out(T, ap->n_heads, head_dim): each query token attends causally (keys at positions <= its
   * own, inside ap->window) over its sequence's blocks, scores as struct attn_params says.
   * Host-side bounds of the batch (max_seq_len, max_query_len) may be loose upper bounds: the
   * lengths are read from seq_lens / query_start (CUDA graphs capture with loose bounds). */
  int (*attention)(struct backend *be, void *out, const void *q, const struct kv_layer *kv,
                   const struct batch *b, const struct attn_params *ap);
  /* out(n, dim) = x[idx[i]] for i < n (rows of act_dtype). */
  int (*gather_rows)(struct backend *be, void *out, const void *x, const int32_t *idx, int n, int dim);
  /* Copies block src to block dst in every layer's cache (copy-on-write), host arrays of ids. */
  int (*copy_blocks)(struct backend *be, struct kv_layer *layers, int n_layers, const int32_t *src,
                     const int32_t *dst, int n);

  void (*destroy)(struct backend *be);

  /* Start-up sizing (NULL: nothing to size). Called by model_alloc_workspace with the largest
   * step the engine will run: MAX_TOKENS tokens over MAX_SEQS sequences of at most MAX_BLOCKS
   * blocks each. The backend allocates every scratch buffer a step of that size needs (cuda:
   * sampling staging and its pinned host side) so that no step allocates; a later call with
   * larger bounds grows them. 0, or -1 with err_last() set (out of memory names the flag). */
  int (*reserve)(struct backend *be, int max_tokens, int max_seqs, int max_blocks);

  /* Optional ops (NULL: not supported by this backend; callers fall back to the host). */
  /* Sampling over logits(n, vocab) F32 in backend memory, one token per row into tokens(n)
   * (host), with params(n) (host). Rows with temperature <= 0 take the argmax (lowest id on
   * ties). Others: logits / temperature, then top_k (<= 0: off; ties at the k-th value are
   * all kept), then top_p over what is left (>= 1: off), then min_p relative to the most
   * likely token (<= 0: off); the token is the first one in id order whose running sum of
   * kept probabilities exceeds u * (their total). Synchronises. */
  int (*sample)(struct backend *be, int32_t *tokens, const float *logits, int n, int vocab,
                const struct backend_sample_params *params);

  /* ---- Ops of Gemma 2 and Mixtral (required; CPU reference in cpu_act.c / cpu_moe.c) ---- */
  /* out(T, F) = gelu_tanh(gate(T, F)) * up(T, F), gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi)
   * (x + 0.044715 x^3))) (PyTorch's gelu approximate="tanh", HF "gelu_pytorch_tanh"); out may
   * alias gate. */
  int (*gelu_tanh_mul)(struct backend *be, void *out, const void *gate, const void *up, int T, int F);
  /* x(n) *= s in place (activation dtype). With bf16 activations s is first rounded to bf16, as
   * HF scales Gemma's embeddings by a normalizer tensor of the hidden states' dtype. */
  int (*scale)(struct backend *be, void *x, size_t n, float s);
  /* logits(n, vocab) F32 in place: x = cap * tanh(x / cap) (Gemma 2's final softcapping); cap > 0. */
  int (*softcap)(struct backend *be, float *logits, int n, int vocab, float cap);
  /* MoE routing (transformers' MixtralSparseMoeBlock): for each token t, p = softmax over the E
   * experts of router_logits(T, E) (F32), the k largest p (lowest expert id on ties), weights
   * w = p / (sum of the k chosen p). The T * k (token, expert) pairs become ROWS grouped by
   * expert: expert e owns rows [expert_start[e], expert_start[e+1]), in token order within an
   * expert. Outputs: row_token(T*k) the token of each row, row_weight(T*k) F32 its weight,
   * token_rows(T, k) the rows of token t in increasing expert id, expert_start(E+1) in backend
   * memory and its copy expert_start_host(E+1) (host) so the caller can size one GEMM per
   * expert. Synchronises (the host copy is read back). 1 <= k <= E <= 256. */
  int (*moe_route)(struct backend *be, const float *router_logits, int T, int E, int k,
                   int32_t *row_token, float *row_weight, int32_t *token_rows, int32_t *expert_start,
                   int32_t *expert_start_host);
  /* out(T, D) = sum over j < k of row_weight[r] * y[r], r = token_rows[t, j] (in that order),
   * y(T*k, D) the experts' outputs by row (activation dtype). A gather, so no atomics: the sum
   * is deterministic and, for k = 2, equal to transformers' index_add over experts in id order. */
  int (*moe_combine)(struct backend *be, void *out, const void *y, const int32_t *token_rows,
                     const float *row_weight, int T, int k, int D);
  /* The logits processors of a step, in place on logits(rows, vocab) F32 in backend memory, from
   * host arrays ENTRIES(n) and BIAS(num_bias) (struct backend_proc_entry; one copy up, no sync).
   * Results are bitwise those of sampler_apply_processors on the same row. */
  int (*process)(struct backend *be, float *logits, int vocab, const struct backend_proc_entry *entries, int n,
                 const float *bias, int num_bias);
  /* Log-probabilities of one token per row: out[i] (host) = log softmax(logits row i)[targets[i]]
   * for logits(n, vocab) F32 in backend memory and TARGETS(n) host ids; max and sum in double as
   * the host computes prompt logprobs. Synchronises; n <= the max_seqs given to reserve. */
  int (*logprob_rows)(struct backend *be, float *out, const float *logits, int n, int vocab,
                      const int32_t *targets);
  /* Page-locked host memory for staging what goes up each step (start-up only), so that one
   * asynchronous copy moves it; NULL with err_last() set. The caller may rewrite it only after
   * the next sync. NULL op: plain host memory (malloc) serves. */
  void *(*alloc_host)(struct backend *be, size_t bytes);
  void (*free_host)(struct backend *be, void *p);
  /* Runs RECORD(CTX), which enqueues one step's ops, as the graph captured for KEY: the first
   * call for a KEY runs it directly (a warm-up: lazy module loads happen outside capture), the
   * second captures and instantiates it, every later one replays it without calling RECORD (a
   * capture that fails is logged, and the step and every later one run RECORD directly).
   * Everything RECORD enqueues must depend only on KEY (same pointers, same scalars). With
   * replay off (PAGODA_CUDA_GRAPHS=0) it always runs RECORD directly. No sync. */
  int (*graph_run)(struct backend *be, int key, int (*record)(void *ctx), void *ctx);

  /* ---- Sampling for every request kind on the device (optional; the engine falls back to the
   * host for the rows these would serve) ---- */
  /* As sample, for N entries where entry i draws from logits row ROWS[i] (host) with PARAMS[i]:
   * several entries may share a row (the first step of n > 1 draws its n samples from the
   * prompt's row, each with its own u). Synchronises. */
  int (*sample_rows)(struct backend *be, int32_t *tokens, const float *logits, const int32_t *rows, int n,
                     int vocab, const struct backend_sample_params *params);
  /* Copies rows ROWS[0..n) (host) of logits(., vocab) F32 into the backend's stash, rows 0..n-1:
   * the raw logits of logprob rows, kept before ops->process changes them in place. The stash
   * holds until the next stash_rows. No sync. */
  int (*stash_rows)(struct backend *be, const float *logits, int vocab, const int32_t *rows, int n);
  /* Top-k log-probabilities of N entries, entry i over row ROWS[i] of logits(., vocab) F32 in
   * backend memory (of the stash when LOGITS is NULL): lse = mx + log(sum of exp(x - mx)), the
   * sum in double as sequence_save_raw computes it; the K largest x - lse, descending (ties: the
   * lower id first), into LPS(n, k) and their ids into IDS(n, k) (host); with TARGETS (host, n)
   * also TLP[i] = x[targets[i]] - lse. 0 <= k <= BACKEND_TOPK_MAX and k <= vocab. Only the k
   * ids and values per entry come back. Synchronises. */
  int (*topk_rows)(struct backend *be, int32_t *ids, float *lps, float *tlp, const float *logits, int vocab,
                   const int32_t *rows, const int32_t *targets, int n, int k);
  /* ---- Asynchronous steps (optional; caps.async_steps on a device backend needs all three): the
   * engine launches step N + 1 before it reads step N's ids (docs/cuda.md, Asynchronous steps).
   * SLOT is 0 or 1 (the step's parity): each has its own device ids, pinned host copy and event,
   * so the ids of step N stay readable while step N + 1 samples into the other slot. ---- */
  /* As sample_rows, without the sync: the N ids land in SLOT's device buffer (what resolve_ids
   * reads) and go down to SLOT's pinned host buffer behind SLOT's event. N <= the max_seqs given
   * to reserve. The staging of PARAMS and ROWS is SLOT's own, so it may be rewritten while the
   * other slot's step is still in flight. */
  int (*sample_async)(struct backend *be, int slot, const float *logits, const int32_t *rows, int n, int vocab,
                      const struct backend_sample_params *params);
  /* Waits for SLOT's event (the ids of its last sample_async are down) and copies the N ids into
   * TOKENS (host). */
  int (*sample_wait)(struct backend *be, int slot, int32_t *tokens, int n);
  /* IDS(T) int32 in backend memory, in place: each id < 0, k = -1 - id, becomes entry k % STRIDE
   * of slot k / STRIDE's device ids (STRIDE: the max_seqs given to reserve; see struct batch).
   * Enqueued; no sync. */
  int (*resolve_ids)(struct backend *be, int32_t *ids, int T, int stride);

  /* ---- Tensor parallelism (src/dist/tp.c, docs/distributed.md). Optional: NULL when the build
   * has no collective library (cuda without NCCL); then --tp > 1 is refused. ---- */
  /* Makes BE's device the calling thread's current one (each rank's host thread calls it before
   * its first op). NULL: nothing to do. */
  int (*bind)(struct backend *be);
  /* A fresh communicator id (BACKEND_COMM_ID_BYTES bytes: ncclGetUniqueId on cuda), made once by
   * rank 0 and handed to every rank (in one process directly, across processes by rendezvous). */
  int (*comm_id)(struct backend *be, void *id);
  /* Joins communicator ID as RANK of WORLD. Every rank calls it at the same time, each from its
   * own thread or process (it blocks until all have joined). Freed by ->destroy. */
  int (*comm_init)(struct backend *be, const void *id, int rank, int world);
  /* x(n) of act_dtype in place: the element-wise sum over the ranks, on every rank, enqueued on
   * the stream (ncclAllReduce). Every rank calls it with the same n in the same order. */
  int (*all_reduce_sum)(struct backend *be, void *x, size_t n);
  /* 0, or -1 with err_last() naming the error when the communicator failed asynchronously (a
   * peer died, a network error: ncclCommGetAsyncError). Never blocks. */
  int (*comm_check)(struct backend *be);
  /* Aborts the communicator (ncclCommAbort): NCCL collectives in flight return instead of waiting
   * for a dead peer. Afterwards every all_reduce_sum fails and no CUDA graph is replayed (a peer
   * all-reduce kernel already waiting ends at its timeout). */
  void (*comm_abort)(struct backend *be);
  /* The vocabulary-parallel output head's gather: on rank 0, out(rows, world * cols) F32 gets
   * columns [r * cols, (r + 1) * cols) from rank r's in(rows, cols) F32 (its own included); the
   * other ranks only send (their OUT is neither read nor written and may be NULL). SCRATCH:
   * rows * world * cols F32 of backend memory on every rank, the op's to overwrite (cuda uses it
   * on rank 0, the CPU backend across processes on the others). Every rank calls it with the
   * same rows and cols in the same order; enqueued on the stream like all_reduce_sum. The values
   * arrive unchanged (a copy, no arithmetic). */
  int (*gather_cols)(struct backend *be, float *out, const float *in, float *scratch, int rows, int cols);

  /* ---- Fused small ops of the decode step (optional). Each equals the sequence of separate ops
   * it names, within the rounding of the activation dtype. Each returns 0 (done), -1 (error, as
   * every op), or 1: this backend does not cover these shapes (or PAGODA_FUSED_OPS=0 turned its
   * fused kernels off), nothing was enqueued and the caller runs the separate ops, as it does
   * when the op is NULL (blocks.c). The answer depends only on the arguments' shapes and dtypes,
   * so a captured graph stays valid. CPU reference: cpu_fused.c (the sequences). ---- */
  /* For i < n (1 <= n <= BACKEND_MATMUL_N_MAX): outs[i](T, ws[i]->rows) = x(T, K) @ ws[i]^T
   * (+ biases[i] when biases and biases[i] are non-NULL), every ws[i]->cols == K; outputs of
   * act_dtype. As n calls of matmul (q/k/v, gate/up: matrices that read the same input). With
   * PRE (struct backend_prenorm), x is first normalized: as rmsnorm into PRE->xn, then on xn. */
  int (*matmul_n)(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                  const struct weight *const ws[], const struct weight *const biases[], int T);
  /* out(T, F) = silu(x @ gate^T) * (x @ up^T), F = gate->rows = up->rows: as matmul into two
   * buffers, then silu_mul (each product rounded to act_dtype before silu_mul); PRE as in
   * matmul_n. */
  int (*matmul_silu_mul)(struct backend *be, void *out, const void *x, const struct backend_prenorm *pre,
                         const struct weight *gate, const struct weight *up, int T);
  /* rope(q, k, b->positions, T, n_heads, kv->n_kv_heads, kv->head_dim, rp), then
   * kv_write(kv, k, v, b): q and k rotated in place, the rotated k and v stored in the cache. */
  int (*rope_kv_write)(struct backend *be, void *q, void *k, const void *v, const struct kv_layer *kv,
                       const struct batch *b, int n_heads, const struct rope_params *rp);

  /* The attention input of a decode step in one op: matmul_n(3, {q, k, v}, x, pre, ws, biases,
   * b->num_tokens) followed by rope_kv_write(q, k, v, kv, b, n_heads, rp). For layers without
   * per-head q/k norms (those sit between the two). */
  int (*matmul_qkv_rope)(struct backend *be, void *q, void *k, void *v, const void *x,
                         const struct backend_prenorm *pre, const struct weight *const ws[3],
                         const struct weight *const biases[3], const struct kv_layer *kv, const struct batch *b,
                         int n_heads, const struct rope_params *rp);
  /* resid(T, w->rows) += x(T, w->cols) @ w^T (the o / down projection added into the residual
   * stream): as matmul into SCRATCH ((T, w->rows) of act_dtype, the op's to overwrite) followed
   * by rmsnorm's residual add, each sum rounded to act_dtype (cuda keeps the product on chip). */
  int (*matmul_add)(struct backend *be, void *resid, const void *x, const struct weight *w, void *scratch, int T);
  /* Tensor parallelism: resid(n) += the sum over the ranks of x(n): as all_reduce_sum(x) (x then
   * holds the sum) followed by rmsnorm's residual add. Called like all_reduce_sum, by every rank
   * with the same n; answers 1 on every rank alike (it depends only on n and the group). */
  int (*all_reduce_add)(struct backend *be, void *resid, void *x, size_t n);

  /* ---- Single-process tensor parallelism's peer all-reduce (optional; NULL: all_reduce_sum is
   * the collective library's alone). The ranks' devices read each other's memory directly. ---- */
  /* Allocates this rank's staging and flags for a group of WORLD ranks. Each rank on its thread. */
  int (*peer_ar_alloc)(struct backend *be, int world);
  /* After every rank's peer_ar_alloc, each rank on its thread: GROUP[0..WORLD) are the ranks'
   * backends of this process (GROUP[RANK] == BE); from here all_reduce_sum of at most MAX_BYTES
   * (bf16) sums by direct reads of the peers' staging, in rank order (bit-identical on every
   * rank), the collective library above that. MAX_BYTES 0 turns it off; may be called again.
   * It also lets a rank > 0's resolve_ids read rank 0's sampled ids (asynchronous steps under
   * tensor parallelism). 1 (logged; the peer all-reduce off on this rank, peers enabled before
   * the one it could not reach stay enabled) when the devices cannot reach each other: the caller
   * then turns it off on every rank (MAX_BYTES 0), so all take the collective library alike. */
  int (*peer_ar_connect)(struct backend *be, struct backend *const *group, int rank, int world, size_t max_bytes);
};

/* The most matrices one matmul_n call takes (q, k, v). */
#define BACKEND_MATMUL_N_MAX 3

/* The largest k of backend_ops.topk_rows (beam search takes 2 x beam_width, width <= 64). */
#define BACKEND_TOPK_MAX 128

#define BACKEND_COMM_ID_BYTES 128 /* sizeof(ncclUniqueId) */

/* What a backend can do, filled in by its create function; everything outside src/backend/
 * reads these instead of comparing be->ops->name or guessing from act_dtype. */
struct backend_caps {
  int host_memory;        /* 1: alloc returns host memory the host may read and write directly
                           * (weights may alias an mmap, the batch is used in place, logits are
                           * written straight to the caller's array); 0: device memory */
  uint32_t kv_dtypes;     /* KV cache dtypes its attention / kv_write implement: bit (1u << dtype) */
  enum dtype kv_auto;     /* the dtype --pa-cache-type auto picks (the compute dtype) */
  enum dtype kv_auto_gguf; /* ... for a GGUF model (cpu: f16, the cache llama.cpp runs GGUF
                           * models with, so greedy outputs match the reference users compare) */
  int needs_profile;      /* 1: a step may allocate lazily (kernel modules, library handles), so
                           * the engine runs model_profile before sizing the pool from free memory */
  int device_sampling;    /* 1: ops->sample runs where the logits are (no copy of the vocabulary) */
  int graphs;             /* 1: decode steps may be replayed as captured graphs (ops->graph_run); the
                           * engine then pads decode batches to graph sizes (model_forward_graph),
                           * whether replay is on or off, so both give the same tokens */
  int graph_short_ctx;    /* > 0: a decode graph whose sequences all have at most this many tokens is
                           * captured apart (its own key), with this as its max_seq_len: a bound the
                           * backend launches differently under (CUDA: decode attention combines
                           * through thread block clusters, cuda_attn_decode.cu); 0: one graph per
                           * batch size, bounded by the model length */
  int async_steps;        /* 1: the engine may launch step N + 1 before it reads step N's ids: on
                           * a device backend through sample_async / sample_wait / resolve_ids; on
                           * a host backend (synchronous ops) the engine samples at launch and
                           * fills the ids itself, so the same bookkeeping runs (and is tested) */
};

struct backend {
  const struct backend_ops *ops;
  enum dtype act_dtype;
  int num_threads; /* cpu only */
  struct backend_caps caps;
};

/* 1 when BE's kernels implement a KV cache of dtype T. */
static inline int backend_kv_dtype_ok(const struct backend *be, enum dtype t) {
  return (int)t >= 0 && (int)t < 32 && (be->caps.kv_dtypes >> (int)t & 1u);
}

struct backend_params {
  const char *device; /* "cpu" or "cuda"; NULL = cuda when a GPU is present, else cpu */
  int num_threads;    /* cpu: 0 = all cores */
  int device_index;   /* cuda: which GPU (0-based; tensor-parallel rank r takes GPU r) */
};

/* Creates the requested backend. NULL with err_last() set. Free with be->ops->destroy(be).
 * "cuda" is a module (libpagoda-cuda.so) loaded with dlopen on first use, so that libpagoda and
 * the CLI need no CUDA library; see "Backend modules" below. */
struct backend *backend_create(const struct backend_params *p);
struct backend *backend_cpu_create(int num_threads);
/* 1 when DEVICE ("cpu", "cuda") can be created here: for cuda, the module loads and reports a
 * usable GPU. 0 with err_last() saying why not (what was tried, or what the GPU lacks). */
int backend_device_available(const char *device);

/* ---- Backend modules ------------------------------------------------------------------------
 * A module is a shared library that exports one symbol, BACKEND_MODULE_INIT, of type
 * backend_module_init_fn; everything else in it is hidden. The host passes the services the
 * module's code reaches through util/log.h (error and log calls go to the host's thread-local
 * last error and log level, so err_last() after a failed cuda op names the failing CUDA call);
 * the module links its own copy of the pure helpers (util/dtype.c). The structs of this header
 * cross the boundary as they are: host and module come from the same build, checked by
 * BACKEND_ABI_VERSION and the sizes in backend_host / backend_module.
 *
 * Search order for libpagoda-NAME.so: the directory of the running executable, the directory
 * of libpagoda.so when the host is that library, EXE_DIR/../lib (the install layout), then each
 * directory (or file) of the colon-separated PAGODA_BACKEND_PATH. A failure names every path
 * tried and why each failed. */
#define BACKEND_ABI_VERSION 5 /* 2: struct backend_caps, ops->reserve; 3: the tensor-parallel ops; 4: async steps;
                               * 5: fused ops (matmul_n, matmul_silu_mul, rope_kv_write) */
#define BACKEND_MODULE_INIT "pagoda_backend_module_init"

struct backend_host {
  int abi_version;        /* BACKEND_ABI_VERSION */
  size_t ops_size;        /* sizeof(struct backend_ops) */
  int (*err_vset)(const char *file, int line, const char *fmt, va_list ap);
  void (*log_vmsg)(enum log_level level, const char *fmt, va_list ap);
  enum log_level (*log_get_level)(void);
};

struct backend_module {
  int abi_version;        /* BACKEND_ABI_VERSION */
  size_t ops_size;        /* sizeof(struct backend_ops) */
  const char *name;       /* "cuda" */
  /* 1 if a usable device is present; 0 with the reason in err_last() (no driver, driver too
   * old for the runtime, no device, compute capability too low). */
  int (*available)(void);
  struct backend *(*create)(const struct backend_params *p);
};

/* The module's entry point: NULL with err_last() set when HOST does not match the module. */
typedef const struct backend_module *(*backend_module_init_fn)(const struct backend_host *host);

#endif
