/* blocks.c - attention block, gated MLP and the pre-norm decoder, on backend ops. */
#include "model/blocks.h"
#include "util/log.h"

#include <math.h>

int block_layer_window(const struct model_config *c, int l) {
  if (c->local_window > 0) /* Gemma 2: even layers local, odd layers global */
    return l % 2 == 0 ? c->local_window : 0;
  if (c->sliding_window <= 0 || l < c->swa_first_layer)
    return 0;
  if (c->swa_pattern > 0 && (l + 1) % c->swa_pattern == 0)
    return 0;
  return c->sliding_window;
}

int model_kv_window(const struct model_config *c) {
  for (int l = 0; l < c->n_layers; l++)
    if (block_layer_window(c, l) != c->sliding_window)
      return 0;
  return c->sliding_window;
}

size_t blocks_fused_cols(const struct model_config *c, const struct layer_weights *l0) {
  size_t qkv = l0->wqkv.data ? (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim : 0;
  size_t gu = l0->w_gate_up.data ? 2 * (size_t)c->ffn_dim : 0;
  return qkv > gu ? qkv : gu;
}

/* split_idx layout for M tokens: [q: M*n_heads][k: M*n_kv][v: M*n_kv] when wqkv, then
 * [gate: M][up: M] when w_gate_up. */
static size_t qkv_idx_count(const struct model_config *c, const struct layer_weights *l0, int M) {
  return l0->wqkv.data ? (size_t)M * (c->n_heads + 2 * c->n_kv_heads) : 0;
}

size_t blocks_split_idx_count(const struct model_config *c, const struct layer_weights *l0,
                              int max_tokens) {
  return qkv_idx_count(c, l0, max_tokens) + (l0->w_gate_up.data ? 2 * (size_t)max_tokens : 0);
}

void blocks_split_idx_fill(int32_t *idx, const struct model_config *c,
                           const struct layer_weights *l0, int max_tokens) {
  size_t n = 0;
  int M = max_tokens;
  if (l0->wqkv.data) {
    int nh = c->n_heads, nkv = c->n_kv_heads, per = nh + 2 * nkv;
    for (int t = 0; t < M; t++)
      for (int h = 0; h < nh; h++)
        idx[n++] = t * per + h;
    for (int t = 0; t < M; t++)
      for (int h = 0; h < nkv; h++)
        idx[n++] = t * per + nh + h;
    for (int t = 0; t < M; t++)
      for (int h = 0; h < nkv; h++)
        idx[n++] = t * per + nh + nkv + h;
  }
  if (l0->w_gate_up.data) {
    for (int t = 0; t < M; t++)
      idx[n++] = 2 * t;
    for (int t = 0; t < M; t++)
      idx[n++] = 2 * t + 1;
  }
}

/* The fused ops (backend.h, "Fused small ops") where the backend has them, else the separate
 * ops they stand for. */
static int blocks_matmul_n(const struct fwd *f, int n, void *const outs[], const void *x,
                           const struct weight *const ws[], const struct weight *const biases[]) {
  struct backend *be = f->be;
  int rc = be->ops->matmul_n ? be->ops->matmul_n(be, n, outs, x, ws, biases, f->T) : 1;
  if (rc != 1)
    return rc;
  for (int i = 0; i < n; i++)
    TRY(be->ops->matmul(be, outs[i], x, ws[i], biases[i], f->T, 0));
  return 0;
}

int block_attention(const struct fwd *f, int l, const struct attn_params *ap) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  const struct layer_weights *L = &f->layers[l];
  const int T = f->T, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
  if (L->wqkv.data) {
    const int32_t *qi = f->split_idx, *ki = qi + (size_t)f->max_tokens * nh,
                  *vi = ki + (size_t)f->max_tokens * nkv;
    TRY(op->matmul(be, f->fused, f->xb, &L->wqkv, NULL, T, 0));
    TRY(op->gather_rows(be, f->q, f->fused, qi, T * nh, hd));
    TRY(op->gather_rows(be, f->k, f->fused, ki, T * nkv, hd));
    TRY(op->gather_rows(be, f->v, f->fused, vi, T * nkv, hd));
  } else {
    void *const outs[3] = {f->q, f->k, f->v};
    const struct weight *const ws[3] = {&L->wq, &L->wk, &L->wv};
    const struct weight *const bs[3] = {L->bq.data ? &L->bq : NULL, L->bk.data ? &L->bk : NULL,
                                        L->bv.data ? &L->bv : NULL};
    TRY(blocks_matmul_n(f, 3, outs, f->xb, ws, bs));
  }
  if (L->q_norm.data) /* in place: rows of head_dim */
    TRY(op->rmsnorm(be, f->q, NULL, f->q, &L->q_norm, T * nh, hd, c->rms_eps));
  if (L->k_norm.data)
    TRY(op->rmsnorm(be, f->k, NULL, f->k, &L->k_norm, T * nkv, hd, c->rms_eps));
  int rc = op->rope_kv_write && f->kv[l].n_kv_heads == nkv && f->kv[l].head_dim == hd
               ? op->rope_kv_write(be, f->q, f->k, f->v, &f->kv[l], f->b, nh, f->rope)
               : 1;
  if (rc < 0)
    return -1;
  if (rc == 1) {
    TRY(op->rope(be, f->q, f->k, f->b->positions, T, nh, nkv, hd, f->rope));
    TRY(op->kv_write(be, &f->kv[l], f->k, f->v, f->b));
  }
  TRY(op->attention(be, f->att, f->q, &f->kv[l], f->b, ap));
  TRY(op->matmul(be, f->xb2, f->att, &L->wo, NULL, T, 0));
  if (f->tp_world > 1) /* row-parallel o_proj: each rank's partial sum over its heads */
    TRY(op->all_reduce_sum(be, f->xb2, (size_t)T * c->dim));
  return 0;
}

int block_gated_mlp(const struct fwd *f, int l) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  const struct layer_weights *L = &f->layers[l];
  const int T = f->T, F = c->ffn_dim;
  if (L->w_gate_up.data) {
    const int32_t *gi = f->split_idx + qkv_idx_count(c, &f->layers[0], f->max_tokens),
                  *ui = gi + f->max_tokens;
    TRY(op->matmul(be, f->fused, f->xb, &L->w_gate_up, NULL, T, 0));
    TRY(op->gather_rows(be, f->gate, f->fused, gi, T, F));
    TRY(op->gather_rows(be, f->up, f->fused, ui, T, F));
    TRY(op->silu_mul(be, f->gate, f->gate, f->up, T, F));
  } else {
    int rc = op->matmul_silu_mul ? op->matmul_silu_mul(be, f->gate, f->xb, &L->w_gate, &L->w_up, T) : 1;
    if (rc < 0)
      return -1;
    if (rc == 1) {
      void *const outs[2] = {f->gate, f->up};
      const struct weight *const ws[2] = {&L->w_gate, &L->w_up};
      const struct weight *const bs[2] = {NULL, NULL};
      TRY(blocks_matmul_n(f, 2, outs, f->xb, ws, bs));
      TRY(op->silu_mul(be, f->gate, f->gate, f->up, T, F));
    }
  }
  TRY(op->matmul(be, f->xb2, f->gate, &L->w_down, NULL, T, 0));
  if (f->tp_world > 1) /* row-parallel down_proj: each rank's partial sum over its ffn columns */
    TRY(op->all_reduce_sum(be, f->xb2, (size_t)T * c->dim));
  return 0;
}

int blocks_prenorm_forward(const struct fwd *f) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  const int T = f->T, dim = c->dim;
  TRY(op->embed(be, f->x, f->tok_embd, f->b->input_ids, T));
  TRY(op->rmsnorm(be, f->xb, NULL, f->x, &f->layers[0].attn_norm, T, dim, c->rms_eps));
  for (int l = 0; l < c->n_layers; l++) {
    const struct attn_params ap = {.n_heads = c->n_heads,
                                   .scale = 1.0f / sqrtf((float)c->head_dim),
                                   .window = block_layer_window(c, l)};
    TRY(block_attention(f, l, &ap));
    /* x += attention output; xb = norm(x) for the MLP */
    TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, &f->layers[l].ffn_norm, T, dim, c->rms_eps));
    TRY(block_gated_mlp(f, l));
    /* x += MLP output; xb = norm(x) with the next layer's (or the final) norm */
    const struct weight *next = l + 1 < c->n_layers ? &f->layers[l + 1].attn_norm : f->out_norm;
    TRY(op->rmsnorm(be, f->xb, f->x, f->xb2, next, T, dim, c->rms_eps));
  }
  return 0;
}
