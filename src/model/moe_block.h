/* moe_block.h - the sparse mixture-of-experts feed-forward block (Mixtral), built on backend ops:
 * router GEMM, moe_route (top-k, renormalised softmax, rows grouped by expert), one gather of the
 * tokens' rows, then per expert ONE gated-MLP pass (three GEMMs through backend matmul, so
 * quantized expert weights take the existing quantized path) over all the rows routed to it,
 * and moe_combine (the weighted sum back into token order). No loop over tokens on the host.
 *
 * Invariants: every expert weight has the same shape and dtype family as a dense MLP's
 * (gate/up: (F, D), down: (D, F)); the scratch buffers hold T_max * top_k rows; the host reads
 * E + 1 counts per call (moe_route synchronises once per layer). */
#ifndef PAGODA_MOE_BLOCK_H
#define PAGODA_MOE_BLOCK_H

#include "backend/backend.h"

#define MOE_MAX_EXPERTS 256 /* backend moe_route's bound */
#define MOE_MAX_TOP_K 8     /* the CUDA routing kernel's bound on experts per token */

struct moe_weights {
  int n_experts, top_k;
  struct weight router;                 /* (n_experts, D) */
  struct weight *gate, *up, *down;      /* (n_experts) each: (F, D), (F, D), (D, F) */
};

/* Scratch for up to max_tokens tokens (backend memory unless marked host); see moe_scratch_alloc. */
struct moe_scratch {
  int max_tokens, n_experts, top_k, D, F;
  float *router_logits;       /* (T, E) F32 */
  int32_t *row_token;         /* (T * k) */
  float *row_weight;          /* (T * k) F32 */
  int32_t *token_rows;        /* (T, k) */
  int32_t *expert_start;      /* (E + 1) */
  int32_t *expert_start_host; /* (E + 1) host */
  void *xg;                   /* (T * k, D) act: the input rows grouped by expert */
  void *g, *u;                /* (T * k, F) act */
  void *y;                    /* (T * k, D) act: the experts' outputs by row */
};

/* Bytes of backend memory the scratch takes for these sizes (each part 256-byte aligned), and
 * carving it from BASE (backend memory of that many bytes, e.g. a model's workspace);
 * expert_start_host (E + 1 int32, host) is the caller's. Owned by the caller: no free. */
size_t moe_scratch_bytes(const struct backend *be, int max_tokens, int n_experts, int top_k, int D, int F);
void moe_scratch_carve(const struct backend *be, struct moe_scratch *s, void *base, int max_tokens,
                       int n_experts, int top_k, int D, int F, int32_t *expert_start_host);
/* Allocates the scratch on BE; 0, or -1 with err_last() set (what was allocated is freed). */
int moe_scratch_alloc(struct backend *be, struct moe_scratch *s, int max_tokens, int n_experts, int top_k,
                      int D, int F);
void moe_scratch_free(struct backend *be, struct moe_scratch *s);

/* out(T, D) = MoE(x(T, D)) with SiLU-gated experts; T <= s->max_tokens. out must not alias x. */
int moe_ffn(struct backend *be, void *out, const void *x, const struct moe_weights *mw,
            const struct moe_scratch *s, int T);

#endif
