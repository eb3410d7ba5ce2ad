/* cuda_backend.h - internals shared by the CUDA backend's .cu files: the backend struct, the
 * checked-call macros and the kernel launchers (C++, included only from src/backend/cuda). */
#ifndef PAGODA_CUDA_BACKEND_H
#define PAGODA_CUDA_BACKEND_H

/* System headers first, outside extern "C": glibc's C++ overloads must keep C++ linkage. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
#include "util/dtype.h"
#include "util/log.h"
}

/* Every CUDA runtime call goes through CUDA_CHECK, every cuBLAS call through CUBLAS_CHECK: on
 * failure they record "file:line: CUDA error ..." with the failing expression and return -1
 * from the calling function. Kernel launches are followed by CUDA_CHECK(cudaGetLastError()). */
#define CUDA_CHECK(call)                                                                        \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess)                                                                      \
      return ERR("CUDA error %s (%s) in %s", cudaGetErrorName(e_), cudaGetErrorString(e_), #call); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                      \
  do {                                                                                          \
    cublasStatus_t s_ = (call);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                            \
      return ERR("cuBLAS error %s in %s", cublasGetStatusString(s_), #call);                    \
  } while (0)

#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* One slot of the asynchronous steps (see cuda_backend.async). */
struct cuda_async_slot {
  int32_t *tokens_dev, *tokens_host;
  void *stage_dev, *stage_host;
  cudaEvent_t done;
};

/* The peer all-reduce's bounds (cuda_allreduce.cu): ranks, blocks per kernel (below the SM count:
 * all resident), bytes of one staging buffer (two per GPU), so the largest all-reduce it takes. */
#define PEER_AR_MAX_RANKS 8
#define PEER_AR_MAX_BLOCKS 64
#define PEER_AR_STAGE_BYTES (8u << 20)

struct cuda_backend {
  struct backend base;
  int device;
  cudaStream_t stream;       /* every op of a step runs on this one stream */
  cublasHandle_t blas;
  void *blas_ws;             /* (blas_ws_bytes) cuBLAS workspace, given once so it never allocates */
  size_t blas_ws_bytes;
  /* sampling staging, sized for sample_cap rows at start-up */
  int sample_cap;
  struct backend_sample_params *sample_params_dev; /* (sample_cap) */
  int32_t *sample_tokens_dev;                      /* (sample_cap) */
  struct backend_sample_params *sample_params_host; /* (sample_cap) pinned */
  int32_t *sample_tokens_host;                      /* (sample_cap) pinned */
  float *lp_out_dev, *lp_out_host;                  /* (sample_cap) logprob_rows results */
  int32_t *sample_rows_dev, *sample_rows_host;      /* (sample_cap) sample_rows' row of each entry */
  /* topk_rows staging (rows and targets up; ids, values and target values down), grown on demand
   * (doubling) to the largest call seen; the stash of stash_rows, grown the same way. Freed by
   * cuda_sample_free. */
  void *topk_dev, *topk_host;
  size_t topk_bytes;
  float *stash;
  size_t stash_floats;
  /* logits-processor staging (cuda_op_process): entries then bias values, grown on demand to the
   * largest step seen (doubling); pinned host side so the copy up is one async transfer */
  void *proc_dev, *proc_host;
  size_t proc_bytes;
  /* asynchronous steps (cuda_sample.cu; backend_ops.sample_async): per slot (the step's parity)
   * the device ids that resolve_ids reads, their pinned copy, the staging of parameters and rows
   * (params then rows, one copy up), and the event behind the copy down; sample_cap entries each,
   * allocated with the sampling staging. proc_half: which half of proc_host the next process call
   * fills (the halves alternate, so step N + 1 never rewrites what step N's copy may still read). */
  struct cuda_async_slot async[2];
  int proc_half;
  /* PAGODA_STEP_TIMING=1 (diagnostics, cuda_sample.cu): GPU timestamps of each asynchronous step,
   * from its batch copy up (cuda_upload) to its ids' copy down (sample_async), in a ring of 4;
   * sample_wait adds up the busy time of each step and the idle time before it (the GPU waiting
   * for the host), logged when the backend is destroyed. The first 16 steps (warm-up, graph
   * capture) are left out. */
  int step_timing, st_have_start;
  cudaEvent_t st_start[4], st_end[4];
  long long st_steps, st_slot_step[2], st_n;
  double st_busy_ms, st_idle_ms, st_idle_max_ms;
  /* CUDA graphs (cuda_graph.cu): one per key, captured on the key's second run */
  int graphs_on;             /* 0 when PAGODA_CUDA_GRAPHS=0, or after comm_abort */
  int comm_aborted;          /* comm_abort ran: all_reduce_sum fails from then on */
  struct cuda_graph_entry *graphs;
  int num_graphs, graphs_cap;
  char name[256];            /* device name, for logs */
  /* quantized weights (cuda_quant_*.cu): bf16 slab scratch for T > qgemv_max_t, sized at load;
   * the integer-dot GEMV keeps its int8 activations (cuda_quant_x8_bytes) here too */
  void *deq_scratch;
  size_t deq_scratch_bytes;
  int qgemv_max_t;           /* T up to this takes the fused GEMV (CUDA_QGEMV_MAX_T; env override) */
  /* split-K decode attention (cuda_attn_decode.cu): scratch allocated outside any capture, at the
   * largest size for the reserved bounds (cuda_attention_reserve) or the first call's; it starts
   * with attn_cnt_n int counters (attn_cnt_bytes with padding; zeroed at allocation, 0 between
   * launches), then the partials */
  void *attn_scratch;
  size_t attn_scratch_bytes, attn_cnt_bytes;
  int attn_cnt_n;
  int attn_fold;             /* the last partition block of a (sequence, KV head) combines the partials
                              * (no reduce kernel); 0 when PAGODA_ATTN_FOLD=0 (read at create) */
  int attn_reserve_seqs, attn_reserve_ctx;
  int attn_sized_for[5];     /* (seqs, 0, heads, kv heads, 2 * head_dim + f8) the scratch was sized for */
  int num_sms;               /* multiprocessors (0 until first asked) */
  int smem_optin;            /* the most dynamic shared memory a block may opt in to, bytes (set at init) */
  int gemv_max_t;            /* bf16 weights: T up to this takes cuda_gemv_bf16 (CUDA_GEMV_MAX_T; env) */
  int fused_ops;             /* 0 when PAGODA_FUSED_OPS=0: matmul_n, matmul_silu_mul, rope_kv_write (and through
                              * fused_norm / fused_rope the prenorm forms, matmul_add, matmul_qkv_rope) answer 1 */
  int fused_silu;            /* 0 when PAGODA_FUSED_SILU=0: only matmul_silu_mul answers 1 */
  int fused_norm;            /* 0 when PAGODA_FUSED_NORM=0 (or PAGODA_FUSED_OPS=0): the prenorm forms of
                              * matmul_n / matmul_silu_mul and matmul_add answer 1 (cuda_gemv.cu, and
                              * cuda_quant_gemv.cu for quantized weights) */
  int fused_rope;            /* 0 when PAGODA_FUSED_ROPE=0 (or PAGODA_FUSED_OPS=0): matmul_qkv_rope answers 1
                              * (the model runs matmul_n and rope_kv_write instead) */
  int gemv_pre_max_k;        /* > 0: the bf16 prenorm forms answer 1 for rows longer than this
                              * (PAGODA_GEMV_PRE_MAX_K; 0, the default: no limit but the shared memory's) */
  int gemv_split;            /* 0 when PAGODA_GEMV_SPLIT=0: one warp per weight row always (cuda_gemv.cu,
                              * gemv_split; the same bits either way) */
  int gemv_pre_split;        /* 0 when PAGODA_GEMV_PRE_SPLIT=0: the prenorm GEMVs keep one warp per row group
                              * (gemv_pre_split; the plain GEMVs still split; the same bits either way) */
  int rope_kv_split;         /* 1 (CUDA_ROPE_KV_SPLIT; PAGODA_ROPE_KV_SPLIT=0|1): rope_kv_write gives a token
                              * several blocks (one per 256 (head, pair) items, T * blocks at most
                              * cuda_sm_count), not one (cuda_ops.cu; the same bits either way) */
  int gemv_reg;              /* 1 (CUDA_GEMV_REG; PAGODA_GEMV_REG=0|1): the plain bf16 GEMVs load their first
                              * four weight steps into registers before pdl_wait; 0: prefetch into L2
                              * (cuda_gemv.cu, gemv_rows; the same bits either way) */
  int qx_early;              /* 1 (CUDA_QX_EARLY; PAGODA_QX_EARLY=0|1): the x quantization of the
                              * integer-dot GEMV lets that GEMV launch before its own wait, so the GEMV's
                              * weight loads overlap the tail of the kernel before (cuda_quant_gemv.cu) */
  int epi_early;             /* 1 (CUDA_EPI_EARLY; PAGODA_EPI_EARLY=0|1): a GEMV reads what its epilogue needs
                              * right after its wait, not after the reduction: matmul_add its residual
                              * (cuda_gemv.cu, gemv_res_load), matmul_qkv_rope its biases, angles and
                              * slots (cuda_qkv_rope.cuh, qkv_rope_load); the same bits either way */
  int attn_prefetch;         /* CUDA_ATTN_PREFETCH (PAGODA_ATTN_PREFETCH=n <= 65535, 0 off): the decode
                              * attention kernel looks up its keys and prefetches the K/V rows of its
                              * partition's first n keys into L2 before its wait (cuda_pdl.cuh rule 3;
                              * cuda_attn_decode.cu, dec_prefetch_kv; the same bits either way). 64 =
                              * every warp's first step: whole partitions would overflow L2 at large
                              * batches */
  int attn_exit_early;       /* 1 (CUDA_ATTN_EXIT_EARLY; PAGODA_ATTN_EXIT_EARLY=0|1): with attn_prefetch, a decode
                              * attention block whose partition has no keys exits before its wait, not after
                              * (cuda_attn_decode.cu; the same bits either way) */
  int attn_kv_early;         /* 1 (CUDA_ATTN_KV_EARLY; PAGODA_ATTN_KV_EARLY=0|1): with attn_prefetch, the decode
                              * attention kernel (bf16 operands, head_dim <= 128) loads each warp's first 16 keys'
                              * K/V rows into registers before its wait, all but this step's keys, which it loads
                              * after (cuda_pdl.cuh rule 3; the same bits either way) */
  int attn_cluster;          /* CUDA_ATTN_CLUSTER (PAGODA_ATTN_CLUSTER=0 or 2..16): the decode attention kernel's
                              * partition blocks of a (sequence, KV head) form thread block clusters of this many,
                              * and a sequence split in at most that many partitions is combined through
                              * distributed shared memory (cuda_attn_decode.cu, dec_cfold; the same bits); 0 off,
                              * and off below compute capability 9.0 */
  int attn_early;            /* PAGODA_ATTN_EARLY=1 (CUDA_ATTN_EARLY: 0): decode attention lets the next kernel
                              * (the o projection; not with the separate split-K reduce) launch before its
                              * own wait (cuda_pdl.cuh, pdl_enter) */
  int qg_evict_first;        /* 1 (CUDA_QG_EVICT_FIRST; PAGODA_QG_EVICT_FIRST=0|1): the integer-dot GEMV's weight
                              * copies carry L2's evict-first policy (read once per step; cuda_quant_gemv.cu;
                              * the same bits either way) */
  int gemv_pre_rows;         /* warps per block of the prenorm GEMVs: 4, 8 or 16 (CUDA_GEMV_PRE_ROWS;
                              * PAGODA_GEMV_PRE_ROWS) */
  int gemv_pre_loop;         /* weight rows (or gate/up pairs) per warp of the prenorm GEMVs: 1, 2 or 4
                              * (CUDA_GEMV_PRE_LOOP; PAGODA_GEMV_PRE_LOOP) */
  int gemv_pre_l2;           /* 0 (CUDA_GEMV_PRE_L2, the default): the prenorm GEMVs load their first weight
                              * steps into registers, live across the prologue; 1 (PAGODA_GEMV_PRE_L2=1):
                              * they prefetch them into L2 */
  int gemv_ring;             /* 1 (CUDA_GEMV_RING; PAGODA_GEMV_RING=0|1): bf16 matmul_add, matmul_silu_mul and
                              * matmul_qkv_rope at T = 1 take the ring GEMV, one block per multiprocessor
                              * (cuda_gemv.cu, gemv_ring_kernel; the same bits either way) */
  int gemv_ring_kb;          /* the ring GEMV's weight ring per block, KiB (CUDA_GEMV_RING_KB;
                              * PAGODA_GEMV_RING_KB, 32..192) */
  int gemv_ring_min_k;       /* the ring GEMV only for rows of at least this many columns (PAGODA_GEMV_RING_MIN_K;
                              * CUDA_GEMV_RING_MIN_K) */
  int gemv_ring_late;        /* CUDA_GEMV_RING_LATE (PAGODA_GEMV_RING_LATE=0|1): the ring GEMV triggers the next
                              * kernel once each warp's last chunk is in flight (1) or right after its wait (0) */
  int gemv_ring_pre_ahead;   /* chunks per warp a prenorm ring GEMV (q/k/v, gate/up) requests before its wait, the
                              * rest once its prologue's loads of x are in flight (PAGODA_GEMV_RING_PRE_AHEAD=1..8;
                              * 0, the default: half its ring, CUDA_GEMV_RING_PRE_AHEAD) */
  int gemv_ring_store;       /* 1 (CUDA_GEMV_RING_STORE; PAGODA_GEMV_RING_STORE=0|1): with gemv_ring, the plain bf16
                              * matmul at T = 1 (the output head; o and down under tensor parallelism) takes the
                              * ring GEMV too (RING_STORE; the same bits) */
  int qgemv_ring;            /* 1 (CUDA_QGEMV_RING; PAGODA_QGEMV_RING=0|1): the integer-dot matmul_add,
                              * matmul_silu_mul and matmul_qkv_rope at T = 1 take the integer-dot ring GEMV, one
                              * block per multiprocessor quantizing x itself (cuda_quant_gemv.cu,
                              * qgemv_ring_kernel; ring size and trigger as gemv_ring_kb / _late; same bits) */
  int qgemv_ring_warps;      /* its warps per block, 8 or 16 (CUDA_QGEMV_RING_WARPS; PAGODA_QGEMV_RING_WARPS) */
  int qgemv_ring_cv;         /* its values per chunk, 1024 or 2048 (CUDA_QGEMV_RING_CHUNK; PAGODA_QGEMV_RING_CHUNK;
                              * Q6_K always 2048) */
  int pdl;                   /* programmatic dependent launch (cuda_pdl.cuh): compute capability >= 9.0
                              * and PAGODA_PDL not 0 */
  void *nccl_comm;           /* ncclComm_t of tensor parallelism (cuda_nccl.cu), or NULL */
  int nccl_rank, nccl_world; /* this backend's place in it (set by cuda_comm_init) */
  /* single-process tensor parallelism's peer all-reduce (cuda_allreduce.cu); max_bytes 0: off */
  struct {
    void *stage;               /* this GPU's staging: 2 x PEER_AR_STAGE_BYTES */
    uint32_t *flags, *counter; /* flags [2][PEER_AR_MAX_BLOCKS][PEER_AR_MAX_RANKS], then the sequence number and
                                * the blocks-done count */
    void *peer_stage[PEER_AR_MAX_RANKS]; /* every rank's stage and flags, its own included */
    uint32_t *peer_flags[PEER_AR_MAX_RANKS];
    int rank, world;
    size_t max_bytes;          /* all-reduces of at most this many bytes take the peer kernel */
    struct cuda_backend *ids_src; /* ranks > 0: rank 0's backend, whose sampled ids resolve_ids reads */
  } peer_ar;
  int preload_on;            /* 1 unless PAGODA_CUDA_PRELOAD=0 (read at create) */
  struct cuda_preload *preload; /* the kernel-preloading thread while it may run (cuda_preload.cu), or NULL */
  const char *preload_skip;  /* why no thread was started (cuda_preload_start), for the start-up line */
};


/* Kernel preloading under lazy loading (cuda_preload.cu says why and when). Every .cu file of the
 * backend that defines kernels ends with CUDA_PRELOAD_ANCHOR(its name) and is named in
 * CUDA_PRELOAD_MODULES: a file missing from the list only loads its kernels on first use. The
 * anchor is an empty kernel, by which the preloading thread finds the file's module. */
#define CUDA_PRELOAD_MODULES(X)                                                                     \
  X(allreduce) X(attention) X(attn_decode) X(attn_prefill) X(attn_wgmma) X(gemv) X(moe_act) X(nccl) \
  X(ops) X(quant_gemm) X(quant_gemv) X(sample)
#define CUDA_PRELOAD_ANCHOR(name)                                \
  static __global__ void cuda_preload_anchor_kernel(void) {}     \
  extern "C" const void *cuda_preload_anchor_##name(void) {      \
    return (const void *)cuda_preload_anchor_kernel;              \
  }
/* 1: the context loads kernels lazily; 0: eagerly; -1: unknown (a build with a toolkit before CUDA
 * 12.5, or a driver that cannot say). */
extern "C" int cuda_loading_lazy(void);
/* Starts the preloading thread (end of cuda_init) when loading is lazy, cb->preload_on and the
 * driver has what it needs; returns NULL when it started, else why not (plain words).
 * cuda_preload_join waits for it (cuda_reserve, cuda_destroy; a no-op when none runs). */
extern "C" const char *cuda_preload_start(struct cuda_backend *cb);
extern "C" void cuda_preload_join(struct cuda_backend *cb);

/* The module's two entry points (cuda_module.c hands them to the host): see struct backend_module. */
extern "C" int cuda_backend_available(void);
extern "C" struct backend *cuda_backend_create(const struct backend_params *p);

static inline struct cuda_backend *cuda_be(struct backend *be) { return (struct cuda_backend *)be; }
/* The device's multiprocessors (cb->num_sms, asked once); -1 with the error set if CUDA fails. */
int cuda_sm_count(struct cuda_backend *cb);
/* Lets the kernel FN take up to CUDA_SMEM_OPTIN_MAX (220 KiB) of dynamic shared memory, or the
 * device's cb->smem_optin where that is less, with the largest shared-memory carveout, on cb's
 * device, once per device: OPTED is the kernel's own bit set (bit d: done on
 * device d; tensor-parallel ranks may race to set it, hence atomics). */
cudaError_t cuda_smem_opt_in(const struct cuda_backend *cb, const void *fn, unsigned long long *opted);

/* Launchers (cuda_ops.cu, cuda_attention.cu, cuda_sample.cu): each checks its arguments,
 * enqueues its kernels on the backend's stream and returns 0 or -1 with err_last() set. */
int cuda_op_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T);
int cuda_op_rmsnorm(struct backend *be, void *out, void *residual, const void *x, const struct weight *w,
                    int T, int dim, float eps);
int cuda_op_rope(struct backend *be, void *q, void *k, const int32_t *positions, int T, int n_heads,
                 int n_kv_heads, int head_dim, const struct rope_params *rp);
int cuda_op_silu_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F);
int cuda_op_kv_write(struct backend *be, const struct kv_layer *kv, const void *k, const void *v,
                     const struct batch *b);
int cuda_op_gather_rows(struct backend *be, void *out, const void *x, const int32_t *idx, int n, int dim);
int cuda_op_add_bias(struct backend *be, void *out, int out_f32, const struct weight *bias, int T);
int cuda_op_attention(struct backend *be, void *out, const void *q, const struct kv_layer *kv,
                      const struct batch *b, const struct attn_params *ap);
/* Sizes the decode attention's split-K scratch for up to MAX_SEQS sequences (MAX_CTX is kept
 * but the size does not depend on it: the partitions per sequence are bounded by the SM count);
 * the allocation happens on the next attention call outside a CUDA-graph capture (the
 * profiling step), so a captured step never allocates. Bounds only grow. */
extern "C" int cuda_attention_reserve(struct backend *be, int max_seqs, int max_ctx);
/* The context bound under which decode attention combines every sequence's partitions in one
 * thread block cluster (backend_caps.graph_short_ctx; 0 without clusters). */
int cuda_attn_graph_short_ctx(const struct cuda_backend *cb);
int cuda_op_sample(struct backend *be, int32_t *tokens, const float *logits, int n, int vocab,
                   const struct backend_sample_params *params);
/* Gemma 2 / Mixtral ops (cuda_moe_act.cu). */
int cuda_op_gelu_tanh_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F);
int cuda_op_scale(struct backend *be, void *x, size_t n, float s);
int cuda_op_softcap(struct backend *be, float *logits, int n, int vocab, float cap);
int cuda_op_moe_route(struct backend *be, const float *router_logits, int T, int E, int k, int32_t *row_token,
                      float *row_weight, int32_t *token_rows, int32_t *expert_start, int32_t *expert_start_host);
int cuda_op_moe_combine(struct backend *be, void *out, const void *y, const int32_t *token_rows,
                        const float *row_weight, int T, int k, int D);
/* Tensor parallelism over NCCL (cuda_nccl.cu; only when the build found NCCL): see the ops of
 * the same names in backend.h. cuda_comm_free runs from cuda_destroy. */
#ifdef PAGODA_HAVE_NCCL
int cuda_comm_id(struct backend *be, void *id);
int cuda_comm_init(struct backend *be, const void *id, int rank, int world);
int cuda_all_reduce_sum(struct backend *be, void *x, size_t n);
int cuda_comm_check(struct backend *be);
void cuda_comm_abort(struct backend *be);
int cuda_gather_cols(struct backend *be, float *out, const float *in, float *scratch, int rows, int cols);
#endif
void cuda_comm_free(struct cuda_backend *cb);
/* The peer all-reduce (cuda_allreduce.cu; ops peer_ar_alloc / peer_ar_connect of backend.h).
 * cuda_peer_ar_usable: whether all_reduce_sum of N act elements at X takes it. */
int cuda_peer_ar_alloc(struct backend *be, int world);
int cuda_peer_ar_connect(struct backend *be, struct backend *const *group, int rank, int world, size_t max_bytes);
int cuda_peer_ar_usable(const struct cuda_backend *cb, const void *x, size_t n);
int cuda_peer_all_reduce(struct cuda_backend *cb, void *x, size_t n);
void cuda_peer_ar_free(struct cuda_backend *cb);
struct cuda_graph_entry;
int cuda_graph_run(struct backend *be, int key, int (*record)(void *ctx), void *ctx);
void cuda_graph_free_all(struct cuda_backend *cb);
int cuda_op_logprob_rows(struct backend *be, float *out, const float *logits, int n, int vocab,
                         const int32_t *targets);
int cuda_op_process(struct backend *be, float *logits, int vocab, const struct backend_proc_entry *entries, int n,
                    const float *bias, int num_bias);
int cuda_op_sample_rows(struct backend *be, int32_t *tokens, const float *logits, const int32_t *rows, int n,
                        int vocab, const struct backend_sample_params *params);
int cuda_op_stash_rows(struct backend *be, const float *logits, int vocab, const int32_t *rows, int n);
int cuda_op_topk_rows(struct backend *be, int32_t *ids, float *lps, float *tlp, const float *logits, int vocab,
                      const int32_t *rows, const int32_t *targets, int n, int k);
/* Frees the topk staging and the stash (cuda_sample.cu). */
void cuda_sample_free(struct cuda_backend *cb);
/* Asynchronous steps (cuda_sample.cu): the two slots for ROWS entries each (freed first), and
 * their release; and the three ops of the same names in backend.h. */
int cuda_async_alloc(struct cuda_backend *cb, int rows);
void cuda_async_free(struct cuda_backend *cb);
int cuda_op_sample_async(struct backend *be, int slot, const float *logits, const int32_t *rows, int n, int vocab,
                         const struct backend_sample_params *params);
int cuda_op_sample_wait(struct backend *be, int slot, int32_t *tokens, int n);
int cuda_op_resolve_ids(struct backend *be, int32_t *ids, int T, int stride);
/* PAGODA_STEP_TIMING: marks the start of a step's GPU work (before its batch copy up); logs the
 * totals (cuda_destroy). */
void cuda_step_timing_start(struct cuda_backend *cb);
void cuda_step_timing_report(struct cuda_backend *cb);

/* bf16 GEMV for decode-sized T (cuda_gemv.cu): T <= gemv_max_t (CUDA_GEMV_MAX_T unless
 * PAGODA_GEMV_MAX_T says otherwise; 0 = always cuBLAS) and K a multiple of 8. */
#define CUDA_GEMV_MAX_T 8
int cuda_gemv_bf16(struct backend *be, void *out, const void *x, const struct weight *w, int T, int out_f32);
/* The prenorm GEMVs (struct backend_prenorm; cuda_gemv.cu): x's T rows, normalized, are kept in
 * shared memory, so they take T * K * 2 <= CUDA_GEMV_PRE_SMEM bytes (T <= 8 at K = 2048, T <= 4
 * at K = 4096; more answers 1: the separate rmsnorm first). Each block normalizes for itself:
 * CUDA_GEMV_PRE_ROWS warps per block and CUDA_GEMV_PRE_LOOP rows per warp by default,
 * PAGODA_GEMV_PRE_ROWS=4|8|16, PAGODA_GEMV_PRE_LOOP=1|2|4 and PAGODA_GEMV_PRE_L2=0|1 (the first
 * weight steps into registers or L2 before the prologue; CUDA_GEMV_PRE_L2 by default: registers,
 * bench/RESULTS.md) for measuring. */
#define CUDA_GEMV_PRE_SMEM 32768
/* T up to which the prenorm kernels may split a row group over 2 warps (gemv_pre_split; T = 1, 2:
 * decode of one or two sequences, where q/k/v have too few rows to fill the GPU). */
#define CUDA_GEMV_PRE_SPLIT_T 2
#define CUDA_GEMV_PRE_ROWS 8
#define CUDA_GEMV_PRE_ROWS_MAX 16
#define CUDA_GEMV_PRE_LOOP 1
#define CUDA_GEMV_PRE_L2 0
#define CUDA_GEMV_REG 1
#define CUDA_EPI_EARLY 1
#define CUDA_ATTN_PREFETCH 64
#define CUDA_ATTN_EXIT_EARLY 1
#define CUDA_ATTN_KV_EARLY 1
#define CUDA_ATTN_CLUSTER 16
#define CUDA_QG_EVICT_FIRST 1
#define CUDA_QX_EARLY 1
#define CUDA_ATTN_EARLY 0
#define CUDA_ROPE_KV_SPLIT 1
#define CUDA_GEMV_RING 1
#define CUDA_GEMV_RING_KB 128
#define CUDA_GEMV_RING_LATE 1
#define CUDA_GEMV_RING_PRE_AHEAD 0 /* half the ring */
#define CUDA_GEMV_RING_MIN_K 0
#define CUDA_GEMV_RING_STORE 1
#define CUDA_SMEM_OPTIN_MAX (220 * 1024)
#define CUDA_QGEMV_RING 1
#define CUDA_QGEMV_RING_WARPS 16
#define CUDA_QGEMV_RING_CHUNK 2048
/* The matrices of one matmul_n grid (the bf16 GEMV in cuda_gemv.cu, the integer-dot kernel in
 * cuda_quant_gemv.cu): matrix i owns the grid rows [row0[i], row0[i + 1]) (entries past the
 * last matrix repeat the total); its bias (F32 or BF16, or NULL) is added after the product's
 * bf16 rounding. */
struct cuda_matmul_set {
  const void *W[BACKEND_MATMUL_N_MAX];
  void *out[BACKEND_MATMUL_N_MAX];
  const void *bias[BACKEND_MATMUL_N_MAX];
  int bias_f32[BACKEND_MATMUL_N_MAX];
  int N[BACKEND_MATMUL_N_MAX];
  int row0[BACKEND_MATMUL_N_MAX + 1];
};
/* Fills S from matmul_n's arguments. Returns the total rows; 0 when the set does not fit one
 * grid of at most MAX_ROWS rows or a bias is neither F32 nor BF16 (the caller answers 1: the
 * separate ops); -1 with the error set when a bias does not match its matrix. */
long long cuda_matmul_set_fill(struct cuda_matmul_set *s, int n, void *const outs[], const struct weight *const ws[],
                               const struct weight *const biases[], long long max_rows);
/* The fused ops of backend.h (cuda_gemv.cu, cuda_ops.cu): 1 (nothing enqueued) for what their
 * kernels do not cover (quantized or mixed weights, T > gemv_max_t, other KV dtypes; with a
 * prenorm also rows past CUDA_GEMV_PRE_SMEM, cb->fused_norm 0), and always
 * when cb->fused_ops is 0. */
int cuda_op_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                     const struct weight *const ws[],
                     const struct weight *const biases[], int T);
int cuda_op_matmul_silu_mul(struct backend *be, void *out, const void *x, const struct backend_prenorm *pre,
                            const struct weight *gate, const struct weight *up, int T);
/* resid += x @ W^T on the GEMV (backend.h matmul_add; quantized W: cuda_quant_matmul_add): 1 where
 * matmul would not take the GEMV (T > gemv_max_t, K not a multiple of 8) and when cb->fused_norm is 0. */
int cuda_op_matmul_add(struct backend *be, void *resid, const void *x, const struct weight *w, void *scratch, int T);
/* q/k/v, RoPE and the KV write in one kernel (backend.h matmul_qkv_rope; cuda_gemv.cu): 1 for what
 * it does not cover (besides matmul_n's cases: LongRoPE, an odd head_dim, other KV dtypes or block
 * sizes) and when cb->fused_rope is 0. */
int cuda_op_matmul_qkv_rope(struct backend *be, void *q, void *k, void *v, const void *x,
                            const struct backend_prenorm *pre, const struct weight *const ws[3],
                            const struct weight *const biases[3], const struct kv_layer *kv, const struct batch *b,
                            int n_heads, const struct rope_params *rp);
int cuda_op_rope_kv_write(struct backend *be, void *q, void *k, const void *v, const struct kv_layer *kv,
                          const struct batch *b, int n_heads, const struct rope_params *rp);

/* Quantized weights (GGUF block types, kept as uploaded): cuda_quant_gemm.cu, cuda_quant_gemv.cu.
 * cuda_quant_type maps a dtype to its kernel type (enum cq_type) or -1 when it is not quantized. */
#define CUDA_QGEMV_MAX_T 8                          /* rows one GEMV pass reads the weight for */
#define CUDA_DEQ_SCRATCH_BYTES ((size_t)128 << 20)  /* largest bf16 slab for the GEMM path */
int cuda_quant_type(enum dtype t);
int cuda_quant_block_values(int qt);
size_t cuda_quant_row_bytes(int qt, int64_t cols);
int cuda_quant_weight_upload(struct backend *be, struct weight *w, const void *host, enum dtype t,
                             int64_t rows, int64_t cols);
int cuda_quant_matmul(struct backend *be, void *out, const void *x, const struct weight *w, int T,
                      int out_f32);
int cuda_quant_gemv(struct backend *be, void *out, const void *x, const struct weight *w, int T,
                    int out_f32);
int cuda_quant_dequant_rows(struct backend *be, void *dst, const struct weight *w, int64_t r0, int nr);
int cuda_quant_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T);
/* Bytes of the int8 activations of T rows of K values (cuda_quant_gemv.cu; kept in deq_scratch). */
size_t cuda_quant_x8_bytes(int T, int64_t K);
/* matmul_n / matmul_silu_mul on quantized weights of one type (cuda_quant_gemv.cu): 0 done, 1 not
 * applicable (the caller goes on), -1 error; cuda_op_matmul_n / cuda_op_matmul_silu_mul call them first.
 * PRE (struct backend_prenorm, f32 or bf16 norm weight) is applied inside the quantization of x,
 * bit for bit as rmsnorm then the op; PRE->xn is left alone. */
int cuda_quant_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                        const struct weight *const ws[], const struct weight *const biases[], int T);
int cuda_quant_matmul_silu_mul(struct backend *be, void *out, const void *x, const struct backend_prenorm *pre,
                               const struct weight *gate, const struct weight *up, int T);
/* Whether the integer-dot GEMV takes the N quantized matrices WS (one type and K, a layout it
 * reads) at T rows: what the fused forms on quantized weights check first. */
int cuda_quant_fusable(struct cuda_backend *cb, const struct weight *const *ws, int n, int T);
/* matmul_qkv_rope (backend.h) on quantized q/k/v weights of one type: the integer-dot GEMV with the
 * epilogue of cuda_qkv_rope.cuh, whose struct gemv_rope R cuda_op_matmul_qkv_rope has filled and
 * checked (and which calls this first for quantized weights); 0 / 1 / -1 as cuda_quant_matmul_n. */
struct gemv_rope;
int cuda_quant_matmul_qkv_rope(struct backend *be, void *const outs[3], const void *x, const struct backend_prenorm *pre,
                               const struct weight *const ws[3], const struct weight *const biases[3],
                               const struct gemv_rope *r, int T);
/* matmul_add (backend.h) on a quantized weight, T <= CUDA_QGEMV_MAX_T: resid(T, w->rows) +=
 * x(T, w->cols) @ w^T, each product rounded to bf16 and added as rmsnorm_kernel's residual add
 * rounds it, in the GEMV's epilogue (bit for bit matmul + that add; no scratch). 0 / 1 / -1 as
 * cuda_quant_matmul_n; the matmul_add op calls it first for quantized weights. */
int cuda_quant_matmul_add(struct backend *be, void *resid, const void *x, const struct weight *w, int T);

/* Block sizes the paged kernels are compiled for; anything else is refused with this list. */
static inline int cuda_block_size_ok(int bs) { return bs == 8 || bs == 16 || bs == 32; }
#define CUDA_BLOCK_SIZES "8, 16 or 32"

#endif
