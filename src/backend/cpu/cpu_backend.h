/* cpu_backend.h - the CPU backend's state and the ops its .c files share (internal). */
#ifndef PAGODA_CPU_BACKEND_H
#define PAGODA_CPU_BACKEND_H

#include "backend/backend.h"

/* Largest head_dim the attention kernel accepts (its accumulator lives on the stack). */
#define CPU_MAX_HEAD_DIM 512

struct cpu_backend {
  struct backend base;  /* base.num_threads: OpenMP threads of every parallel op (>= 1) */
  void **owned;         /* (num_owned) weight copies this backend made (unaligned host data) */
  int num_owned, cap_owned;
  struct cpu_comm *comm; /* tensor-parallel group (cpu_comm.c), or NULL */
  int comm_rank;
  struct rdv *rdv;       /* multi-process group (cpu_comm_attach_rdv), or NULL; borrowed */
};

/* In-process collectives (cpu_comm.c): ranks are threads; see backend.h's ops of these names. */
int cpu_comm_id(struct backend *be, void *id);
int cpu_comm_init(struct backend *be, const void *id, int rank, int world);
int cpu_all_reduce_sum(struct backend *be, void *x, size_t n);
int cpu_gather_cols(struct backend *be, float *out, const float *in, float *scratch, int rows, int cols);
void cpu_comm_free(struct backend *be);
/* Multi-process mode (docs/distributed.md): ranks are processes joined by the rendezvous R; from
 * now on all_reduce_sum is rdv_all_reduce_sum over R's sockets (the same rank-order sum as the
 * in-process group, bitwise). R stays the caller's and must outlive the backend's collectives. */
int cpu_comm_attach_rdv(struct backend *be, struct rdv *r);
/* Multi-process mode: rdv_abort (collectives blocked on a lost rank return -1). In-process: nothing
 * (the ranks are threads of one process that fail together). */
void cpu_comm_abort(struct backend *be);

/* Threads for a parallel op of about WORK multiply-adds (or element updates): one per
 * CPU_WORK_PER_THREAD of work, at least 1 and at most be->num_threads. A fork/join costs tens of
 * microseconds (more on a busy machine, where a descheduled thread stalls the whole team), so
 * small ops (every decode op of a tiny model such as stories260K) run on the calling thread
 * alone. With the default thread count (--threads 0), OpenMP's dynamic adjustment is on as well:
 * a team has at most as many threads as cores not busy with other work (by the load average). */
#define CPU_WORK_PER_THREAD (1 << 20)
static inline int cpu_threads_for(const struct backend *be, int64_t work) {
  int64_t n = work / CPU_WORK_PER_THREAD;
  return n < 1 ? 1 : n > be->num_threads ? be->num_threads : (int)n;
}

/* Element i of a 1-D weight (F32/F16/BF16) as f32; biases and norm weights. */
float cpu_weight_elem(const struct weight *w, int64_t i);

int cpu_matmul(struct backend *be, void *out, const void *x, const struct weight *w,
               const struct weight *bias, int T, int out_f32);
int cpu_attention(struct backend *be, void *out, const void *q, const struct kv_layer *kv,
                  const struct batch *b, const struct attn_params *ap);

int cpu_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T);
int cpu_rmsnorm(struct backend *be, void *out, void *residual, const void *x, const struct weight *w,
                int T, int dim, float eps);
int cpu_rope(struct backend *be, void *q, void *k, const int32_t *positions, int T, int n_heads,
             int n_kv_heads, int head_dim, const struct rope_params *rp);
int cpu_silu_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F);
int cpu_kv_write(struct backend *be, const struct kv_layer *kv, const void *k, const void *v,
                 const struct batch *b);
int cpu_gather_rows(struct backend *be, void *out, const void *x, const int32_t *idx, int n, int dim);
int cpu_copy_blocks(struct backend *be, struct kv_layer *layers, int n_layers, const int32_t *src,
                    const int32_t *dst, int n);

/* Fused ops (cpu_fused.c): the sequences of separate ops they stand for (backend.h). */
int cpu_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                 const struct weight *const ws[], const struct weight *const biases[], int T);
int cpu_matmul_qkv_rope(struct backend *be, void *q, void *k, void *v, const void *x, const struct backend_prenorm *pre,
                        const struct weight *const ws[3], const struct weight *const biases[3], const struct kv_layer *kv,
                        const struct batch *b, int n_heads, const struct rope_params *rp);
int cpu_matmul_add(struct backend *be, void *resid, const void *x, const struct weight *w, void *scratch, int T);
int cpu_all_reduce_add(struct backend *be, void *resid, void *x, size_t n);
int cpu_rope_kv_write(struct backend *be, void *q, void *k, const void *v, const struct kv_layer *kv,
                      const struct batch *b, int n_heads, const struct rope_params *rp);

/* Gemma 2 / Mixtral ops (cpu_act.c, cpu_moe.c). */
#define CPU_MOE_MAX_EXPERTS 256
int cpu_gelu_tanh_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F);
int cpu_scale(struct backend *be, void *x, size_t n, float s);
int cpu_softcap(struct backend *be, float *logits, int n, int vocab, float cap);
int cpu_moe_route(struct backend *be, const float *router_logits, int T, int E, int k, int32_t *row_token,
                  float *row_weight, int32_t *token_rows, int32_t *expert_start, int32_t *expert_start_host);
int cpu_moe_combine(struct backend *be, void *out, const void *y, const int32_t *token_rows,
                    const float *row_weight, int T, int k, int D);

#endif
