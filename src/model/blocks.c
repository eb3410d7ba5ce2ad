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

/* ---- The residual stream around a sub-block (struct block_res, blocks.h) ---- */

/* f->xb = rmsnorm(f->x) with RES's norm, adding the output waiting in f->xb2 first. */
static int res_norm(const struct fwd *f, struct block_res *res) {
  struct backend *be = f->be;
  TRY(be->ops->rmsnorm(be, f->xb, res->pending ? f->x : NULL, res->pending ? f->xb2 : f->x, res->norm, f->T,
                       f->c->dim, f->c->rms_eps));
  res->pending = 0;
  res->normed = 1;
  return 0;
}

/* A sub-block's first matmuls, FN(f, l, x, pre): on f->x with PRE (the norm as their prologue),
 * or on the normalized f->xb with PRE NULL. 1 when FN covers no form of these shapes. */
typedef int (*res_input_fn)(const struct fwd *f, int l, const void *x, const struct backend_prenorm *pre);
/* FN with the norm as its prologue, where the residual stream is waiting for it (res not pending
 * and not normalized); 1 when it is not (or FN has no prologue form), nothing done then. */
static int res_input_pre(const struct fwd *f, int l, struct block_res *res, res_input_fn fn) {
  if (!res || res->pending || res->normed)
    return 1;
  const struct backend_prenorm pre = {.w = res->norm, .eps = f->c->rms_eps, .xn = f->xb};
  return fn(f, l, f->x, &pre);
}

/* FN on the normalized input, normalizing (and adding what is pending) first where needed. */
static int res_input_normed(const struct fwd *f, int l, struct block_res *res, res_input_fn fn) {
  if (res && !res->normed)
    TRY(res_norm(f, res));
  return fn(f, l, f->xb, NULL);
}

/* FN on the sub-block's normalized input: without RES on f->xb (the caller normalized it); with
 * RES first on f->x with the norm as the prologue (when no output is pending and f->xb does not
 * hold the norm already), and if the backend answered 1, on f->xb after res_norm. Returns FN's
 * answer: 1 only when FN covers no form of these shapes (the caller then tries another FN; f->xb
 * may hold the norm by then). */
static int res_input(const struct fwd *f, int l, struct block_res *res, res_input_fn fn) {
  int rc = res_input_pre(f, l, res, fn);
  return rc != 1 ? rc : res_input_normed(f, l, res, fn);
}

/* A sub-block's last matmul, out = x @ W^T (o / down; a partial sum under tensor parallelism):
 * without RES into f->xb2 (all-reduced); with RES added into f->x by the fused matmul_add or
 * all_reduce_add where the backend has them, else left in f->xb2 (res->pending) for the next
 * res_norm to add. */
static int res_output_ops(const struct fwd *f, struct block_res *res, const void *x, const struct weight *w) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const size_t n = (size_t)f->T * f->c->dim;
  int rc = res && f->tp_world == 1 && op->matmul_add ? op->matmul_add(be, f->x, x, w, f->xb2, f->T) : 1;
  if (rc != 1)
    return rc;
  TRY(op->matmul(be, f->xb2, x, w, NULL, f->T, 0));
  if (f->tp_world > 1) {
    rc = res && op->all_reduce_add ? op->all_reduce_add(be, f->x, f->xb2, n) : 1;
    if (rc != 1)
      return rc;
    TRY(op->all_reduce_sum(be, f->xb2, n));
  }
  if (res)
    res->pending = 1;
  return 0;
}

static int res_output(const struct fwd *f, struct block_res *res, const void *x, const struct weight *w) {
  int rc = res_output_ops(f, res, x, w);
  if (res && rc == 0)
    res->normed = 0; /* f->x moved on (or an output is pending): the next input is not normalized yet */
  return rc;
}

/* Layer L's q/k/v weights and their biases (NULL where absent), as matmul_n takes them. */
static void qkv_weights(const struct layer_weights *L, const struct weight *ws[3], const struct weight *bs[3]) {
  ws[0] = &L->wq, ws[1] = &L->wk, ws[2] = &L->wv;
  bs[0] = L->bq.data ? &L->bq : NULL, bs[1] = L->bk.data ? &L->bk : NULL, bs[2] = L->bv.data ? &L->bv : NULL;
}

/* q/k/v from wq/wk/wv (+ biases) as one fused matmul_n where the backend has it, else three
 * matmuls (1 when given PRE and not fused). */
static int qkv_separate(const struct fwd *f, int l, const void *x, const struct backend_prenorm *pre) {
  struct backend *be = f->be;
  const struct layer_weights *L = &f->layers[l];
  void *const outs[3] = {f->q, f->k, f->v};
  const struct weight *ws[3], *bs[3];
  qkv_weights(L, ws, bs);
  int rc = be->ops->matmul_n ? be->ops->matmul_n(be, 3, outs, x, pre, ws, bs, f->T) : 1;
  if (rc != 1 || pre)
    return rc;
  for (int i = 0; i < 3; i++)
    TRY(be->ops->matmul(be, outs[i], x, ws[i], bs[i], f->T, 0));
  return 0;
}

/* q/k/v from the fused wqkv (Phi-3): one matmul, then split (no prologue form: 1 with PRE). */
static int qkv_fused(const struct fwd *f, int l, const void *x, const struct backend_prenorm *pre) {
  if (pre)
    return 1;
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const int T = f->T, nh = f->c->n_heads, nkv = f->c->n_kv_heads, hd = f->c->head_dim;
  const int32_t *qi = f->split_idx, *ki = qi + (size_t)f->max_tokens * nh, *vi = ki + (size_t)f->max_tokens * nkv;
  TRY(op->matmul(be, f->fused, x, &f->layers[l].wqkv, NULL, T, 0));
  TRY(op->gather_rows(be, f->q, f->fused, qi, T * nh, hd));
  TRY(op->gather_rows(be, f->k, f->fused, ki, T * nkv, hd));
  TRY(op->gather_rows(be, f->v, f->fused, vi, T * nkv, hd));
  return 0;
}

/* q/k/v, RoPE and the KV write in one op (matmul_qkv_rope), for layers of wq/wk/wv without
 * per-head q/k norms; 1 when the backend has no such form for these shapes. */
static int qkv_rope(const struct fwd *f, int l, const void *x, const struct backend_prenorm *pre) {
  struct backend *be = f->be;
  const struct layer_weights *L = &f->layers[l];
  const struct weight *ws[3], *bs[3];
  qkv_weights(L, ws, bs);
  return be->ops->matmul_qkv_rope(be, f->q, f->k, f->v, x, pre, ws, bs, &f->kv[l], f->b, f->c->n_heads, f->rope);
}

int block_attention(const struct fwd *f, int l, const struct attn_params *ap, struct block_res *res) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  const struct layer_weights *L = &f->layers[l];
  const int T = f->T, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
  const int kv_ok = f->kv[l].n_kv_heads == nkv && f->kv[l].head_dim == hd;
  const int one_op = op->matmul_qkv_rope && kv_ok && !L->wqkv.data && !L->q_norm.data && !L->k_norm.data;
  /* With the norm as a prologue: the one op, else the projections alone (a backend may take the
   * prologue there and not in the one op: on CUDA with PAGODA_FUSED_ROPE=0, LongRoPE, or a KV
   * layout the one op does not cover). Then, normalized: the one op, else the projections. */
  int rc = one_op ? res_input_pre(f, l, res, qkv_rope) : 1, roped = rc == 0;
  if (rc == 1 && !L->wqkv.data)
    rc = res_input_pre(f, l, res, qkv_separate);
  if (rc == 1 && one_op)
    roped = (rc = res_input_normed(f, l, res, qkv_rope)) == 0;
  if (rc < 0)
    return -1;
  if (!roped) { /* the projections, the per-head norms, then RoPE and the KV write */
    if (rc == 1)
      TRY(res_input_normed(f, l, res, L->wqkv.data ? qkv_fused : qkv_separate));
    if (L->q_norm.data) /* in place: rows of head_dim */
      TRY(op->rmsnorm(be, f->q, NULL, f->q, &L->q_norm, T * nh, hd, c->rms_eps));
    if (L->k_norm.data)
      TRY(op->rmsnorm(be, f->k, NULL, f->k, &L->k_norm, T * nkv, hd, c->rms_eps));
    rc = op->rope_kv_write && kv_ok ? op->rope_kv_write(be, f->q, f->k, f->v, &f->kv[l], f->b, nh, f->rope) : 1;
    if (rc < 0)
      return -1;
    if (rc == 1) {
      TRY(op->rope(be, f->q, f->k, f->b->positions, T, nh, nkv, hd, f->rope));
      TRY(op->kv_write(be, &f->kv[l], f->k, f->v, f->b));
    }
  }
  TRY(op->attention(be, f->att, f->q, &f->kv[l], f->b, ap));
  /* row-parallel o_proj under tensor parallelism: each rank's partial sum over its heads */
  return res_output(f, res, f->att, &L->wo);
}

/* f->gate = silu(gate(x)) * up(x) from w_gate / w_up: matmul_silu_mul, else matmul_n (or two
 * matmuls) and silu_mul (1 when given PRE and neither fused form takes it). */
static int mlp_gate_separate(const struct fwd *f, int l, const void *x, const struct backend_prenorm *pre) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct layer_weights *L = &f->layers[l];
  int rc = op->matmul_silu_mul ? op->matmul_silu_mul(be, f->gate, x, pre, &L->w_gate, &L->w_up, f->T) : 1;
  if (rc != 1)
    return rc;
  void *const outs[2] = {f->gate, f->up};
  const struct weight *const ws[2] = {&L->w_gate, &L->w_up};
  const struct weight *const bs[2] = {NULL, NULL};
  rc = op->matmul_n ? op->matmul_n(be, 2, outs, x, pre, ws, bs, f->T) : 1;
  if (rc < 0 || (rc == 1 && pre))
    return rc;
  for (int i = 0; i < 2 && rc == 1; i++)
    TRY(op->matmul(be, outs[i], x, ws[i], NULL, f->T, 0));
  return op->silu_mul(be, f->gate, f->gate, f->up, f->T, f->c->ffn_dim);
}

/* The same from the fused w_gate_up (Phi-3): one matmul, split, silu_mul (1 with PRE). */
static int mlp_gate_fused(const struct fwd *f, int l, const void *x, const struct backend_prenorm *pre) {
  if (pre)
    return 1;
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const int T = f->T, F = f->c->ffn_dim;
  const int32_t *gi = f->split_idx + qkv_idx_count(f->c, &f->layers[0], f->max_tokens), *ui = gi + f->max_tokens;
  TRY(op->matmul(be, f->fused, x, &f->layers[l].w_gate_up, NULL, T, 0));
  TRY(op->gather_rows(be, f->gate, f->fused, gi, T, F));
  TRY(op->gather_rows(be, f->up, f->fused, ui, T, F));
  return op->silu_mul(be, f->gate, f->gate, f->up, T, F);
}

int block_gated_mlp(const struct fwd *f, int l, struct block_res *res) {
  const struct layer_weights *L = &f->layers[l];
  TRY(res_input(f, l, res, L->w_gate_up.data ? mlp_gate_fused : mlp_gate_separate));
  /* row-parallel down_proj: each rank's partial sum over its ffn columns */
  return res_output(f, res, f->gate, &L->w_down);
}

int blocks_prenorm_forward(const struct fwd *f) {
  struct backend *be = f->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = f->c;
  TRY(op->embed(be, f->x, f->tok_embd, f->b->input_ids, f->T));
  struct block_res res = {0};
  for (int l = 0; l < c->n_layers; l++) {
    const struct attn_params ap = {.n_heads = c->n_heads,
                                   .scale = 1.0f / sqrtf((float)c->head_dim),
                                   .window = block_layer_window(c, l)};
    res.norm = &f->layers[l].attn_norm; /* x += attn(norm(x)) */
    TRY(block_attention(f, l, &ap, &res));
    res.norm = &f->layers[l].ffn_norm; /* x += mlp(norm(x)) */
    TRY(block_gated_mlp(f, l, &res));
  }
  res.norm = f->out_norm; /* xb = the final norm(x), for the output head */
  return res_norm(f, &res);
}
