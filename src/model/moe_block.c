/* moe_block.c - the sparse MoE feed-forward block on backend ops (see moe_block.h). */
#include "model/moe_block.h"

#include <stdlib.h>
#include <string.h>

#include "util/dtype.h"
#include "util/log.h"

int moe_scratch_alloc(struct backend *be, struct moe_scratch *s, int max_tokens, int n_experts, int top_k,
                      int D, int F) {
  memset(s, 0, sizeof *s);
  if (max_tokens < 1 || n_experts < 1 || top_k < 1 || top_k > n_experts || D < 1 || F < 1)
    return ERR("moe: bad shape (%d tokens, %d experts, top %d, hidden %d, ffn %d)", max_tokens, n_experts,
               top_k, D, F);
  s->max_tokens = max_tokens;
  s->n_experts = n_experts;
  s->top_k = top_k;
  s->D = D;
  s->F = F;
  size_t rows = (size_t)max_tokens * top_k;
  size_t act = dtype_row_bytes(be->act_dtype, 1);
  const struct backend_ops *op = be->ops;
  if (!(s->router_logits = op->alloc(be, sizeof(float) * (size_t)max_tokens * n_experts)) ||
      !(s->row_token = op->alloc(be, sizeof(int32_t) * rows)) ||
      !(s->row_weight = op->alloc(be, sizeof(float) * rows)) ||
      !(s->token_rows = op->alloc(be, sizeof(int32_t) * rows)) ||
      !(s->expert_start = op->alloc(be, sizeof(int32_t) * (size_t)(n_experts + 1))) ||
      !(s->xg = op->alloc(be, act * rows * (size_t)D)) || !(s->g = op->alloc(be, act * rows * (size_t)F)) ||
      !(s->u = op->alloc(be, act * rows * (size_t)F)) || !(s->y = op->alloc(be, act * rows * (size_t)D))) {
    moe_scratch_free(be, s);
    return -1;
  }
  s->expert_start_host = malloc(sizeof(int32_t) * (size_t)(n_experts + 1));
  if (!s->expert_start_host) {
    moe_scratch_free(be, s);
    return ERR("out of memory");
  }
  return 0;
}

#define MOE_ALIGN 256

static size_t up_align(size_t n) { return (n + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN; }

/* The parts' sizes in carve order: router_logits, row_token, row_weight, token_rows,
 * expert_start, xg, g, u, y. */
static void part_sizes(const struct backend *be, size_t sz[9], int max_tokens, int n_experts, int top_k,
                       int D, int F) {
  size_t rows = (size_t)max_tokens * top_k, act = dtype_row_bytes(be->act_dtype, 1);
  sz[0] = sizeof(float) * (size_t)max_tokens * n_experts;
  sz[1] = sizeof(int32_t) * rows;
  sz[2] = sizeof(float) * rows;
  sz[3] = sizeof(int32_t) * rows;
  sz[4] = sizeof(int32_t) * (size_t)(n_experts + 1);
  sz[5] = act * rows * (size_t)D;
  sz[6] = sz[7] = act * rows * (size_t)F;
  sz[8] = act * rows * (size_t)D;
}

size_t moe_scratch_bytes(const struct backend *be, int max_tokens, int n_experts, int top_k, int D, int F) {
  size_t sz[9], total = 0;
  part_sizes(be, sz, max_tokens, n_experts, top_k, D, F);
  for (int i = 0; i < 9; i++)
    total += up_align(sz[i]);
  return total;
}

void moe_scratch_carve(const struct backend *be, struct moe_scratch *s, void *base, int max_tokens,
                       int n_experts, int top_k, int D, int F, int32_t *expert_start_host) {
  size_t sz[9];
  part_sizes(be, sz, max_tokens, n_experts, top_k, D, F);
  void **dst[9] = {(void **)&s->router_logits, (void **)&s->row_token, (void **)&s->row_weight,
                   (void **)&s->token_rows, (void **)&s->expert_start, &s->xg, &s->g, &s->u, &s->y};
  char *p = base;
  for (int i = 0; i < 9; i++) {
    *dst[i] = p;
    p += up_align(sz[i]);
  }
  s->max_tokens = max_tokens;
  s->n_experts = n_experts;
  s->top_k = top_k;
  s->D = D;
  s->F = F;
  s->expert_start_host = expert_start_host;
}

void moe_scratch_free(struct backend *be, struct moe_scratch *s) {
  void *dev[] = {s->router_logits, s->row_token, s->row_weight, s->token_rows, s->expert_start,
                 s->xg, s->g, s->u, s->y};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i])
      be->ops->free(be, dev[i]);
  free(s->expert_start_host);
  memset(s, 0, sizeof *s);
}

int moe_ffn(struct backend *be, void *out, const void *x, const struct moe_weights *mw,
            const struct moe_scratch *s, int T) {
  const struct backend_ops *op = be->ops;
  int E = mw->n_experts, k = mw->top_k, D = s->D, F = s->F;
  if (T < 0 || T > s->max_tokens || E != s->n_experts || k != s->top_k)
    return ERR("moe: %d tokens, %d experts, top %d for scratch of %d tokens, %d experts, top %d", T, E, k,
               s->max_tokens, s->n_experts, s->top_k);
  if (T == 0)
    return 0;
  size_t act = dtype_row_bytes(be->act_dtype, 1);
  if (op->matmul(be, s->router_logits, x, &mw->router, NULL, T, 1) ||
      op->moe_route(be, s->router_logits, T, E, k, s->row_token, s->row_weight, s->token_rows,
                    s->expert_start, s->expert_start_host) ||
      op->gather_rows(be, s->xg, x, s->row_token, T * k, D))
    return -1;
  for (int e = 0; e < E; e++) {
    int r0 = s->expert_start_host[e], n = s->expert_start_host[e + 1] - r0;
    if (n <= 0)
      continue;
    const char *xe = (const char *)s->xg + act * (size_t)r0 * D;
    char *ge = (char *)s->g + act * (size_t)r0 * F, *ue = (char *)s->u + act * (size_t)r0 * F;
    char *ye = (char *)s->y + act * (size_t)r0 * D;
    if (op->matmul(be, ge, xe, &mw->gate[e], NULL, n, 0) || op->matmul(be, ue, xe, &mw->up[e], NULL, n, 0) ||
        op->silu_mul(be, ge, ge, ue, n, F) || op->matmul(be, ye, ge, &mw->down[e], NULL, n, 0))
      return -1;
  }
  return op->moe_combine(be, out, s->y, s->token_rows, s->row_weight, T, k, D);
}
