/* test_cuda_ops.c - every CUDA backend op against the CPU backend on the same random inputs
 * (fresh each run), including the paged-attention grid of block sizes x batch shapes x GQA.
 *
 * Inputs are drawn as bf16-representable values, so both backends start from identical data;
 * the tolerances below then only cover what the CUDA side rounds (its activations are bf16)
 * and summation order. bf16 has an 8-bit significand: one rounding is a relative error of at
 * most 2^-9 = 0.2%, about 0.1% in rel L2 over many elements. */
#include <math.h>

#include "gpu_pair.h"

/* Copies (gather, embedding, KV write, block copy) move bf16-exact values: bit-exact. */
#define TOL_EXACT 1e-12
/* One or two bf16 roundings of the output (~1e-3 rel L2) plus f32 reassociation: 1e-2. */
#define TOL_BF16_OUT 1e-2
/* A GEMM with an f32 output: bf16-exact inputs, f32 accumulation on both sides; only the
 * summation order differs (~1e-6), so 1e-4 still catches any wrong element. */
#define TOL_F32_GEMM 1e-4

static struct weight pair_weight(int i, const float *h, int64_t rows, int64_t cols) {
  struct weight w;
  if (pair_be[i]->ops->weight_from_host(pair_be[i], &w, h, DTYPE_F32, rows, cols))
    pair_die("weight_from_host");
  return w;
}

static void test_embed(void) {
  int vocab = 1000, dim = 192, T = 37;
  float *emb = malloc(sizeof(float) * vocab * dim);
  pair_fill(emb, (size_t)vocab * dim, 1.0f);
  int32_t ids[37];
  for (int t = 0; t < T; t++)
    ids[t] = pair_int(0, vocab - 1);
  struct weight w[2];
  for (int i = 0; i < 2; i++)
    w[i] = pair_weight(i, emb, vocab, dim);
  struct dbuf d_ids = pair_bytes(ids, sizeof ids), out = pair_poisoned((size_t)T * dim);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->embed(pair_be[i], out.p[i], &w[i], d_ids.p[i], T))
      pair_die("embed");
  float *c, *g;
  pair_get_both(out, (size_t)T * dim, &c, &g);
  pair_expect("embed", g, c, (size_t)T * dim, TOL_EXACT);
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->weight_free(pair_be[i], &w[i]);
  pair_free(d_ids);
  pair_free(out);
  free(c);
  free(g);
  free(emb);
}

static void test_rmsnorm(int dim, int with_residual) {
  int T = 19;
  size_t n = (size_t)T * dim;
  float *x = malloc(n * 4), *r = malloc(n * 4), *wv = malloc(dim * 4);
  pair_fill(x, n, 2.0f);
  pair_fill(r, n, 2.0f);
  for (int d = 0; d < dim; d++)
    wv[d] = 1.0f + pair_rnd(0.5f); /* norm weights sit near 1 in real models */
  struct weight w[2];
  for (int i = 0; i < 2; i++)
    w[i] = pair_weight(i, wv, 1, dim);
  struct dbuf dx = pair_acts(x, n), dr = pair_acts(r, n), out = pair_poisoned(n);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->rmsnorm(pair_be[i], out.p[i], with_residual ? dr.p[i] : NULL, dx.p[i], &w[i], T,
                                 dim, 1e-5f))
      pair_die("rmsnorm");
  char what[64];
  snprintf(what, sizeof what, "rmsnorm dim %d%s", dim, with_residual ? " +residual" : "");
  pair_check(what, out, n, TOL_BF16_OUT);
  if (with_residual) { /* the fused add's sum, stored back: one bf16 rounding */
    snprintf(what, sizeof what, "rmsnorm dim %d residual sum", dim);
    pair_check(what, dr, n, TOL_BF16_OUT);
  }
  /* in place: out aliases x (the forward pass may normalise a buffer into itself) */
  if (!with_residual) {
    for (int i = 0; i < 2; i++)
      if (pair_be[i]->ops->rmsnorm(pair_be[i], dx.p[i], NULL, dx.p[i], &w[i], T, dim, 1e-5f))
        pair_die("rmsnorm");
    snprintf(what, sizeof what, "rmsnorm dim %d in place", dim);
    pair_check(what, dx, n, TOL_BF16_OUT);
  }
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->weight_free(pair_be[i], &w[i]);
  pair_free(dx);
  pair_free(dr);
  pair_free(out);
  free(x);
  free(r);
  free(wv);
}

static void test_matmul(int T, int N, int K, int out_f32, int with_bias) {
  float *x = malloc(sizeof(float) * T * K), *wv = malloc(sizeof(float) * N * K), *bv = malloc(4 * N);
  pair_fill(x, (size_t)T * K, 1.0f);
  pair_fill(wv, (size_t)N * K, 0.1f);
  pair_fill(bv, (size_t)N, 0.5f);
  struct weight w[2], b[2];
  for (int i = 0; i < 2; i++) {
    w[i] = pair_weight(i, wv, N, K);
    b[i] = pair_weight(i, bv, 1, N);
  }
  struct dbuf dx = pair_acts(x, (size_t)T * K);
  size_t n = (size_t)T * N;
  float *c = malloc(n * 4), *g = malloc(n * 4);
  void *out[2];
  for (int i = 0; i < 2; i++) {
    size_t bytes = n * (out_f32 ? 4 : pair_esz(i));
    out[i] = pair_alloc1(i, bytes);
    void *poison = malloc(bytes);
    memset(poison, 0xff, bytes);
    pair_be[i]->ops->upload(pair_be[i], out[i], poison, bytes);
    free(poison);
    if (pair_be[i]->ops->matmul(pair_be[i], out[i], dx.p[i], &w[i], with_bias ? &b[i] : NULL, T, out_f32))
      pair_die("matmul");
    float *h = i ? g : c;
    if (out_f32)
      pair_be[i]->ops->download(pair_be[i], h, out[i], n * 4);
    else
      pair_get_act(i, h, out[i], n);
    pair_be[i]->ops->free(pair_be[i], out[i]);
    pair_be[i]->ops->weight_free(pair_be[i], &w[i]);
    pair_be[i]->ops->weight_free(pair_be[i], &b[i]);
  }
  char what[80];
  snprintf(what, sizeof what, "matmul T%d N%d K%d%s%s", T, N, K, out_f32 ? " f32-out" : "",
           with_bias ? " +bias" : "");
  pair_expect(what, g, c, n, out_f32 ? TOL_F32_GEMM : TOL_BF16_OUT);
  pair_free(dx);
  free(x);
  free(wv);
  free(bv);
  free(c);
  free(g);
}

/* Weights stored as F16, BF16 or Q8_0 (GGUF files): the CPU backend computes with them as they
 * are, the CUDA backend converts them to bf16 at load, one rounding of each weight (relative
 * error <= 2^-9), so the bf16-output tolerance applies. */
/* N values of random Q8_0 blocks (scales around 0.002, quants in [-127, 127]) into W. */
static void fill_q8_0(uint8_t *w, size_t n) {
  for (size_t blk = 0; blk < n / Q8_0_BLOCK; blk++) {
    uint8_t *b = w + blk * Q8_0_BYTES;
    uint16_t sc = f32_to_f16(0.001f + 0.002f * (test_randf(&pair_rng) + 1));
    memcpy(b, &sc, 2);
    for (int i = 0; i < Q8_0_BLOCK; i++)
      b[2 + i] = (uint8_t)(int8_t)pair_int(-127, 127);
  }
}

static void test_matmul_src(enum dtype src_t) {
  int T = 5, N = 96, K = 256;
  size_t n = (size_t)N * K;
  float *x = malloc(sizeof(float) * T * K);
  pair_fill(x, (size_t)T * K, 1.0f);
  size_t bytes = dtype_row_bytes(src_t, K) * N;
  uint8_t *w = malloc(bytes);
  if (src_t == DTYPE_Q8_0) {
    fill_q8_0(w, n);
  } else {
    for (size_t i = 0; i < n; i++) {
      float v = test_randf(&pair_rng) * 0.1f;
      uint16_t h = src_t == DTYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v);
      memcpy(w + 2 * i, &h, 2);
    }
  }
  struct weight wt[2];
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->weight_from_host(pair_be[i], &wt[i], w, src_t, N, K))
      pair_die("weight_from_host");
  struct dbuf dx = pair_acts(x, (size_t)T * K), out = pair_poisoned((size_t)T * N);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->matmul(pair_be[i], out.p[i], dx.p[i], &wt[i], NULL, T, 0))
      pair_die("matmul");
  float *c, *g;
  char what[64];
  pair_get_both(out, (size_t)T * N, &c, &g);
  snprintf(what, sizeof what, "matmul with %s weights", dtype_name(src_t));
  pair_expect(what, g, c, (size_t)T * N, TOL_BF16_OUT);
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->weight_free(pair_be[i], &wt[i]);
  pair_free(dx);
  pair_free(out);
  free(c);
  free(g);
  free(w);
  free(x);
}

/* Llama-3-style inverse frequencies, with the llama3 scaling's three bands, as the model
 * computes them (the op takes inv_freq ready-made). */
static void llama3_inv_freq(float *inv, int half, float theta) {
  for (int i = 0; i < half; i++) {
    double f = 1.0 / pow(theta, (2.0 * i) / (2.0 * half));
    double wavelen = 2 * M_PI / f;
    if (wavelen > 8192.0 / 1.0)
      f /= 32.0;
    else if (wavelen > 8192.0 / 4.0) {
      double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      f = (1 - smooth) * f / 32.0 + smooth * f;
    }
    inv[i] = (float)f;
  }
}

static void test_rope(int head_dim, int n_heads, int n_kv, int neox, int max_pos) {
  int T = 23, half = head_dim / 2;
  size_t nq = (size_t)T * n_heads * head_dim, nk = (size_t)T * n_kv * head_dim;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), inv[128];
  int32_t pos[23];
  pair_fill(q, nq, 1.0f);
  pair_fill(k, nk, 1.0f);
  for (int t = 0; t < T; t++)
    pos[t] = pair_int(0, max_pos);
  llama3_inv_freq(inv, half, 500000.0f);
  struct dbuf dq = pair_acts(q, nq), dk = pair_acts(k, nk), dpos = pair_bytes(pos, sizeof pos),
              dinv = pair_bytes(inv, sizeof(float) * half);
  for (int i = 0; i < 2; i++) {
    struct rope_params rp = {.inv_freq = dinv.p[i], .rot_dim = head_dim, .neox = neox};
    if (pair_be[i]->ops->rope(pair_be[i], dq.p[i], dk.p[i], dpos.p[i], T, n_heads, n_kv, head_dim, &rp))
      pair_die("rope");
  }
  char what[80];
  snprintf(what, sizeof what, "rope hd%d %s pos<=%d q", head_dim, neox ? "neox" : "gptj", max_pos);
  pair_check(what, dq, nq, TOL_BF16_OUT);
  snprintf(what, sizeof what, "rope hd%d %s pos<=%d k", head_dim, neox ? "neox" : "gptj", max_pos);
  pair_check(what, dk, nk, TOL_BF16_OUT);
  pair_free(dq);
  pair_free(dk);
  pair_free(dpos);
  pair_free(dinv);
  free(q);
  free(k);
}

/* LongRoPE (Phi-3): 3 sequences in one batch, the first at most long_after tokens long (short
 * table), the others longer (long table), partial rotation (rot_dim < head_dim) and the
 * attention factor on cos/sin: CUDA against the CPU reference. */
static void test_rope_longrope(int head_dim, int n_heads, int n_kv) {
  enum { T = 23 };
  int rot = head_dim * 3 / 4 / 2 * 2, half = rot / 2;
  size_t nq = (size_t)T * n_heads * head_dim, nk = (size_t)T * n_kv * head_dim;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), inv[256];
  int32_t pos[T], qs[4] = {0, 9, 10, T}, lens[3] = {9, 5000, 13};
  for (int t = 0; t < T; t++)
    pos[t] = t < 9 ? t : t == 9 ? 4999 : t - 10;
  pair_fill(q, nq, 1.0f);
  pair_fill(k, nk, 1.0f);
  for (int i = 0; i < half; i++) {
    float base = (float)pow(10000.0, (double)(2 * i) / rot);
    inv[i] = 1.0f / ((1.0f + 0.05f * i) * base);
    inv[half + i] = 1.0f / ((1.0f + 1.5f * i) * base);
  }
  struct dbuf dq = pair_acts(q, nq), dk = pair_acts(k, nk), dpos = pair_bytes(pos, sizeof pos),
              dinv = pair_bytes(inv, sizeof(float) * 2 * half), dqs = pair_bytes(qs, sizeof qs),
              dlens = pair_bytes(lens, sizeof lens);
  for (int i = 0; i < 2; i++) {
    struct rope_params rp = {.inv_freq = dinv.p[i], .rot_dim = rot, .neox = 1,
                             .inv_freq_long = (const float *)dinv.p[i] + half, .long_after = 12,
                             .query_start = dqs.p[i], .seq_lens = dlens.p[i], .num_seqs = 3,
                             .mscale = 1.19f};
    if (pair_be[i]->ops->rope(pair_be[i], dq.p[i], dk.p[i], dpos.p[i], T, n_heads, n_kv, head_dim, &rp))
      pair_die("longrope");
  }
  char what[80];
  snprintf(what, sizeof what, "longrope hd%d rot%d q", head_dim, rot);
  pair_check(what, dq, nq, TOL_BF16_OUT);
  snprintf(what, sizeof what, "longrope hd%d rot%d k", head_dim, rot);
  pair_check(what, dk, nk, TOL_BF16_OUT);
  pair_free(dq);
  pair_free(dk);
  pair_free(dpos);
  pair_free(dinv);
  pair_free(dqs);
  pair_free(dlens);
  free(q);
  free(k);
}

static void test_silu_mul(int T, int F) {
  size_t n = (size_t)T * F;
  float *a = malloc(n * 4), *b = malloc(n * 4);
  pair_fill(a, n, 4.0f);
  pair_fill(b, n, 2.0f);
  struct dbuf da = pair_acts(a, n), db = pair_acts(b, n), out = pair_poisoned(n);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->silu_mul(pair_be[i], out.p[i], da.p[i], db.p[i], T, F))
      pair_die("silu_mul");
  pair_check("silu_mul", out, n, TOL_BF16_OUT);
  for (int i = 0; i < 2; i++) /* out aliases gate */
    if (pair_be[i]->ops->silu_mul(pair_be[i], da.p[i], da.p[i], db.p[i], T, F))
      pair_die("silu_mul");
  pair_check("silu_mul in place", da, n, TOL_BF16_OUT);
  pair_free(da);
  pair_free(db);
  pair_free(out);
  free(a);
  free(b);
}

static void test_gather_rows(void) {
  int rows = 50, dim = 136, n = 9;
  float *x = malloc(sizeof(float) * rows * dim);
  pair_fill(x, (size_t)rows * dim, 3.0f);
  int32_t idx[9];
  for (int i = 0; i < n; i++)
    idx[i] = pair_int(0, rows - 1);
  struct dbuf dx = pair_acts(x, (size_t)rows * dim), di = pair_bytes(idx, sizeof idx),
              out = pair_poisoned((size_t)n * dim);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->gather_rows(pair_be[i], out.p[i], dx.p[i], di.p[i], n, dim))
      pair_die("gather_rows");
  pair_check("gather_rows", out, (size_t)n * dim, TOL_EXACT);
  pair_free(dx);
  pair_free(di);
  pair_free(out);
  free(x);
}

/* ---- paged KV cache: kv_write + attention over a random batch ---- */

enum shape { SHAPE_DECODE, SHAPE_PREFILL, SHAPE_MIXED, SHAPE_CHUNKED, SHAPE_COUNT };
static const char *shape_name[SHAPE_COUNT] = {"decode", "prefill", "mixed", "chunked-prefill"};

struct kv_case {
  int bs, n_heads, n_kv, hd;
  enum shape shape;
  int window;    /* struct attn_params: 0 = off */
  float softcap; /* 0 = off */
  int f8;        /* f8e4m3 cache (k_scale 0.5, v_scale 2) instead of the activation dtype */
  int long_ctx;  /* decode sequences with up to 3000 cached tokens (several split-K partitions);
                    prompts of up to 400 tokens, chunks of up to 300 after up to 500 cached
                    (several query and key tiles of the prefill kernels) */
  int loose;     /* host bounds loose as a CUDA graph captures them: max_seq_len and the block
                    table's width beyond the real ones, padded sequences with no query */
};

/* Builds a batch of B sequences for the shape: per sequence, q_len new tokens after `cached`
 * tokens already in the cache; block tables draw distinct physical blocks in random order
 * (block 0 is the null block and never used). Returns host arrays; *num_blocks gets the pool. */
struct host_batch {
  int B, T, max_blocks, max_seq, max_q;
  int32_t *ids, *pos, *slots, *qstart, *seq_lens, *tables;
  int num_blocks;
};

static void batch_from_lens(struct host_batch *hb, int B, const int *qlen, const int *cached, int bs,
                            int extra_blocks, int extra_seq);

static void make_batch(struct host_batch *hb, enum shape shape, int bs, int long_ctx, int loose) {
  int B = pair_int(1, 6);
  int qlen[8], cached[8];
  for (int b = 0; b < B; b++) {
    int kind = shape == SHAPE_MIXED ? pair_int(0, 2) : (int)shape;
    switch (kind) {
    case SHAPE_DECODE:
      qlen[b] = 1, cached[b] = pair_int(0, long_ctx ? 3000 : 120);
      break;
    case SHAPE_PREFILL:
      qlen[b] = pair_int(1, long_ctx ? 400 : 70), cached[b] = 0;
      break;
    default: /* a prompt chunk after a cached prefix (prefix-cache hit or earlier chunks) */
      qlen[b] = pair_int(1, long_ctx ? 300 : 40), cached[b] = pair_int(1, long_ctx ? 500 : 90);
      break;
    }
  }
  if (shape == SHAPE_MIXED) { /* make sure it really mixes decode and prompt tokens */
    qlen[0] = 1, cached[0] = pair_int(1, 60);
    if (B < 2)
      B = 2;
    qlen[1] = pair_int(2, 30), cached[1] = pair_int(0, 50);
  }
  if (loose) /* two padded sequences without a query (a graph's padded batch rows) */
    for (int k = 0; k < 2; k++, B++)
      qlen[B] = 0, cached[B] = 0;
  batch_from_lens(hb, B, qlen, cached, bs, loose ? 40 : 0, loose ? 40 * bs + 7 : 0);
}

/* The batch of B sequences, sequence b with qlen[b] new tokens after cached[b] cached ones;
 * EXTRA_BLOCKS and EXTRA_SEQ loosen the host bounds (block table width, max_seq_len) as a
 * captured graph's are. */
static void batch_from_lens(struct host_batch *hb, int B, const int *qlen, const int *cached, int bs,
                            int extra_blocks, int extra_seq) {
  hb->B = B;
  hb->T = 0;
  hb->max_blocks = 0;
  hb->max_seq = 0;
  hb->max_q = 0;
  for (int b = 0; b < B; b++) {
    int sl = cached[b] + qlen[b];
    int nb = (sl + bs - 1) / bs;
    hb->T += qlen[b];
    if (nb > hb->max_blocks)
      hb->max_blocks = nb;
    if (sl > hb->max_seq)
      hb->max_seq = sl;
    if (qlen[b] > hb->max_q)
      hb->max_q = qlen[b];
  }
  hb->max_blocks += 1 + extra_blocks; /* a spare column (0 = null block) as a real engine would have */
  hb->max_seq += extra_seq;
  hb->num_blocks = 1 + B * hb->max_blocks + 3; /* some blocks stay unused, holding garbage */
  int *perm = malloc(sizeof(int) * hb->num_blocks);
  for (int i = 0; i < hb->num_blocks - 1; i++)
    perm[i] = i + 1;
  for (int i = hb->num_blocks - 2; i > 0; i--) {
    int j = pair_int(0, i), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  hb->ids = calloc(hb->T, 4);
  hb->pos = calloc(hb->T, 4);
  hb->slots = calloc(hb->T, 4);
  hb->qstart = calloc(B + 1, 4);
  hb->seq_lens = calloc(B, 4);
  hb->tables = calloc((size_t)B * hb->max_blocks, 4);
  int next = 0, t = 0;
  for (int b = 0; b < B; b++) {
    int sl = cached[b] + qlen[b], nb = (sl + bs - 1) / bs;
    for (int j = 0; j < nb; j++)
      hb->tables[b * hb->max_blocks + j] = perm[next++];
    hb->qstart[b] = t;
    hb->seq_lens[b] = sl;
    for (int i = 0; i < qlen[b]; i++, t++) {
      int p = cached[b] + i;
      hb->pos[t] = p;
      hb->slots[t] = hb->tables[b * hb->max_blocks + p / bs] * bs + p % bs;
    }
  }
  hb->qstart[B] = t;
  free(perm);
}

static void free_batch(struct host_batch *hb) {
  free(hb->ids);
  free(hb->pos);
  free(hb->slots);
  free(hb->qstart);
  free(hb->seq_lens);
  free(hb->tables);
}

/* The batch in BE's memory (the struct itself stays host-side, as the contract says). */
static struct batch dev_batch_be(struct backend *be, const struct host_batch *hb, void *bufs[6]) {
  const int32_t *src[6] = {hb->ids, hb->pos, hb->slots, hb->qstart, hb->seq_lens, hb->tables};
  size_t cnt[6] = {hb->T, hb->T, hb->T, hb->B + 1, hb->B, (size_t)hb->B * hb->max_blocks};
  for (int k = 0; k < 6; k++) {
    bufs[k] = be->ops->alloc(be, cnt[k] ? cnt[k] * 4 : 4);
    if (!bufs[k])
      pair_die("alloc");
    if (be->ops->upload(be, bufs[k], src[k], cnt[k] * 4))
      pair_die("upload");
  }
  struct batch b = {.num_tokens = hb->T,
                    .num_seqs = hb->B,
                    .max_blocks_per_seq = hb->max_blocks,
                    .max_seq_len = hb->max_seq,
                    .max_query_len = hb->max_q,
                    .input_ids = bufs[0],
                    .positions = bufs[1],
                    .slot_mapping = bufs[2],
                    .query_start = bufs[3],
                    .seq_lens = bufs[4],
                    .block_tables = bufs[5],
                    .num_logits = 0,
                    .logits_idx = NULL};
  return b;
}

static struct batch dev_batch(int i, const struct host_batch *hb, void *bufs[6]) {
  return dev_batch_be(pair_be[i], hb, bufs);
}

/* The f8e4m3 cache: random e4m3 codes (no NaN) stand for the cached prefix, both backends
 * quantize the new K/V (the same bf16 values) to the same bytes, and attention matches the
 * CPU reference. */
static void test_paged_f8(const struct kv_case *kc, struct host_batch *hb) {
  int T = hb->T;
  size_t cache_n = (size_t)hb->num_blocks * kc->n_kv * kc->bs * kc->hd;
  size_t nq = (size_t)T * kc->n_heads * kc->hd, nk = (size_t)T * kc->n_kv * kc->hd;
  uint8_t *kh = malloc(cache_n), *vh = malloc(cache_n);
  for (size_t i = 0; i < cache_n; i++) {
    kh[i] = f32_to_f8e4m3(pair_rnd(2.0f));
    vh[i] = f32_to_f8e4m3(pair_rnd(2.0f));
  }
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
  pair_fill(q, nq, 1.0f);
  pair_fill(k, nk, 1.0f);
  pair_fill(v, nk, 4.0f);
  struct dbuf dkc = pair_bytes(kh, cache_n), dvc = pair_bytes(vh, cache_n), dq = pair_acts(q, nq),
              dk = pair_acts(k, nk), dv = pair_acts(v, nk), out = pair_poisoned(nq);
  float scale = 1.0f / sqrtf((float)kc->hd);
  void *bufs[2][6];
  for (int i = 0; i < 2; i++) {
    struct kv_layer kv = {.k = dkc.p[i], .v = dvc.p[i], .k_scale = 0.5f, .v_scale = 2.0f, .dtype = DTYPE_F8E4M3,
                          .num_blocks = hb->num_blocks, .block_size = kc->bs, .n_kv_heads = kc->n_kv,
                          .head_dim = kc->hd};
    struct batch b = dev_batch(i, hb, bufs[i]);
    if (pair_be[i]->ops->kv_write(pair_be[i], &kv, dk.p[i], dv.p[i], &b))
      pair_die("kv_write f8");
    struct attn_params ap = {.n_heads = kc->n_heads, .scale = scale, .softcap = kc->softcap, .window = kc->window};
    if (pair_be[i]->ops->attention(pair_be[i], out.p[i], dq.p[i], &kv, &b, &ap))
      pair_die("attention f8");
  }
  uint8_t *c8 = malloc(cache_n), *g8 = malloc(cache_n);
  int bad = 0;
  for (int kvi = 0; kvi < 2; kvi++) {
    struct dbuf d = kvi ? dvc : dkc;
    if (pair_be[0]->ops->download(pair_be[0], c8, d.p[0], cache_n) ||
        pair_be[1]->ops->download(pair_be[1], g8, d.p[1], cache_n))
      pair_die("download");
    for (size_t i = 0; i < cache_n; i++)
      bad += c8[i] != g8[i];
  }
  CHECK(bad == 0, "kv_write f8e4m3 bs%d hd%d: %d cache bytes differ between CPU and CUDA", kc->bs, kc->hd, bad);
  char what[160];
  snprintf(what, sizeof what, "attention f8e4m3 bs%d %s h%d/kv%d hd%d window %d softcap %g%s%s (T=%d B=%d)",
           kc->bs, shape_name[kc->shape], kc->n_heads, kc->n_kv, kc->hd, kc->window, (double)kc->softcap,
           kc->long_ctx ? " long" : "", kc->loose ? " loose" : "", T, hb->B);
  float *c, *g;
  pair_get_both(out, nq, &c, &g);
  pair_expect(what, g, c, nq, TOL_BF16_OUT);
  free(c), free(g), free(c8), free(g8);
  for (int i = 0; i < 2; i++)
    for (int k2 = 0; k2 < 6; k2++)
      pair_be[i]->ops->free(pair_be[i], bufs[i][k2]);
  pair_free(dkc), pair_free(dvc), pair_free(dq), pair_free(dk), pair_free(dv), pair_free(out);
  free(kh), free(vh), free(q), free(k), free(v);
}

static void test_paged(const struct kv_case *kc) {
  struct host_batch hb;
  make_batch(&hb, kc->shape, kc->bs, kc->long_ctx, kc->loose);
  int T = hb.T;
  size_t cache_n = (size_t)hb.num_blocks * kc->n_kv * kc->bs * kc->hd;
  if (kc->f8) {
    test_paged_f8(kc, &hb);
    free_batch(&hb);
    return;
  }
  size_t nq = (size_t)T * kc->n_heads * kc->hd, nk = (size_t)T * kc->n_kv * kc->hd;
  /* random cache contents stand for the cached prefix; slots no sequence owns hold garbage the
   * causal mask and block tables must keep out of every result */
  float *kh = malloc(cache_n * 4), *vh = malloc(cache_n * 4), *q = malloc(nq * 4), *k = malloc(nk * 4),
        *v = malloc(nk * 4);
  pair_fill(kh, cache_n, 1.0f);
  pair_fill(vh, cache_n, 1.0f);
  pair_fill(q, nq, 1.0f);
  pair_fill(k, nk, 1.0f);
  pair_fill(v, nk, 1.0f);
  struct dbuf dkc = pair_acts(kh, cache_n), dvc = pair_acts(vh, cache_n), dq = pair_acts(q, nq),
              dk = pair_acts(k, nk), dv = pair_acts(v, nk), out = pair_poisoned(nq);
  float scale = 1.0f / sqrtf((float)kc->hd);
  void *bufs[2][6];
  for (int i = 0; i < 2; i++) {
    struct kv_layer kv = {.k = dkc.p[i], .v = dvc.p[i], .k_scale = 1.0f, .v_scale = 1.0f,
                          .dtype = pair_be[i]->act_dtype, .num_blocks = hb.num_blocks,
                          .block_size = kc->bs, .n_kv_heads = kc->n_kv, .head_dim = kc->hd};
    struct batch b = dev_batch(i, &hb, bufs[i]);
    if (pair_be[i]->ops->kv_write(pair_be[i], &kv, dk.p[i], dv.p[i], &b))
      pair_die("kv_write");
    struct attn_params ap = {.n_heads = kc->n_heads, .scale = scale, .softcap = kc->softcap, .window = kc->window};
    if (pair_be[i]->ops->attention(pair_be[i], out.p[i], dq.p[i], &kv, &b, &ap))
      pair_die("attention");
  }
  char what[128];
  snprintf(what, sizeof what, "kv_write bs%d %s h%d/kv%d hd%d (T=%d B=%d)", kc->bs, shape_name[kc->shape],
           kc->n_heads, kc->n_kv, kc->hd, T, hb.B);
  pair_check(what, dkc, cache_n, TOL_EXACT);
  pair_check(what, dvc, cache_n, TOL_EXACT);
  snprintf(what, sizeof what, "attention bs%d %s h%d/kv%d hd%d window %d softcap %g%s%s (T=%d B=%d)", kc->bs,
           shape_name[kc->shape], kc->n_heads, kc->n_kv, kc->hd, kc->window, (double)kc->softcap,
           kc->long_ctx ? " long" : "", kc->loose ? " loose" : "", T, hb.B);
  pair_check(what, out, nq, TOL_BF16_OUT);
  for (int i = 0; i < 2; i++)
    for (int k2 = 0; k2 < 6; k2++)
      pair_be[i]->ops->free(pair_be[i], bufs[i][k2]);
  pair_free(dkc);
  pair_free(dvc);
  pair_free(dq);
  pair_free(dk);
  pair_free(dv);
  pair_free(out);
  free(kh);
  free(vh);
  free(q);
  free(k);
  free(v);
  free_batch(&hb);
}

/* ---- decode attention's split-K fold (cuda_attn_decode.cu): the last partition block of each
 * (sequence, KV head) combines the partials instead of a second kernel. Two more CUDA backends,
 * made with PAGODA_ATTN_FOLD=0 (the separate reduce kernel) and 1 (read at create), run the same
 * decode batches. Their outputs must be the same bytes (one combine arithmetic), the fold's must
 * match the CPU, and a second launch on the same scratch and CUDA-graph replays (also after the
 * context lengths changed under the graph) must give those bytes again: the counters are back to
 * 0 after every launch. ---- */
static struct backend *fold_be[2]; /* [0]: PAGODA_ATTN_FOLD=0, [1]: the fold */

static void fold_open(void) {
  static const char *const names[2] = {"PAGODA_ATTN_FOLD", "PAGODA_CUDA_GRAPHS"};
  char *saved[2];
  for (int k = 0; k < 2; k++)
    saved[k] = getenv(names[k]) ? strdup(getenv(names[k])) : NULL;
  setenv("PAGODA_CUDA_GRAPHS", "1", 1); /* the replay checks need graphs whatever the caller's environment */
  for (int i = 0; i < 2; i++) {
    setenv("PAGODA_ATTN_FOLD", i ? "1" : "0", 1);
    fold_be[i] = backend_create(&(struct backend_params){.device = "cuda"});
    if (!fold_be[i])
      pair_die("backend_create (PAGODA_ATTN_FOLD)");
  }
  for (int k = 0; k < 2; k++) {
    if (saved[k])
      setenv(names[k], saved[k], 1);
    else
      unsetenv(names[k]);
    free(saved[k]);
  }
}

static void fold_close(void) {
  for (int i = 0; i < 2; i++)
    fold_be[i]->ops->destroy(fold_be[i]);
}

static void *be_put(struct backend *be, const void *h, size_t bytes) {
  void *d = be->ops->alloc(be, bytes ? bytes : 4);
  if (!d)
    pair_die("alloc");
  if (bytes && be->ops->upload(be, d, h, bytes))
    pair_die("upload");
  return d;
}

/* BYTES of BE's D (caller frees). */
static uint8_t *be_get(struct backend *be, const void *d, size_t bytes) {
  uint8_t *h = malloc(bytes + 1);
  if (be->ops->download(be, h, d, bytes))
    pair_die("download");
  return h;
}

static void be_poison(struct backend *be, void *d, size_t bytes) {
  uint8_t *t = malloc(bytes + 1);
  memset(t, 0xff, bytes);
  if (be->ops->upload(be, d, t, bytes))
    pair_die("upload");
  free(t);
}

/* Positions of the first differing bf16 element and the count, printed by the caller. */
static int bytes_differ(const uint8_t *x, const uint8_t *y, size_t n, size_t *first) {
  int bad = 0;
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i]) {
      if (!bad)
        *first = i / 2;
      bad++;
    }
  return bad;
}

struct fold_rec { /* one attention call, as a graph's record callback */
  struct backend *be;
  void *out;
  const void *q;
  const struct kv_layer *kv;
  const struct batch *b;
  const struct attn_params *ap;
  int calls;
};

static int fold_record(void *ctx) {
  struct fold_rec *r = ctx;
  r->calls++;
  return r->be->ops->attention(r->be, r->out, r->q, r->kv, r->b, r->ap);
}

/* One decode batch through both CUDA backends and the CPU. BATCH1: one sequence of 400-700 keys
 * under a graph's loose bound of 8192 (the batch-1 step); else five sequences: up to 3000 keys
 * (dozens of partitions), one key and up to 63 (one partition: written directly), two in
 * between, and a padded one without a query. KEY: the graph key (unique per call). */
static void test_decode_fold(int bs, int n_heads, int n_kv, int hd, int f8, int window, float softcap, int batch1,
                             int key) {
  int qlen[8], cached[8], B;
  if (batch1) {
    B = 1, qlen[0] = 1, cached[0] = pair_int(400, 700);
  } else {
    const int lo[5] = {1500, 0, 1, 200, 63}, hi[5] = {3000, 0, 62, 900, 300};
    for (B = 0; B < 5; B++)
      qlen[B] = 1, cached[B] = pair_int(lo[B], hi[B]);
    qlen[B] = 0, cached[B] = 0, B++;
  }
  struct host_batch hb;
  int max_seq = 0;
  for (int b = 0; b < B; b++)
    max_seq = cached[b] + qlen[b] > max_seq ? cached[b] + qlen[b] : max_seq;
  int extra_seq = batch1 ? 8192 - max_seq : 40 * bs + 7;
  batch_from_lens(&hb, B, qlen, cached, bs, (extra_seq + bs - 1) / bs, extra_seq);
  const int T = hb.T;
  const size_t cache_n = (size_t)hb.num_blocks * n_kv * bs * hd, nq = (size_t)T * n_heads * hd;
  float *kf = malloc(cache_n * 4), *vf = malloc(cache_n * 4), *q = malloc(nq * 4);
  uint8_t *k8 = malloc(cache_n * 2), *v8 = malloc(cache_n * 2); /* the CUDA cache bytes */
  uint16_t *qb = malloc(nq * 2);
  pair_fill(kf, cache_n, f8 ? 2.0f : 1.0f);
  pair_fill(vf, cache_n, f8 ? 2.0f : 1.0f);
  pair_fill(q, nq, 1.0f);
  for (size_t i = 0; i < cache_n; i++) {
    if (f8) {
      k8[i] = f32_to_f8e4m3(kf[i]), v8[i] = f32_to_f8e4m3(vf[i]);
    } else {
      uint16_t kb = f32_to_bf16(kf[i]), vb = f32_to_bf16(vf[i]);
      memcpy(k8 + 2 * i, &kb, 2), memcpy(v8 + 2 * i, &vb, 2);
    }
  }
  for (size_t i = 0; i < nq; i++)
    qb[i] = f32_to_bf16(q[i]);
  const size_t cache_bytes = cache_n * (f8 ? 1 : 2), out_bytes = nq * 2;
  struct attn_params ap = {.n_heads = n_heads, .scale = 1.0f / sqrtf((float)hd), .softcap = softcap, .window = window};
  char what[160];
  snprintf(what, sizeof what, "decode fold %s bs%d h%d/kv%d hd%d window %d softcap %g%s (B=%d)",
           f8 ? "f8e4m3" : "bf16", bs, n_heads, n_kv, hd, window, (double)softcap, batch1 ? " batch-1" : "", B);

  /* the CPU reference */
  struct backend *cpu = pair_be[0];
  void *cb[6], *ck, *cv, *cq = pair_alloc1(0, nq * pair_esz(0)), *cout = pair_alloc1(0, nq * pair_esz(0));
  if (f8) {
    ck = be_put(cpu, k8, cache_n), cv = be_put(cpu, v8, cache_n);
  } else {
    ck = pair_alloc1(0, cache_n * pair_esz(0)), cv = pair_alloc1(0, cache_n * pair_esz(0));
    pair_put_act(0, ck, kf, cache_n), pair_put_act(0, cv, vf, cache_n);
  }
  pair_put_act(0, cq, q, nq);
  struct kv_layer ckv = {.k = ck, .v = cv, .k_scale = f8 ? 0.5f : 1.0f, .v_scale = f8 ? 2.0f : 1.0f,
                         .dtype = f8 ? DTYPE_F8E4M3 : cpu->act_dtype, .num_blocks = hb.num_blocks, .block_size = bs,
                         .n_kv_heads = n_kv, .head_dim = hd};
  struct batch cbat = dev_batch_be(cpu, &hb, cb);
  if (cpu->ops->attention(cpu, cout, cq, &ckv, &cbat, &ap))
    pair_die("attention (cpu)");
  float *ref = malloc(nq * 4 + 4), *got = malloc(nq * 4 + 4);
  pair_get_act(0, ref, cout, nq);

  /* both CUDA backends: fold off ([0]) and on ([1]) */
  void *db[2][6], *dk[2], *dv[2], *dq[2], *dout[2];
  struct kv_layer dkv[2];
  struct batch dbat[2];
  uint8_t *out[2];
  for (int j = 0; j < 2; j++) {
    struct backend *be = fold_be[j];
    dk[j] = be_put(be, k8, cache_bytes), dv[j] = be_put(be, v8, cache_bytes), dq[j] = be_put(be, qb, nq * 2);
    dout[j] = be->ops->alloc(be, out_bytes);
    if (!dout[j])
      pair_die("alloc");
    be_poison(be, dout[j], out_bytes);
    dkv[j] = ckv;
    dkv[j].k = dk[j], dkv[j].v = dv[j], dkv[j].dtype = f8 ? DTYPE_F8E4M3 : DTYPE_BF16;
    dbat[j] = dev_batch_be(be, &hb, db[j]);
    if (be->ops->attention(be, dout[j], dq[j], &dkv[j], &dbat[j], &ap))
      pair_die("attention (fold)");
    out[j] = be_get(be, dout[j], out_bytes);
  }
  size_t first = 0;
  int bad = bytes_differ(out[1], out[0], out_bytes, &first);
  CHECK(bad == 0, "%s: %d of %zu outputs differ between the fold and the reduce kernel (first at %zu)", what, bad,
        nq, first);
  for (size_t i = 0; i < nq; i++) {
    uint16_t x;
    memcpy(&x, out[1] + 2 * i, 2);
    got[i] = bf16_to_f32(x);
  }
  pair_expect(what, got, ref, nq, TOL_BF16_OUT);

  /* a second launch on the same scratch */
  struct backend *be = fold_be[1];
  be_poison(be, dout[1], out_bytes);
  if (be->ops->attention(be, dout[1], dq[1], &dkv[1], &dbat[1], &ap))
    pair_die("attention (fold, again)");
  uint8_t *again = be_get(be, dout[1], out_bytes);
  bad = bytes_differ(again, out[0], out_bytes, &first);
  CHECK(bad == 0, "%s: the second launch differs in %d outputs (first at %zu)", what, bad, first);
  free(again);

  /* CUDA graphs: a warm-up, the capture, one replay; then a replay after every context was
   * shortened under the graph (fewer partitions), against a direct launch of the reduce kernel */
  struct fold_rec rec = {be, dout[1], dq[1], &dkv[1], &dbat[1], &ap, 0};
  for (int run = 0; run < 4; run++) {
    if (run == 3) {
      int32_t *sl = malloc(sizeof(int32_t) * (size_t)B);
      for (int b = 0; b < B; b++)
        sl[b] = hb.seq_lens[b] > 1 ? hb.seq_lens[b] - pair_int(0, hb.seq_lens[b] - 1) : hb.seq_lens[b];
      for (int j = 0; j < 2; j++)
        if (fold_be[j]->ops->upload(fold_be[j], db[j][4], sl, sizeof(int32_t) * (size_t)B))
          pair_die("upload");
      free(sl);
      be_poison(fold_be[0], dout[0], out_bytes);
      if (fold_be[0]->ops->attention(fold_be[0], dout[0], dq[0], &dkv[0], &dbat[0], &ap))
        pair_die("attention (reduce, shorter)");
      free(out[0]);
      out[0] = be_get(fold_be[0], dout[0], out_bytes);
    }
    be_poison(be, dout[1], out_bytes);
    if (be->ops->graph_run(be, 7000 + key, fold_record, &rec))
      pair_die("graph_run (fold)");
    uint8_t *g = be_get(be, dout[1], out_bytes);
    bad = bytes_differ(g, out[0], out_bytes, &first);
    CHECK(bad == 0, "%s: graph run %d differs from the reduce kernel in %d outputs (first at %zu)", what, run, bad,
          first);
    free(g);
  }
  CHECK(rec.calls == 2, "%s: the graph was recorded %d times in 4 runs (2 expected: warm-up, capture)", what,
        rec.calls);

  for (int j = 0; j < 2; j++) {
    for (int k = 0; k < 6; k++)
      fold_be[j]->ops->free(fold_be[j], db[j][k]);
    fold_be[j]->ops->free(fold_be[j], dk[j]), fold_be[j]->ops->free(fold_be[j], dv[j]);
    fold_be[j]->ops->free(fold_be[j], dq[j]), fold_be[j]->ops->free(fold_be[j], dout[j]);
    free(out[j]);
  }
  for (int k = 0; k < 6; k++)
    cpu->ops->free(cpu, cb[k]);
  cpu->ops->free(cpu, ck), cpu->ops->free(cpu, cv), cpu->ops->free(cpu, cq), cpu->ops->free(cpu, cout);
  free(kf), free(vf), free(q), free(k8), free(v8), free(qb), free(ref), free(got);
  free_batch(&hb);
}

/* ---- fused ops (backend.h, "Fused small ops"): CUDA against the CPU's sequences, and against
 * the CUDA backend's own separate ops on the same inputs, which they must equal bit for bit
 * (same products, summation order and roundings). Shapes the fused kernels do not cover must
 * answer 1 with nothing done. ---- */

/* Backend i's act buffer of n elements, read back as floats (caller frees). */
static float *get_act_copy(int i, const void *d, size_t n) {
  float *h = malloc(n * 4 + 4);
  pair_get_act(i, h, d, n);
  return h;
}

static void *cuda_act_copy(const float *h, size_t n) {
  void *d = pair_alloc1(1, n * pair_esz(1));
  pair_put_act(1, d, h, n);
  return d;
}

/* A fused op's output F (cuda, N act elements) against C, the CPU's sequence (within bf16
 * tolerance), and S, the CUDA backend's own separate ops (byte for byte); SEQ names them. */
static void fused_expect(const char *what, const char *seq, const void *c, const void *s, const void *f, size_t n) {
  float *hc = get_act_copy(0, c, n), *hs = get_act_copy(1, s, n), *hf = get_act_copy(1, f, n);
  pair_expect(what, hf, hc, n, TOL_BF16_OUT);
  CHECK(memcmp(hf, hs, n * 4) == 0, "%s: differs from %s on cuda", what, seq);
  free(hc);
  free(hs);
  free(hf);
}

/* The matrices of a matmul_n check on both backends: N[m] x K weights (+-0.1) and their biases
 * (+-0.5), with WS / BS the arrays matmul_n takes per backend (biases on every matrix but k,
 * m = 1, when WITH_BIAS: mixed NULL and not). The CPU's weights alias WV / BV, freed after the
 * weights (matset_free). Used in place: WS points into the struct. */
struct matset {
  int n;
  struct weight w[3][2], b[3][2];
  const struct weight *ws[2][3], *bs[2][3];
  float *wv[3], *bv[3];
};

static void matset_make(struct matset *s, int n, const int *N, int K, int with_bias) {
  s->n = n;
  for (int m = 0; m < n; m++) {
    s->wv[m] = malloc(sizeof(float) * N[m] * K);
    s->bv[m] = malloc(4 * N[m]);
    pair_fill(s->wv[m], (size_t)N[m] * K, 0.1f);
    pair_fill(s->bv[m], (size_t)N[m], 0.5f);
    for (int i = 0; i < 2; i++) {
      s->w[m][i] = pair_weight(i, s->wv[m], N[m], K);
      s->b[m][i] = pair_weight(i, s->bv[m], 1, N[m]);
      s->ws[i][m] = &s->w[m][i];
      s->bs[i][m] = with_bias && m != 1 ? &s->b[m][i] : NULL;
    }
  }
}

static void matset_free(struct matset *s) {
  for (int m = 0; m < s->n; m++) {
    for (int i = 0; i < 2; i++) {
      pair_be[i]->ops->weight_free(pair_be[i], &s->w[m][i]);
      pair_be[i]->ops->weight_free(pair_be[i], &s->b[m][i]);
    }
    free(s->wv[m]);
    free(s->bv[m]);
  }
}

/* q/k/v (n = 3, Qwen2's biases) or gate/up (n = 2) through matmul_n. */
static void test_matmul_n(int T, int n, const int *N, int K, int with_bias, int expect_fused) {
  float *x = malloc(sizeof(float) * T * K);
  pair_fill(x, (size_t)T * K, 1.0f);
  struct matset ms;
  matset_make(&ms, n, N, K, with_bias);
  struct dbuf out[3];
  void *sep[3];
  for (int m = 0; m < n; m++) {
    out[m] = pair_poisoned((size_t)T * N[m]);
    sep[m] = pair_alloc1(1, (size_t)T * N[m] * pair_esz(1));
  }
  struct dbuf dx = pair_acts(x, (size_t)T * K);
  for (int i = 0; i < 2; i++) {
    void *outs[3];
    const struct weight *const *ws = ms.ws[i], *const *bs = ms.bs[i];
    for (int m = 0; m < n; m++)
      outs[m] = out[m].p[i];
    int rc = pair_be[i]->ops->matmul_n(pair_be[i], n, outs, dx.p[i], NULL, ws, bs, T);
    if (rc < 0)
      pair_die("matmul_n");
    if (i == 0)
      CHECK(rc == 0, "cpu matmul_n answered %d", rc);
    else
      CHECK(rc == (expect_fused ? 0 : 1), "cuda matmul_n T%d: answered %d, expected %d", T, rc, expect_fused ? 0 : 1);
    for (int m = 0; m < n && rc == 1; m++) /* not covered: the caller's separate matmuls */
      if (pair_be[i]->ops->matmul(pair_be[i], outs[m], dx.p[i], ws[m], bs[m], T, 0))
        pair_die("matmul");
    if (i == 1)
      for (int m = 0; m < n; m++)
        if (pair_be[1]->ops->matmul(pair_be[1], sep[m], dx.p[1], ws[m], bs[m], T, 0))
          pair_die("matmul");
  }
  for (int m = 0; m < n; m++) {
    char what[96];
    snprintf(what, sizeof what, "matmul_n T%d n%d [%d] N%d K%d%s", T, n, m, N[m], K, with_bias ? " +bias" : "");
    fused_expect(what, "the separate matmul", out[m].p[0], sep[m], out[m].p[1], (size_t)T * N[m]);
    pair_free(out[m]);
    pair_be[1]->ops->free(pair_be[1], sep[m]);
  }
  matset_free(&ms);
  pair_free(dx);
  free(x);
}

/* silu(x Wg^T) * (x Wu^T) in one launch (CUDA only; the CPU leaves the op NULL and its
 * reference is the sequence the model runs: two matmuls, silu_mul). */
static void test_matmul_silu_mul(int T, int F, int K, int expect_fused) {
  size_t nx = (size_t)T * K, no = (size_t)T * F;
  float *x = malloc(nx * 4), *wg = malloc((size_t)F * K * 4), *wu = malloc((size_t)F * K * 4);
  pair_fill(x, nx, 1.0f);
  pair_fill(wg, (size_t)F * K, 0.1f);
  pair_fill(wu, (size_t)F * K, 0.1f);
  struct weight g[2], u[2];
  for (int i = 0; i < 2; i++) {
    g[i] = pair_weight(i, wg, F, K);
    u[i] = pair_weight(i, wu, F, K);
  }
  struct dbuf dx = pair_acts(x, nx), gate = pair_poisoned(no), up = pair_poisoned(no), out = pair_poisoned(no);
  CHECK(pair_be[0]->ops->matmul_silu_mul == NULL, "cpu matmul_silu_mul is expected to be NULL");
  for (int i = 0; i < 2; i++) { /* the sequence on both: cpu reference, cuda separate ops */
    struct backend *be = pair_be[i];
    if (be->ops->matmul(be, gate.p[i], dx.p[i], &g[i], NULL, T, 0) ||
        be->ops->matmul(be, up.p[i], dx.p[i], &u[i], NULL, T, 0) ||
        be->ops->silu_mul(be, gate.p[i], gate.p[i], up.p[i], T, F))
      pair_die("gate/up/silu_mul");
  }
  int rc = pair_be[1]->ops->matmul_silu_mul(pair_be[1], out.p[1], dx.p[1], NULL, &g[1], &u[1], T);
  if (rc < 0)
    pair_die("matmul_silu_mul");
  CHECK(rc == (expect_fused ? 0 : 1), "cuda matmul_silu_mul T%d: answered %d, expected %d", T, rc,
        expect_fused ? 0 : 1);
  if (rc == 0) {
    char what[80];
    snprintf(what, sizeof what, "matmul_silu_mul T%d F%d K%d", T, F, K);
    fused_expect(what, "matmul, matmul, silu_mul", gate.p[0], gate.p[1], out.p[1], no);
  }
  for (int i = 0; i < 2; i++) {
    pair_be[i]->ops->weight_free(pair_be[i], &g[i]);
    pair_be[i]->ops->weight_free(pair_be[i], &u[i]);
  }
  pair_free(dx);
  pair_free(gate);
  pair_free(up);
  pair_free(out);
  free(x);
  free(wg);
  free(wu);
}

/* ---- The RMSNorm in the GEMV's prologue (struct backend_prenorm: matmul_n, matmul_silu_mul) and
 * the residual add in its epilogue (matmul_add). Each fused form must equal, byte for byte, the
 * CUDA backend's own sequence (rmsnorm, then the op without the prenorm; matmul into a buffer,
 * then rmsnorm's residual add), and the CPU's sequence within bf16 tolerance. Shapes the kernels
 * do not cover answer 1 with nothing written: T past the GEMV, x's rows past the prologue's
 * shared memory, quantized weights, and every call on a backend made with PAGODA_FUSED_NORM=0. */
#define PRE_SMEM 32768 /* cuda_backend.h CUDA_GEMV_PRE_SMEM: T * K * 2 bytes above it answer 1 */
#define PRE_EPS 1e-5f

/* The CUDA backends the fused forms run on: pair_be[1] (the prologue's default shape unless
 * PAGODA_GEMV_PRE_* are set), then PAGODA_GEMV_PRE_ROWS=4 and 16 (warps per block),
 * PAGODA_GEMV_PRE_LOOP=2 and 4 (rows per warp), PAGODA_GEMV_PRE_L2=1 (the first weight steps
 * prefetched into L2, not held in registers as by default); and one made with PAGODA_FUSED_NORM=0,
 * which must answer 1 to all of them. */
#define PRE_BES 6
static struct backend *pre_be[PRE_BES], *pre_off_be;
static struct backend *reg0_be; /* PAGODA_GEMV_REG=0: the plain GEMV's first steps into L2, not registers */

static void pre_open(void) {
  pre_be[0] = pair_be[1];
  pre_be[1] = pair_cuda_with_env("PAGODA_GEMV_PRE_ROWS", "4");
  pre_be[2] = pair_cuda_with_env("PAGODA_GEMV_PRE_ROWS", "16");
  pre_be[3] = pair_cuda_with_env("PAGODA_GEMV_PRE_LOOP", "2");
  pre_be[4] = pair_cuda_with_env("PAGODA_GEMV_PRE_LOOP", "4");
  pre_be[5] = pair_cuda_with_env("PAGODA_GEMV_PRE_L2", "1");
  pre_off_be = pair_cuda_with_env("PAGODA_FUSED_NORM", "0");
  reg0_be = pair_cuda_with_env("PAGODA_GEMV_REG", "0");
  if (!reg0_be)
    pair_die("cuda backend with PAGODA_GEMV_REG=0");
  for (int k = 1; k < PRE_BES; k++)
    if (!pre_be[k])
      pair_die("cuda backend with PAGODA_GEMV_PRE_*");
  if (!pre_off_be)
    pair_die("cuda backend with PAGODA_FUSED_NORM=0");
  static const char *bad_env[][2] = {
      {"PAGODA_GEMV_PRE_ROWS", "5"}, {"PAGODA_GEMV_PRE_LOOP", "3"}, {"PAGODA_GEMV_PRE_L2", "yes"},
      {"PAGODA_GEMV_REG", "2"},        {"PAGODA_QX_EARLY", "on"},   {"PAGODA_ATTN_EARLY", "x"},
      {"PAGODA_GEMV_PRE_SPLIT", "off"}, {"PAGODA_ROPE_KV_SPLIT", "2"}, {"PAGODA_QG_EVICT_FIRST", "2"},
      {"PAGODA_GEMV_RING_STORE", "2"},  {"PAGODA_QGEMV_RING", "on"},  {"PAGODA_QGEMV_RING_WARPS", "12"},
      {"PAGODA_QGEMV_RING_CHUNK", "1536"}, {"PAGODA_ATTN_EXIT_EARLY", "2"},
      {"PAGODA_ATTN_PREFETCH", "65536"} /* the kernels hold it in 16 bits */};
  for (int k = 0; k < (int)(sizeof bad_env / sizeof bad_env[0]); k++) { /* an unknown value is an error naming the variable */
    struct backend *bad = pair_cuda_with_env(bad_env[k][0], bad_env[k][1]);
    CHECK(bad == NULL, "%s=%s was accepted", bad_env[k][0], bad_env[k][1]);
    if (bad)
      bad->ops->destroy(bad);
    else
      CHECK(strstr(err_last(), bad_env[k][0]) != NULL, "%s=%s: message %s", bad_env[k][0], bad_env[k][1], err_last());
  }
}

static void pre_close(void) {
  for (int k = 1; k < PRE_BES; k++)
    pre_be[k]->ops->destroy(pre_be[k]);
  pre_off_be->ops->destroy(pre_off_be);
  reg0_be->ops->destroy(reg0_be);
}

/* Norm weights sit near 1 in real models; bf16-exact, so the bf16 form holds the same values. */
static float *pre_norm_values(int K) {
  float *nv = malloc(sizeof(float) * K);
  for (int d = 0; d < K; d++)
    nv[d] = bf16_to_f32(f32_to_bf16(1.0f + pair_rnd(0.5f)));
  return nv;
}

/* The norm weight NV(K) on backend i: f32 (what the loader makes of 1-D tensors) or, on cuda when
 * AS_BF16, bf16 (rmsnorm and the prologue take both). */
static struct weight pre_norm_weight(int i, const float *nv, int K, int as_bf16) {
  if (i == 0 || !as_bf16)
    return pair_weight(i, nv, 1, K);
  struct weight w = {.data = pair_alloc1(1, (size_t)K * 2), .dtype = DTYPE_BF16, .rows = 1, .cols = K};
  uint16_t *h = malloc((size_t)K * 2);
  for (int d = 0; d < K; d++)
    h[d] = f32_to_bf16(nv[d]);
  if (pair_be[1]->ops->upload(pair_be[1], w.data, h, (size_t)K * 2))
    pair_die("upload");
  free(h);
  return w;
}

/* Fills cuda buffer D (n act elements) with 0xff bytes (NaN) through pair_be[1], synchronised. */
static void cuda_poison(void *d, size_t n) {
  size_t bytes = n * pair_esz(1);
  void *t = malloc(bytes);
  memset(t, 0xff, bytes);
  if (pair_be[1]->ops->upload(pair_be[1], d, t, bytes) || pair_be[1]->ops->sync(pair_be[1]))
    pair_die("upload");
  free(t);
}

/* 1 when every byte of cuda buffer D (n act elements) is still 0xff. */
static int cuda_still_poisoned(const void *d, size_t n) {
  size_t bytes = n * pair_esz(1);
  unsigned char *t = malloc(bytes);
  if (pair_be[1]->ops->download(pair_be[1], t, d, bytes))
    pair_die("download");
  size_t k = 0;
  while (k < bytes && t[k] == 0xff)
    k++;
  free(t);
  return k == bytes;
}

/* Whether the prologue covers T rows of K (T within the GEMV, the rows within its shared memory). */
static int pre_covered(int T, int K) { return T <= 8 && (size_t)T * K * 2 <= PRE_SMEM; }

/* matmul_n with a prenorm: q/k/v (n = 3, biases on q and v when WITH_BIAS) or gate/up (n = 2). */
static void test_prenorm_matmul_n(int T, int n, const int *N, int K, int with_bias, int norm_bf16) {
  const int expect = pre_covered(T, K);
  const size_t nx = (size_t)T * K;
  float *x = malloc(nx * 4), *nv = pre_norm_values(K);
  pair_fill(x, nx, 2.0f);
  struct weight nw[2];
  struct matset ms;
  struct dbuf ref[3];
  void *fused[3], *outs[2][3];
  for (int i = 0; i < 2; i++)
    nw[i] = pre_norm_weight(i, nv, K, norm_bf16);
  matset_make(&ms, n, N, K, with_bias);
  const struct weight *const *const ws[2] = {ms.ws[0], ms.ws[1]}, *const *const bs[2] = {ms.bs[0], ms.bs[1]};
  for (int m = 0; m < n; m++) {
    ref[m] = pair_poisoned((size_t)T * N[m]); /* cpu: the reference; cuda: its own sequence */
    fused[m] = pair_alloc1(1, (size_t)T * N[m] * pair_esz(1));
    for (int i = 0; i < 2; i++)
      outs[i][m] = ref[m].p[i];
  }
  struct dbuf dx = pair_acts(x, nx), xn = pair_poisoned(nx);
  const struct backend_prenorm pre0 = {.w = &nw[0], .eps = PRE_EPS, .xn = xn.p[0]};
  int rc = pair_be[0]->ops->matmul_n(pair_be[0], n, outs[0], dx.p[0], &pre0, ws[0], bs[0], T);
  CHECK(rc == 0, "cpu matmul_n with a prenorm answered %d", rc);
  struct backend *g = pair_be[1]; /* the sequence blocks.c falls back to */
  if (g->ops->rmsnorm(g, xn.p[1], NULL, dx.p[1], &nw[1], T, K, PRE_EPS))
    pair_die("rmsnorm");
  rc = g->ops->matmul_n(g, n, outs[1], xn.p[1], NULL, ws[1], bs[1], T);
  for (int m = 0; m < n && rc == 1; m++)
    if (g->ops->matmul(g, outs[1][m], xn.p[1], ws[1][m], bs[1][m], T, 0))
      pair_die("matmul");
  if (rc < 0 || g->ops->sync(g))
    pair_die("matmul_n");
  char what[128];
  snprintf(what, sizeof what, "prenorm matmul_n T%d n%d N%d K%d%s, %s norm weight", T, n, N[0], K,
           with_bias ? " +bias" : "", norm_bf16 ? "bf16" : "f32");
  for (int k = 0; k <= PRE_BES; k++) {
    struct backend *be = k < PRE_BES ? pre_be[k] : pre_off_be;
    const int want = k < PRE_BES ? expect : 0;
    for (int m = 0; m < n; m++)
      cuda_poison(fused[m], (size_t)T * N[m]);
    const struct backend_prenorm pre = {.w = &nw[1], .eps = PRE_EPS, .xn = xn.p[1]};
    rc = be->ops->matmul_n(be, n, fused, dx.p[1], &pre, ws[1], bs[1], T);
    if (rc < 0 || be->ops->sync(be))
      pair_die("matmul_n with a prenorm");
    CHECK(rc == (want ? 0 : 1), "%s, cuda backend %d: answered %d, expected %d", what, k, rc, want ? 0 : 1);
    for (int m = 0; m < n; m++) {
      size_t cnt = (size_t)T * N[m];
      if (rc != 0) {
        CHECK(cuda_still_poisoned(fused[m], cnt), "%s, cuda backend %d: answered 1 but wrote output %d", what, k, m);
        continue;
      }
      char w2[160];
      snprintf(w2, sizeof w2, "%s [%d], backend %d", what, m, k);
      fused_expect(w2, "rmsnorm + matmul_n", ref[m].p[0], ref[m].p[1], fused[m], cnt);
    }
  }
  for (int m = 0; m < n; m++) {
    pair_free(ref[m]);
    pair_be[1]->ops->free(pair_be[1], fused[m]);
  }
  matset_free(&ms);
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->weight_free(pair_be[i], &nw[i]);
  pair_free(dx);
  pair_free(xn);
  free(x);
  free(nv);
}

/* matmul_silu_mul with a prenorm. CPU reference: rmsnorm, two matmuls, silu_mul (its op is NULL);
 * CUDA: rmsnorm, then matmul_silu_mul without the prenorm (byte-equal to the separate ops). */
static void test_prenorm_silu_mul(int T, int F, int K, int norm_bf16) {
  const int expect = pre_covered(T, K);
  const size_t nx = (size_t)T * K, no = (size_t)T * F;
  float *x = malloc(nx * 4), *nv = pre_norm_values(K), *wg = malloc((size_t)F * K * 4), *wu = malloc((size_t)F * K * 4);
  pair_fill(x, nx, 2.0f);
  pair_fill(wg, (size_t)F * K, 0.1f);
  pair_fill(wu, (size_t)F * K, 0.1f);
  struct weight nw[2], g[2], u[2];
  for (int i = 0; i < 2; i++) {
    nw[i] = pre_norm_weight(i, nv, K, norm_bf16);
    g[i] = pair_weight(i, wg, F, K);
    u[i] = pair_weight(i, wu, F, K);
  }
  struct dbuf dx = pair_acts(x, nx), xn = pair_poisoned(nx), gate = pair_poisoned(no), up = pair_poisoned(no);
  void *fused = pair_alloc1(1, no * pair_esz(1));
  for (int i = 0; i < 2; i++) {
    struct backend *be = pair_be[i];
    if (be->ops->rmsnorm(be, xn.p[i], NULL, dx.p[i], &nw[i], T, K, PRE_EPS))
      pair_die("rmsnorm");
    int rc = i == 1 ? be->ops->matmul_silu_mul(be, gate.p[1], xn.p[1], NULL, &g[1], &u[1], T) : 1;
    if (rc < 0)
      pair_die("matmul_silu_mul");
    if (rc == 1 && (be->ops->matmul(be, gate.p[i], xn.p[i], &g[i], NULL, T, 0) ||
                    be->ops->matmul(be, up.p[i], xn.p[i], &u[i], NULL, T, 0) ||
                    be->ops->silu_mul(be, gate.p[i], gate.p[i], up.p[i], T, F)))
      pair_die("gate/up/silu_mul");
    if (be->ops->sync(be))
      pair_die("sync");
  }
  char what[128];
  snprintf(what, sizeof what, "prenorm matmul_silu_mul T%d F%d K%d, %s norm weight", T, F, K, norm_bf16 ? "bf16" : "f32");
  for (int k = 0; k <= PRE_BES; k++) {
    struct backend *be = k < PRE_BES ? pre_be[k] : pre_off_be;
    const int want = k < PRE_BES ? expect : 0;
    cuda_poison(fused, no);
    const struct backend_prenorm pre = {.w = &nw[1], .eps = PRE_EPS, .xn = xn.p[1]};
    int rc = be->ops->matmul_silu_mul(be, fused, dx.p[1], &pre, &g[1], &u[1], T);
    if (rc < 0 || be->ops->sync(be))
      pair_die("matmul_silu_mul with a prenorm");
    CHECK(rc == (want ? 0 : 1), "%s, cuda backend %d: answered %d, expected %d", what, k, rc, want ? 0 : 1);
    if (rc != 0) {
      CHECK(cuda_still_poisoned(fused, no), "%s, cuda backend %d: answered 1 but wrote the output", what, k);
      continue;
    }
    char w2[160];
    snprintf(w2, sizeof w2, "%s, backend %d", what, k);
    fused_expect(w2, "rmsnorm + matmul_silu_mul", gate.p[0], gate.p[1], fused, no);
  }
  for (int i = 0; i < 2; i++) {
    pair_be[i]->ops->weight_free(pair_be[i], &nw[i]);
    pair_be[i]->ops->weight_free(pair_be[i], &g[i]);
    pair_be[i]->ops->weight_free(pair_be[i], &u[i]);
  }
  pair_be[1]->ops->free(pair_be[1], fused);
  pair_free(dx);
  pair_free(xn);
  pair_free(gate);
  pair_free(up);
  free(x);
  free(nv);
  free(wg);
  free(wu);
}

/* matmul_add: resid(T, N) += x(T, K) @ W^T. CUDA sequence: matmul into a buffer, then rmsnorm with
 * that buffer as x and RESID as its residual (the add + rmsnorm op the forward ran between the
 * sub-blocks); the residual buffers must be byte-equal. CPU: its matmul_add (the sequence). */
static void test_matmul_add(int T, int N, int K, int expect) {
  const size_t nx = (size_t)T * K, nr = (size_t)T * N;
  float *x = malloc(nx * 4), *r = malloc(nr * 4), *wv = malloc((size_t)N * K * 4), *nv = pre_norm_values(N);
  pair_fill(x, nx, 1.0f);
  pair_fill(r, nr, 2.0f);
  pair_fill(wv, (size_t)N * K, 0.1f);
  struct weight w[2];
  for (int i = 0; i < 2; i++)
    w[i] = pair_weight(i, wv, N, K);
  struct weight nw = pair_weight(1, nv, 1, N);
  struct dbuf dx = pair_acts(x, nx), resid = pair_acts(r, nr), scratch = pair_poisoned(nr);
  void *seq = cuda_act_copy(r, nr), *normed = pair_alloc1(1, nr * pair_esz(1));
  int rc = pair_be[0]->ops->matmul_add(pair_be[0], resid.p[0], dx.p[0], &w[0], scratch.p[0], T);
  CHECK(rc == 0, "cpu matmul_add answered %d", rc);
  struct backend *g = pair_be[1];
  if (g->ops->matmul(g, scratch.p[1], dx.p[1], &w[1], NULL, T, 0) ||
      g->ops->rmsnorm(g, normed, seq, scratch.p[1], &nw, T, N, PRE_EPS))
    pair_die("matmul + rmsnorm's residual add");
  rc = g->ops->matmul_add(g, resid.p[1], dx.p[1], &w[1], scratch.p[1], T);
  if (rc < 0)
    pair_die("matmul_add");
  CHECK(rc == (expect ? 0 : 1), "cuda matmul_add T%d N%d K%d: answered %d, expected %d", T, N, K, rc, expect ? 0 : 1);
  char what[96];
  snprintf(what, sizeof what, "matmul_add T%d N%d K%d", T, N, K);
  float *f = get_act_copy(1, resid.p[1], nr);
  if (rc == 0) {
    fused_expect(what, "matmul + rmsnorm's residual add", resid.p[0], seq, resid.p[1], nr);
    /* PAGODA_GEMV_REG=0 (the first weight steps prefetched into L2): the same bytes */
    void *r0 = cuda_act_copy(r, nr);
    if (pair_be[1]->ops->sync(pair_be[1])) /* the upload ran on pair_be[1]'s stream, reg0_be has its own */
      pair_die("upload");
    int rc0 = reg0_be->ops->matmul_add(reg0_be, r0, dx.p[1], &w[1], scratch.p[1], T);
    if (rc0 < 0 || reg0_be->ops->sync(reg0_be))
      pair_die("matmul_add with PAGODA_GEMV_REG=0");
    float *f0 = get_act_copy(1, r0, nr);
    CHECK(rc0 == 0 && memcmp(f, f0, nr * 4) == 0, "%s with PAGODA_GEMV_REG=0: answered %d or other bytes", what, rc0);
    free(f0);
    pair_be[1]->ops->free(pair_be[1], r0);
  } else
    CHECK(memcmp(f, r, nr * 4) == 0, "%s: answered 1 but changed the residual", what);
  /* PAGODA_FUSED_NORM=0: 1, the residual untouched */
  rc = pre_off_be->ops->matmul_add(pre_off_be, resid.p[1], dx.p[1], &w[1], scratch.p[1], T);
  CHECK(rc == 1, "%s with PAGODA_FUSED_NORM=0: answered %d", what, rc);
  float *f2 = get_act_copy(1, resid.p[1], nr);
  CHECK(memcmp(f, f2, nr * 4) == 0, "%s with PAGODA_FUSED_NORM=0: changed the residual", what);
  free(f);
  free(f2);
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->weight_free(pair_be[i], &w[i]);
  pair_be[1]->ops->weight_free(pair_be[1], &nw);
  pair_be[1]->ops->free(pair_be[1], seq);
  pair_be[1]->ops->free(pair_be[1], normed);
  pair_free(dx);
  pair_free(resid);
  pair_free(scratch);
  free(x);
  free(r);
  free(wv);
  free(nv);
}

/* What the fused forms refuse, besides the shapes above: a norm weight whose size is not K is an
 * error naming it, and the backend stays usable. (Quantized weights have prologue and epilogue
 * forms of their own: test_cuda_quant.) */
static void test_prenorm_refusals(void) {
  const int N = 64, K = 256, T = 1;
  float *x = malloc(sizeof(float) * T * K), *nv = pre_norm_values(K), *wv = malloc(sizeof(float) * N * K);
  pair_fill(x, (size_t)T * K, 1.0f);
  pair_fill(wv, (size_t)N * K, 0.1f);
  struct backend *g = pair_be[1];
  struct weight wb = pair_weight(1, wv, N, K), nw_short = pair_weight(1, nv, 1, K - 8);
  void *dx = cuda_act_copy(x, (size_t)T * K), *xn = pair_alloc1(1, (size_t)T * K * 2), *o1 = pair_alloc1(1, (size_t)T * N * 2);
  void *outs[1] = {o1};
  const struct weight *wbs[1] = {&wb}, *nob[1] = {NULL};
  const struct backend_prenorm bad = {.w = &nw_short, .eps = PRE_EPS, .xn = xn};
  CHECK(g->ops->matmul_n(g, 1, outs, dx, &bad, wbs, nob, T) == -1, "a norm weight of K - 8 elements was accepted");
  CHECK(strstr(err_last(), "norm weight has 248 elements") != NULL, "norm weight size message: %s", err_last());
  CHECK(g->ops->sync(g) == 0, "the stream is not usable after a refused prenorm: %s", err_last());
  g->ops->weight_free(g, &wb);
  g->ops->weight_free(g, &nw_short);
  g->ops->free(g, dx);
  g->ops->free(g, xn);
  g->ops->free(g, o1);
  free(x);
  free(nv);
  free(wv);
}

/* The grid of the prenorm / matmul_add checks: T = 1..9 (9: past the GEMV) over K = 2048 and 4096
 * (Llama-3.2-1B's and -3.1-8B's dim; at 4096 T > 4 exceeds the prologue's shared memory), K not a
 * multiple of 256 and dims around rmsnorm's 1024-thread switch (520, 1000, 1024, 1032), f32 and
 * bf16 norm weights alternating; row counts that leave the last block of 4, 8 and 16 warps part
 * empty; then Llama-3.2-1B's own q/k/v and gate/up at T = 1. */
static void test_prenorm_grid(void) {
  pre_open();
  static const int Ks[] = {2048, 4096, 1000, 520, 1024, 1032};
  const int qkv[3] = {384, 128, 124}, gu[2] = {1001, 1001};
  int cases = 0;
  for (int T = 1; T <= 9; T++)
    for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++, cases += 4) {
      const int K = Ks[k], nb = (T + (int)k) % 2;
      test_prenorm_matmul_n(T, 3, qkv, K, T % 2 == 0, nb);
      test_prenorm_matmul_n(T, 2, gu, K, 0, !nb);
      test_prenorm_silu_mul(T, gu[0], K, nb);
      test_matmul_add(T, qkv[0] + 5, K, T <= 8);
    }
  const int qkv1b[3] = {2048, 512, 512};
  test_prenorm_matmul_n(1, 3, qkv1b, 2048, 0, 0);
  test_prenorm_silu_mul(1, 8192, 2048, 0);
  test_matmul_add(1, 2048, 8192, 1); /* down */
  test_matmul_add(1, 2048, 2048, 1); /* o */
  test_prenorm_refusals();
  printf("  prenorm / matmul_add: %d cases + the 1B shapes\n", cases);
  pre_close();
}

/* rope_kv_write over a batch of shape SH (mixed: decode and prompt tokens, padded sequences; or
 * decode only), one padding slot -1: q, k and both caches against the CPU's rope + kv_write (bf16
 * cache) and, byte for byte, against the CUDA backend's own rope + kv_write (bf16 and f8e4m3
 * caches). ROT < HD is a
 * partial rotation; LONGROPE adds the long table, chosen per sequence, and an mscale. */
static void test_rope_kv_write_shape(int hd, int nh, int nkv, int bs, int neox, int rot, int longrope, int f8,
                                     enum shape sh) {
  struct host_batch hb;
  make_batch(&hb, sh, bs, 0, 1);
  const int T = hb.T, half = rot / 2;
  if (T > 1)
    hb.slots[T - 1] = -1;
  size_t cache_n = (size_t)hb.num_blocks * nkv * bs * hd, nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *kh = malloc(cache_n * 4),
        *vh = malloc(cache_n * 4), inv[512];
  pair_fill(q, nq, 1.0f);
  pair_fill(k, nk, 1.0f);
  pair_fill(v, nk, 1.0f);
  pair_fill(kh, cache_n, 1.0f);
  pair_fill(vh, cache_n, 1.0f);
  llama3_inv_freq(inv, half, 500000.0f);
  for (int i = 0; i < half; i++)
    inv[half + i] = inv[i] / (1.0f + 0.5f * i);
  uint8_t *k8 = malloc(cache_n), *v8 = malloc(cache_n);
  for (size_t i = 0; i < cache_n; i++) {
    k8[i] = f32_to_f8e4m3(kh[i]);
    v8[i] = f32_to_f8e4m3(vh[i]);
  }
  size_t cache_bytes = f8 ? cache_n : cache_n * pair_esz(1);
  struct dbuf dq = pair_acts(q, nq), dk = pair_acts(k, nk), dv = pair_acts(v, nk),
              dinv = pair_bytes(inv, sizeof(float) * 2 * half);
  struct dbuf dkc = f8 ? pair_bytes(k8, cache_n) : pair_acts(kh, cache_n),
              dvc = f8 ? pair_bytes(v8, cache_n) : pair_acts(vh, cache_n);
  /* the separate-op copies on cuda */
  void *q2 = cuda_act_copy(q, nq), *k2 = cuda_act_copy(k, nk), *kc2 = pair_alloc1(1, cache_bytes),
       *vc2 = pair_alloc1(1, cache_bytes);
  if (f8) {
    pair_be[1]->ops->upload(pair_be[1], kc2, k8, cache_n);
    pair_be[1]->ops->upload(pair_be[1], vc2, v8, cache_n);
  } else {
    pair_put_act(1, kc2, kh, cache_n);
    pair_put_act(1, vc2, vh, cache_n);
  }
  void *bufs[2][6];
  for (int i = 0; i < 2; i++) {
    struct backend *be = pair_be[i];
    struct batch b = dev_batch(i, &hb, bufs[i]);
    struct rope_params rp = {.inv_freq = dinv.p[i], .rot_dim = rot, .neox = neox};
    if (longrope) {
      rp.inv_freq_long = (const float *)dinv.p[i] + half;
      rp.long_after = 60;
      rp.query_start = b.query_start;
      rp.seq_lens = b.seq_lens;
      rp.num_seqs = b.num_seqs;
      rp.mscale = 1.19f;
    }
    struct kv_layer kv = {.k = dkc.p[i], .v = dvc.p[i], .k_scale = f8 ? 0.5f : 1.0f, .v_scale = f8 ? 2.0f : 1.0f,
                          .dtype = f8 ? DTYPE_F8E4M3 : be->act_dtype, .num_blocks = hb.num_blocks,
                          .block_size = bs, .n_kv_heads = nkv, .head_dim = hd};
    int rc = be->ops->rope_kv_write(be, dq.p[i], dk.p[i], dv.p[i], &kv, &b, nh, &rp);
    if (rc < 0)
      pair_die("rope_kv_write");
    CHECK(rc == 0, "%s rope_kv_write answered %d", be->ops->name, rc);
    if (i == 1) {
      kv.k = kc2;
      kv.v = vc2;
      if (be->ops->rope(be, q2, k2, b.positions, T, nh, nkv, hd, &rp) || be->ops->kv_write(be, &kv, k2, dv.p[1], &b))
        pair_die("rope + kv_write");
    }
  }
  char what[128];
  snprintf(what, sizeof what, "rope_kv_write hd%d h%d/kv%d bs%d %s rot%d%s%s (T=%d)", hd, nh, nkv, bs,
           neox ? "neox" : "gptj", rot, longrope ? " longrope" : "", f8 ? " f8e4m3" : "", T);
  float *c, *g, *s;
  pair_get_both(dq, nq, &c, &g);
  s = get_act_copy(1, q2, nq);
  pair_expect(what, g, c, nq, TOL_BF16_OUT);
  CHECK(memcmp(g, s, nq * 4) == 0, "%s: q differs from cuda rope", what);
  free(c);
  free(g);
  free(s);
  pair_get_both(dk, nk, &c, &g);
  s = get_act_copy(1, k2, nk);
  pair_expect(what, g, c, nk, TOL_BF16_OUT);
  CHECK(memcmp(g, s, nk * 4) == 0, "%s: k differs from cuda rope", what);
  free(c);
  free(g);
  free(s);
  void *caches[2][2] = {{dkc.p[1], kc2}, {dvc.p[1], vc2}};
  for (int kvi = 0; kvi < 2; kvi++) {
    uint8_t *a = malloc(cache_bytes), *b2 = malloc(cache_bytes);
    pair_be[1]->ops->download(pair_be[1], a, caches[kvi][0], cache_bytes);
    pair_be[1]->ops->download(pair_be[1], b2, caches[kvi][1], cache_bytes);
    CHECK(memcmp(a, b2, cache_bytes) == 0, "%s: %s cache differs from cuda rope + kv_write", what, kvi ? "v" : "k");
    free(a);
    free(b2);
    if (!f8) {
      pair_check(what, kvi ? dvc : dkc, cache_n, TOL_BF16_OUT);
    }
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 6; j++)
      pair_be[i]->ops->free(pair_be[i], bufs[i][j]);
  void *c2[4] = {q2, k2, kc2, vc2};
  for (int j = 0; j < 4; j++)
    pair_be[1]->ops->free(pair_be[1], c2[j]);
  pair_free(dq);
  pair_free(dk);
  pair_free(dv);
  pair_free(dinv);
  pair_free(dkc);
  pair_free(dvc);
  free(q);
  free(k);
  free(v);
  free(kh);
  free(vh);
  free(k8);
  free(v8);
  free_batch(&hb);
}

/* A mixed batch (a block of the kernel's grid may hold several tokens' items) and decode tokens
 * only (the most blocks per token: rope_kv_write spreads a token over several, cuda_ops.cu). */
static void test_rope_kv_write(int hd, int nh, int nkv, int bs, int neox, int rot, int longrope, int f8) {
  test_rope_kv_write_shape(hd, nh, nkv, bs, neox, rot, longrope, f8, SHAPE_MIXED);
  test_rope_kv_write_shape(hd, nh, nkv, bs, neox, rot, longrope, f8, SHAPE_DECODE);
}

/* ---- matmul_qkv_rope (q/k/v, RoPE and the KV write in one kernel, cuda_gemv.cu) against the CUDA
 * backend's own sequence, matmul_n then rope_kv_write (with a prenorm: rmsnorm first), byte for
 * byte in q, k, v and both caches, and against the CPU's op (its sequence, cpu_fused.c) within
 * bf16 tolerance (the caches too when bf16). A decode batch of T sequences with distinct
 * positions and slots, one slot -1 (padding) when T > 1, in a pool of random blocks holding
 * random bytes. What the kernel does not cover must answer 1 and leave every buffer as it was. */
struct qkv_case {
  int hd, nh, nkv, rot, neox, K;
};

/* The initial contents of a cache of N elements: random bf16-exact values and their e4m3 codes. */
struct qkv_cache0 {
  float *h;
  uint8_t *f8;
};

/* A CUDA cache holding the initial contents C0 (F8: the e4m3 codes). */
static void *qkv_cache_copy(const struct qkv_cache0 *c0, size_t n, int f8) {
  return f8 ? be_put(pair_be[1], c0->f8, n) : cuda_act_copy(c0->h, n);
}

/* Backends for the fused op: those of the prenorm checks (pre_be: the prologue's shapes), which
 * all take it; one made with PAGODA_FUSED_ROPE=0 and one with PAGODA_FUSED_OPS=0, which answer 1. */
static struct backend *qkv_off_be[2];

/* Checks cuda buffer D (BYTES) equals REF (host bytes); WHAT names it. */
static void qkv_same(const char *what, const char *name, const void *d, const uint8_t *ref, size_t bytes) {
  uint8_t *h = be_get(pair_be[1], d, bytes);
  size_t first = 0;
  int bad = bytes_differ(h, ref, bytes, &first);
  CHECK(bad == 0, "%s: %s differs from matmul_n + rope_kv_write in %d bytes (first near element %zu)", what, name, bad,
        first);
  free(h);
}

/* Q8: the CUDA calls take Q8_0 weights (the integer-dot GEMV with the same epilogue,
 * cuda_quant_gemv.cu); the CPU's op then has the bf16 ones and only the byte-for-byte checks
 * against CUDA's own sequence apply (matmul_n on Q8_0 is checked against references in
 * test_cuda_quant). */
static void test_matmul_qkv_rope(const struct qkv_case *qc, int T, int bs, int f8, int with_bias, int prenorm, int q8) {
  const int hd = qc->hd, nh = qc->nh, nkv = qc->nkv, K = qc->K, half = qc->rot / 2;
  const int N[3] = {nh * hd, nkv * hd, nkv * hd};
  int qlen[8], cached[8];
  for (int s = 0; s < T; s++)
    qlen[s] = 1, cached[s] = 3 + 41 * s + pair_int(0, 30); /* distinct positions */
  struct host_batch hb;
  batch_from_lens(&hb, T, qlen, cached, bs, 0, 0);
  if (T > 1)
    hb.slots[T - 2] = -1;
  const size_t cache_n = (size_t)hb.num_blocks * nkv * bs * hd, nx = (size_t)T * K;
  const size_t cache_bytes = f8 ? cache_n : cache_n * pair_esz(1);
  float *x = malloc(nx * 4), *nv = pre_norm_values(K), inv[256];
  pair_fill(x, nx, prenorm ? 2.0f : 1.0f);
  llama3_inv_freq(inv, half, 500000.0f);
  struct qkv_cache0 c0[2];
  for (int c = 0; c < 2; c++) {
    c0[c].h = malloc(cache_n * 4);
    c0[c].f8 = malloc(cache_n);
    pair_fill(c0[c].h, cache_n, 1.0f);
    for (size_t i = 0; i < cache_n; i++)
      c0[c].f8[i] = f32_to_f8e4m3(c0[c].h[i]);
  }
  struct matset ms;
  matset_make(&ms, 3, N, K, with_bias);
  struct weight wq8[3];
  const struct weight *wsq[3];
  for (int m = 0; q8 && m < 3; m++) {
    uint8_t *h = malloc(dtype_row_bytes(DTYPE_Q8_0, K) * N[m]);
    fill_q8_0(h, (size_t)N[m] * K);
    if (pair_be[1]->ops->weight_from_host(pair_be[1], &wq8[m], h, DTYPE_Q8_0, N[m], K))
      pair_die("weight_from_host q8_0");
    wsq[m] = &wq8[m];
    free(h);
  }
  const struct weight *const *wsg = q8 ? wsq : ms.ws[1]; /* the CUDA calls' weights */
  struct weight nw[2];
  for (int i = 0; i < 2; i++)
    nw[i] = pre_norm_weight(i, nv, K, T % 2);
  struct dbuf dx = pair_acts(x, nx), xn = pair_poisoned(nx), dinv = pair_bytes(inv, sizeof(float) * half);
  struct dbuf ref[3], kc[2]; /* cpu: the reference; cuda: the CUDA sequence */
  for (int m = 0; m < 3; m++)
    ref[m] = pair_poisoned((size_t)T * N[m]);
  for (int c = 0; c < 2; c++)
    kc[c] = f8 ? pair_bytes(c0[c].f8, cache_n) : pair_acts(c0[c].h, cache_n);
  void *bufs[2][6];
  struct batch b[2];
  struct rope_params rp[2];
  struct kv_layer kv[2];
  for (int i = 0; i < 2; i++) {
    b[i] = dev_batch(i, &hb, bufs[i]);
    rp[i] = (struct rope_params){.inv_freq = dinv.p[i], .rot_dim = qc->rot, .neox = qc->neox};
    kv[i] = (struct kv_layer){.k = kc[0].p[i], .v = kc[1].p[i], .k_scale = f8 ? 0.5f : 1.0f,
                              .v_scale = f8 ? 2.0f : 1.0f, .dtype = f8 ? DTYPE_F8E4M3 : pair_be[i]->act_dtype,
                              .num_blocks = hb.num_blocks, .block_size = bs, .n_kv_heads = nkv, .head_dim = hd};
  }
  /* the CPU's op (its sequence) */
  const struct backend_prenorm pre0 = {.w = &nw[0], .eps = PRE_EPS, .xn = xn.p[0]};
  int rc = pair_be[0]->ops->matmul_qkv_rope(pair_be[0], ref[0].p[0], ref[1].p[0], ref[2].p[0], dx.p[0],
                                            prenorm ? &pre0 : NULL, ms.ws[0], ms.bs[0], &kv[0], &b[0], nh, &rp[0]);
  CHECK(rc == 0, "cpu matmul_qkv_rope answered %d", rc);
  /* the CUDA sequence blocks.c falls back to */
  struct backend *g = pair_be[1];
  const void *gx = dx.p[1];
  if (prenorm) {
    if (g->ops->rmsnorm(g, xn.p[1], NULL, dx.p[1], &nw[1], T, K, PRE_EPS))
      pair_die("rmsnorm");
    gx = xn.p[1];
  }
  void *outs[3] = {ref[0].p[1], ref[1].p[1], ref[2].p[1]};
  rc = g->ops->matmul_n(g, 3, outs, gx, NULL, wsg, ms.bs[1], T);
  CHECK(rc == 0, "cuda matmul_n T%d answered %d", T, rc);
  rc = g->ops->rope_kv_write(g, outs[0], outs[1], outs[2], &kv[1], &b[1], nh, &rp[1]);
  CHECK(rc == 0, "cuda rope_kv_write answered %d", rc);
  if (g->ops->sync(g))
    pair_die("matmul_n + rope_kv_write");
  uint8_t *want[5];
  for (int m = 0; m < 3; m++)
    want[m] = be_get(g, outs[m], (size_t)T * N[m] * 2);
  for (int c = 0; c < 2; c++)
    want[3 + c] = be_get(g, kc[c].p[1], cache_bytes);
  char what[160];
  snprintf(what, sizeof what, "matmul_qkv_rope hd%d rot%d h%d/kv%d K%d T%d bs%d %s%s%s%s%s", hd, qc->rot, nh, nkv, K,
           T, bs, qc->neox ? "neox" : "interleaved", f8 ? " f8e4m3" : "", with_bias ? " +bias" : "",
           prenorm ? " prenorm" : "", q8 ? " q8_0" : "");
  /* the fused op on every backend: fresh outputs (poisoned) and caches (the initial contents);
   * quantized weights take the prologue at any T the GEMV takes (x is normalized as it is
   * quantized: no shared-memory limit) */
  const int covered = q8 || !prenorm || pre_covered(T, K);
  const int nbe = prenorm ? PRE_BES + 2 : 3;
  for (int k = 0; k < nbe; k++) {
    const int off = k >= nbe - 2;
    if (q8 && !off && k > 0)
      continue; /* pre_be[k]'s shapes are the bf16 prologue's; a quantized weight sizes the x
                 * quantization's scratch of the backend it was uploaded to (pair_be[1]) only */
    struct backend *be = off ? qkv_off_be[k - (nbe - 2)] : prenorm ? pre_be[k] : pair_be[1];
    void *o[3], *c[2];
    for (int m = 0; m < 3; m++) {
      o[m] = pair_alloc1(1, (size_t)T * N[m] * 2);
      cuda_poison(o[m], (size_t)T * N[m]);
    }
    for (int j = 0; j < 2; j++)
      c[j] = qkv_cache_copy(&c0[j], cache_n, f8);
    struct kv_layer kvf = kv[1];
    kvf.k = c[0];
    kvf.v = c[1];
    const struct backend_prenorm pre = {.w = &nw[1], .eps = PRE_EPS, .xn = xn.p[1]};
    if (pair_be[1]->ops->sync(pair_be[1]))
      pair_die("sync");
    rc = be->ops->matmul_qkv_rope(be, o[0], o[1], o[2], dx.p[1], prenorm ? &pre : NULL, wsg, ms.bs[1], &kvf, &b[1], nh,
                                  &rp[1]);
    if (rc < 0 || be->ops->sync(be))
      pair_die("matmul_qkv_rope");
    const int expect = off ? 1 : covered ? 0 : 1;
    CHECK(rc == expect, "%s, backend %d: answered %d, expected %d", what, k, rc, expect);
    if (rc == 0) {
      static const char *const names[5] = {"q", "k", "v", "k cache", "v cache"};
      for (int m = 0; m < 3; m++) {
        char w2[200];
        snprintf(w2, sizeof w2, "%s [%s] backend %d", what, names[m], k);
        if (!q8) {
          float *hc = get_act_copy(0, ref[m].p[0], (size_t)T * N[m]), *hf = get_act_copy(1, o[m], (size_t)T * N[m]);
          pair_expect(w2, hf, hc, (size_t)T * N[m], TOL_BF16_OUT);
          free(hc);
          free(hf);
        }
        qkv_same(w2, names[m], o[m], want[m], (size_t)T * N[m] * 2);
      }
      for (int j = 0; j < 2; j++) {
        char w2[200];
        snprintf(w2, sizeof w2, "%s [%s] backend %d", what, names[3 + j], k);
        qkv_same(w2, names[3 + j], c[j], want[3 + j], cache_bytes);
        if (!f8 && !q8) {
          float *hc = get_act_copy(0, kc[j].p[0], cache_n), *hf = get_act_copy(1, c[j], cache_n);
          pair_expect(w2, hf, hc, cache_n, TOL_BF16_OUT);
          free(hc);
          free(hf);
        }
      }
    } else { /* nothing written */
      for (int m = 0; m < 3; m++)
        CHECK(cuda_still_poisoned(o[m], (size_t)T * N[m]), "%s, backend %d: answered 1 but wrote output %d", what, k, m);
      void *fresh[2];
      for (int j = 0; j < 2; j++) {
        fresh[j] = qkv_cache_copy(&c0[j], cache_n, f8);
        uint8_t *h0 = be_get(pair_be[1], fresh[j], cache_bytes);
        qkv_same(what, j ? "v cache (answered 1)" : "k cache (answered 1)", c[j], h0, cache_bytes);
        free(h0);
        pair_be[1]->ops->free(pair_be[1], fresh[j]);
      }
    }
    for (int m = 0; m < 3; m++)
      pair_be[1]->ops->free(pair_be[1], o[m]);
    for (int j = 0; j < 2; j++)
      pair_be[1]->ops->free(pair_be[1], c[j]);
  }
  for (int m = 0; m < 5; m++)
    free(want[m]);
  for (int m = 0; q8 && m < 3; m++)
    pair_be[1]->ops->weight_free(pair_be[1], &wq8[m]);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 6; j++)
      pair_be[i]->ops->free(pair_be[i], bufs[i][j]);
  for (int m = 0; m < 3; m++)
    pair_free(ref[m]);
  for (int c = 0; c < 2; c++) {
    pair_free(kc[c]);
    free(c0[c].h);
    free(c0[c].f8);
  }
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->weight_free(pair_be[i], &nw[i]);
  matset_free(&ms);
  pair_free(dx);
  pair_free(xn);
  pair_free(dinv);
  free(x);
  free(nv);
  free_batch(&hb);
}

/* One call that must answer 1 on G (or REJECT: -1, an error containing it) with nothing written:
 * T tokens of batch HB (in G's memory as B), weights WS (N rows each, K columns), RP, a bf16 cache
 * of CACHE_N elements per side. */
static void qkv_refused(const char *what, struct backend *g, const struct weight *const ws[3], const int *N, int T,
                        const struct batch *b, struct kv_layer kv, const struct rope_params *rp, int nh,
                        const char *reject) {
  const size_t cache_n = (size_t)kv.num_blocks * kv.n_kv_heads * kv.block_size * kv.head_dim;
  float *h = malloc(cache_n * 4);
  pair_fill(h, cache_n, 1.0f);
  void *o[3], *c[2];
  for (int m = 0; m < 3; m++) {
    o[m] = pair_alloc1(1, (size_t)T * N[m] * 2);
    cuda_poison(o[m], (size_t)T * N[m]);
  }
  for (int j = 0; j < 2; j++)
    c[j] = cuda_act_copy(h, cache_n);
  uint8_t *c0 = be_get(pair_be[1], c[0], cache_n * 2);
  kv.k = c[0];
  kv.v = c[1];
  float *xh = malloc(sizeof(float) * T * ws[0]->cols);
  pair_fill(xh, (size_t)T * ws[0]->cols, 1.0f);
  void *x = cuda_act_copy(xh, (size_t)T * ws[0]->cols);
  const struct weight *const nob[3] = {NULL, NULL, NULL};
  int rc = g->ops->matmul_qkv_rope(g, o[0], o[1], o[2], x, NULL, ws, nob, &kv, b, nh, rp);
  if (reject) {
    CHECK(rc == -1, "matmul_qkv_rope %s: answered %d, expected an error", what, rc);
    CHECK(rc != -1 || strstr(err_last(), reject) != NULL, "matmul_qkv_rope %s: message %s", what, err_last());
  } else {
    CHECK(rc == 1, "matmul_qkv_rope %s: answered %d, expected 1", what, rc);
  }
  CHECK(g->ops->sync(g) == 0, "matmul_qkv_rope %s: the stream is not usable after it: %s", what, err_last());
  for (int m = 0; m < 3; m++)
    CHECK(cuda_still_poisoned(o[m], (size_t)T * N[m]), "matmul_qkv_rope %s: wrote output %d", what, m);
  for (int j = 0; j < 2; j++)
    qkv_same(what, j ? "v cache (not taken)" : "k cache (not taken)", c[j], c0, cache_n * 2);
  for (int m = 0; m < 3; m++)
    pair_be[1]->ops->free(pair_be[1], o[m]);
  for (int j = 0; j < 2; j++)
    pair_be[1]->ops->free(pair_be[1], c[j]);
  pair_be[1]->ops->free(pair_be[1], x);
  free(c0);
  free(h);
  free(xh);
}

/* What matmul_qkv_rope leaves to matmul_n + rope_kv_write: T past the GEMV (bf16 and Q8_0
 * weights), quantized weights of mixed types, LongRoPE, an odd rot_dim; weights that do not match
 * the heads are an error. The caches hold the same values on both sides (so v's cache is compared
 * against k's initial bytes). */
static void test_qkv_rope_refusals(void) {
  const int hd = 64, nh = 4, nkv = 2, K = 256, bs = 16, N[3] = {nh * hd, nkv * hd, nkv * hd};
  int qlen[9], cached[9];
  for (int s = 0; s < 9; s++)
    qlen[s] = 1, cached[s] = 5 + 20 * s;
  struct host_batch hb;
  batch_from_lens(&hb, 9, qlen, cached, bs, 0, 0);
  void *bufs[6];
  struct batch b9 = dev_batch(1, &hb, bufs), b1 = b9;
  b1.num_tokens = 1;
  b1.num_seqs = 1;
  float inv[32];
  llama3_inv_freq(inv, 32, 500000.0f);
  void *dinv = be_put(pair_be[1], inv, sizeof inv);
  const struct rope_params rp = {.inv_freq = dinv, .rot_dim = hd, .neox = 1};
  struct rope_params rp_long = rp, rp_odd = rp;
  rp_long.inv_freq_long = dinv;
  rp_long.long_after = 4;
  rp_long.query_start = b1.query_start;
  rp_long.seq_lens = b1.seq_lens;
  rp_long.num_seqs = 1;
  rp_odd.rot_dim = hd - 1;
  const struct kv_layer kv = {.k_scale = 1.0f, .v_scale = 1.0f, .dtype = DTYPE_BF16, .num_blocks = hb.num_blocks,
                              .block_size = bs, .n_kv_heads = nkv, .head_dim = hd};
  struct weight w[3], wq8[3];
  float *wv = malloc(sizeof(float) * N[0] * K);
  uint8_t *q8 = malloc(dtype_row_bytes(DTYPE_Q8_0, K) * N[0]);
  pair_fill(wv, (size_t)N[0] * K, 0.1f);
  fill_q8_0(q8, (size_t)N[0] * K);
  for (int m = 0; m < 3; m++) {
    w[m] = pair_weight(1, wv, N[m], K);
    if (pair_be[1]->ops->weight_from_host(pair_be[1], &wq8[m], q8, DTYPE_Q8_0, N[m], K))
      pair_die("weight_from_host q8_0");
  }
  const struct weight *const ws[3] = {&w[0], &w[1], &w[2]}, *const wsq[3] = {&wq8[0], &wq8[1], &wq8[2]};
  struct backend *g = pair_be[1];
  qkv_refused("T 9 (past the GEMV)", g, ws, N, 9, &b9, kv, &rp, nh, NULL);
  const struct weight *const wsmix[3] = {&wq8[0], &wq8[1], &w[2]};
  qkv_refused("q8_0 q and k with a bf16 v", g, wsmix, N, 1, &b1, kv, &rp, nh, NULL);
  qkv_refused("q8_0 weights at T 9 (past the GEMV)", g, wsq, N, 9, &b9, kv, &rp, nh, NULL);
  qkv_refused("LongRoPE", g, ws, N, 1, &b1, kv, &rp_long, nh, NULL);
  qkv_refused("rot_dim 63", g, ws, N, 1, &b1, kv, &rp_odd, nh, NULL);
  for (int k = 0; k < 2; k++)
    qkv_refused(k ? "PAGODA_FUSED_OPS=0" : "PAGODA_FUSED_ROPE=0", qkv_off_be[k], ws, N, 1, &b1, kv, &rp, nh, NULL);
  qkv_refused("8 heads for 4 heads' rows", g, ws, N, 1, &b1, kv, &rp, 2 * nh, "q/k/v weights have 256/128/128 rows");
  for (int m = 0; m < 3; m++) {
    pair_be[1]->ops->weight_free(pair_be[1], &w[m]);
    pair_be[1]->ops->weight_free(pair_be[1], &wq8[m]);
  }
  for (int j = 0; j < 6; j++)
    pair_be[1]->ops->free(pair_be[1], bufs[j]);
  pair_be[1]->ops->free(pair_be[1], dinv);
  free(wv);
  free(q8);
  free_batch(&hb);
}

/* The grid: Llama-3.2-1B's (hd 64, 32/8 heads) and -3.1-8B's (hd 128, 32/8) attention input, 4/4
 * heads with partial rotary at head_dim 96 (interleaved) and 80 (neox), 8/2 interleaved; T = 1..8
 * with block sizes 8, 16, 32, bf16 and f8e4m3 caches, biases and the prenorm on and off in turn;
 * then the real K of both models at T = 1; then Q8_0 weights (the integer-dot GEMV): the same
 * shapes at K a multiple of 256 (partial rotary and 4/4 heads at K 768 and 1024), the real K, and
 * once with PAGODA_QGEMV_BLOCKS=2, so that each warp streams many pairs through its ring; and
 * the refusals. */
static void test_qkv_rope_grid(void) {
  pre_open();
  qkv_off_be[0] = pair_cuda_with_env("PAGODA_FUSED_ROPE", "0");
  qkv_off_be[1] = pair_cuda_with_env("PAGODA_FUSED_OPS", "0");
  if (!qkv_off_be[0] || !qkv_off_be[1])
    pair_die("cuda backend with PAGODA_FUSED_ROPE=0 / PAGODA_FUSED_OPS=0");
  static const struct qkv_case cs[] = {{64, 32, 8, 64, 1, 2048},
                                       {128, 32, 8, 128, 1, 1024},
                                       {96, 4, 4, 32, 0, 520},
                                       {80, 4, 4, 64, 1, 1000},
                                       {64, 8, 2, 64, 0, 512}};
  static const int bss[3] = {8, 16, 32};
  const int ncs = (int)(sizeof cs / sizeof cs[0]);
  int cases = 0;
  for (int c = 0; c < ncs; c++)
    for (int T = 1; T <= 8; T++)
      for (int f8 = 0; f8 < 2; f8++, cases++)
        test_matmul_qkv_rope(&cs[c], T, bss[(T + c + f8) % 3], f8, (T + f8) % 2, (T / 2 + c + f8) % 2, 0);
  const struct qkv_case big[2] = {{64, 32, 8, 64, 1, 2048}, {128, 32, 8, 128, 1, 4096}};
  for (int m = 0; m < 2; m++)
    for (int pre = 0; pre < 2; pre++, cases++)
      test_matmul_qkv_rope(&big[m], 1, 16, m, 0, pre, 0);
  test_matmul_qkv_rope(&big[1], 5, 32, 0, 1, 1, 0); /* the prologue does not take 5 x 4096: answers 1 */
  /* Q8_0 weights (K a multiple of 256: the integer-dot GEMV), every T it takes, with and without
   * the prologue (at 5 x 4096 too), both cache types, both RoPE layouts, partial rotary */
  struct qkv_case q8cs[sizeof cs / sizeof cs[0]];
  for (int c = 0; c < ncs; c++) {
    q8cs[c] = cs[c];
    q8cs[c].K = (cs[c].K + 255) / 256 * 256; /* 520 -> 768, 1000 -> 1024 */
    for (int T = 1; T <= 8; T++, cases++)
      test_matmul_qkv_rope(&q8cs[c], T, bss[(T + c) % 3], (T + c) % 2, T % 2, (T / 2 + c) % 2, 1);
  }
  for (int m = 0; m < 2; m++)
    for (int pre = 0; pre < 2; pre++, cases++)
      test_matmul_qkv_rope(&big[m], m ? 5 : 1, 16, m, pre, pre, 1);
  /* two blocks in all (read at each launch): every warp takes many pairs, the ring running from
   * one pair's rows into the next's (T > 1: the per-row kernel; T = 1 takes the ring GEMV) */
  setenv("PAGODA_QGEMV_BLOCKS", "2", 1);
  for (int c = 0; c < 2; c++, cases++)
    test_matmul_qkv_rope(c ? &big[1] : &q8cs[3], c ? 2 : 3, 16, c, 1, 1, 1);
  unsetenv("PAGODA_QGEMV_BLOCKS");
  test_qkv_rope_refusals();
  printf("  matmul_qkv_rope: %d cases + the refusals\n", cases + 1);
  for (int k = 0; k < 2; k++)
    qkv_off_be[k]->ops->destroy(qkv_off_be[k]);
  pre_close();
}

/* kv_write skips slot -1 (padding): the cache must stay as it was for that token. */
static void test_kv_write_padding(void) {
  int bs = 16, n_kv = 2, hd = 64, nb = 4, T = 5;
  size_t cache_n = (size_t)nb * n_kv * bs * hd, nk = (size_t)T * n_kv * hd;
  float *kh = malloc(cache_n * 4), *k = malloc(nk * 4);
  pair_fill(kh, cache_n, 1.0f);
  pair_fill(k, nk, 1.0f);
  int32_t slots[5] = {bs + 3, -1, 2 * bs, -1, 3 * bs + 15};
  struct dbuf dkc = pair_acts(kh, cache_n), dvc = pair_acts(kh, cache_n), dk = pair_acts(k, nk),
              ds = pair_bytes(slots, sizeof slots);
  for (int i = 0; i < 2; i++) {
    struct kv_layer kv = {.k = dkc.p[i], .v = dvc.p[i], .dtype = pair_be[i]->act_dtype, .num_blocks = nb,
                          .block_size = bs, .n_kv_heads = n_kv, .head_dim = hd};
    struct batch b = {.num_tokens = T, .slot_mapping = ds.p[i]};
    if (pair_be[i]->ops->kv_write(pair_be[i], &kv, dk.p[i], dk.p[i], &b))
      pair_die("kv_write");
  }
  float *c, *g;
  pair_get_both(dkc, cache_n, &c, &g);
  pair_expect("kv_write with padding slots", g, c, cache_n, TOL_EXACT);
  /* and against the definition: slot s of head h holds k[t, h] for the real tokens only */
  int bad = 0;
  for (int t = 0; t < T; t++) {
    if (slots[t] < 0)
      continue;
    int blk = slots[t] / bs, off = slots[t] % bs;
    for (int h = 0; h < n_kv; h++)
      for (int d = 0; d < hd; d++)
        bad += g[(((size_t)blk * n_kv + h) * bs + off) * hd + d] != k[((size_t)t * n_kv + h) * hd + d];
  }
  CHECK(bad == 0, "kv_write: %d elements differ from k", bad);
  free(c);
  free(g);
  pair_free(dkc);
  pair_free(dvc);
  pair_free(dk);
  pair_free(ds);
  free(kh);
  free(k);
}

static void test_copy_blocks(void) {
  int bs = 8, n_kv = 2, hd = 32, nb = 6, L = 2;
  size_t cache_n = (size_t)nb * n_kv * bs * hd;
  float *h = malloc(cache_n * 4);
  struct dbuf kc[2], vc[2];
  for (int l = 0; l < L; l++) {
    pair_fill(h, cache_n, 1.0f);
    kc[l] = pair_acts(h, cache_n);
    pair_fill(h, cache_n, 1.0f);
    vc[l] = pair_acts(h, cache_n);
  }
  int32_t src[2] = {1, 4}, dst[2] = {5, 2};
  for (int i = 0; i < 2; i++) {
    struct kv_layer layers[2];
    for (int l = 0; l < L; l++)
      layers[l] = (struct kv_layer){.k = kc[l].p[i], .v = vc[l].p[i], .dtype = pair_be[i]->act_dtype,
                                    .num_blocks = nb, .block_size = bs, .n_kv_heads = n_kv, .head_dim = hd};
    if (pair_be[i]->ops->copy_blocks(pair_be[i], layers, L, src, dst, 2))
      pair_die("copy_blocks");
  }
  for (int l = 0; l < L; l++) {
    float *c, *g;
    pair_get_both(kc[l], cache_n, &c, &g);
    pair_expect("copy_blocks k", g, c, cache_n, TOL_EXACT);
    size_t blk = (size_t)n_kv * bs * hd;
    CHECK(memcmp(g + 5 * blk, g + 1 * blk, blk * 4) == 0, "copy_blocks: block 5 is not a copy of 1");
    free(c);
    free(g);
    pair_check("copy_blocks v", vc[l], cache_n, TOL_EXACT);
    pair_free(kc[l]);
    pair_free(vc[l]);
  }
  free(h);
}

/* Start-up and argument errors are messages, not crashes, and leave the backend usable: an
 * allocation the GPU cannot hold names the --pa-* flag to lower and where it failed; a block
 * size the kernels are not compiled for is refused with the list. */
static void test_errors(void) {
  struct backend *g = pair_be[1];
  void *p = g->ops->alloc(g, (size_t)1 << 52); /* 4 PiB */
  CHECK(p == NULL, "a 4 PiB allocation succeeded");
  CHECK(strstr(err_last(), "--pa-memory-fraction") != NULL, "OOM message names no flag: %s", err_last());
  CHECK(strstr(err_last_where(), "cuda_backend.cu:") != NULL, "OOM message has no file:line: %s", err_last_where());
  int32_t slot = 0, one[2] = {0, 1};
  void *buf = g->ops->alloc(g, 4096);
  CHECK(buf != NULL, "a small allocation after the failed one: %s", err_last());
  if (!buf)
    return;
  g->ops->upload(g, buf, &slot, 4);
  g->ops->upload(g, (char *)buf + 4, one, 8);
  struct kv_layer kv = {.k = buf, .v = buf, .dtype = DTYPE_BF16, .num_blocks = 1, .block_size = 64,
                        .n_kv_heads = 1, .head_dim = 8};
  struct batch b = {.num_tokens = 1, .num_seqs = 1, .max_blocks_per_seq = 1, .max_seq_len = 1,
                    .max_query_len = 1, .slot_mapping = buf, .query_start = (int32_t *)buf + 1,
                    .seq_lens = (int32_t *)buf + 2, .block_tables = buf};
  CHECK(g->ops->kv_write(g, &kv, buf, buf, &b) == -1, "kv_write accepted block size 64");
  CHECK(strstr(err_last(), "8, 16 or 32") != NULL, "block size message: %s", err_last());
  kv.block_size = 12;
  struct attn_params ap1 = {.n_heads = 1, .scale = 1.0f};
  CHECK(g->ops->attention(g, buf, buf, &kv, &b, &ap1) == -1, "attention accepted block size 12");
  CHECK(strstr(err_last(), "8, 16 or 32") != NULL, "block size message: %s", err_last());
  kv.block_size = 16;
  kv.dtype = DTYPE_F16;
  CHECK(g->ops->kv_write(g, &kv, buf, buf, &b) == -1, "kv_write accepted an f16 cache");
  CHECK(g->ops->sync(g) == 0, "the stream is not usable after refused ops: %s", err_last());
  g->ops->free(g, buf);
}

/* ---- sampling: the GPU op against a sort-based host reference of the same definition ---- */

struct ref_item {
  float logit;
  int id;
};

static int cmp_desc(const void *a, const void *b) {
  const struct ref_item *x = a, *y = b;
  if (x->logit != y->logit)
    return x->logit < y->logit ? 1 : -1;
  return x->id - y->id;
}

/* Returns the token, or -1 when a cut-off or the draw lies so close to a boundary that f32
 * summation order may decide it: such rows are not compared. The GPU sums ~126 values per
 * thread and then scans 1024 partial sums in f32 (relative error ~1e-6 of the total; the walk
 * inside the chosen chunk sums from 0, so it adds only the chunk's own small rounding), and
 * __expf is within a few ulp, so boundaries closer than EPS_MASS of the mass are ambiguous. */
#define EPS_MASS 2e-6
static int ref_sample(const float *x, int vocab, const struct backend_sample_params *p, struct ref_item *it,
                      double *w, char *keep, double *wid) {
  for (int i = 0; i < vocab; i++)
    it[i] = (struct ref_item){x[i], i};
  qsort(it, vocab, sizeof *it, cmp_desc);
  if (p->temperature <= 0 || p->top_k == 1)
    return it[0].id;
  int k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
  while (k < vocab && it[k].logit == it[k - 1].logit) /* ties at the k-th logit are kept (as HF) */
    k++;
  double mx = it[0].logit, z = 0;
  for (int i = 0; i < vocab; i++)
    w[i] = exp(((double)it[i].logit - mx) / p->temperature);
  for (int i = 0; i < k; i++)
    z += w[i];
  int n_keep = k;
  if (p->top_p < 1.0f) { /* keep up to and including the token whose mass crosses top_p */
    double run = 0, target = (double)p->top_p * z;
    for (int i = 0; i < k; i++) {
      run += w[i];
      if (run >= target) {
        n_keep = i + 1;
        if (run - target < EPS_MASS * z || target - (run - w[i]) < EPS_MASS * z)
          return -1;
        /* the kernel's cut-off is a logit threshold: ties of the crossing logit are kept too
         * (the test's logits lie on a 2^-20 grid, so the top of a 128256-token row does tie) */
        while (n_keep < k && it[n_keep].logit == it[n_keep - 1].logit)
          n_keep++;
        break;
      }
    }
  }
  memset(keep, 0, vocab);
  for (int i = 0; i < n_keep; i++) {
    if (p->min_p > 0 && w[i] < p->min_p) {
      if (p->min_p - w[i] < 1e-5)
        return -1;
      continue;
    }
    if (p->min_p > 0 && w[i] - p->min_p < 1e-5)
      return -1;
    keep[it[i].id] = 1;
  }
  for (int i = 0; i < vocab; i++)
    wid[it[i].id] = w[i];
  double tot = 0;
  for (int i = 0; i < vocab; i++)
    if (keep[i])
      tot += wid[i];
  /* the first kept id (in id order) whose running sum exceeds u * tot */
  double target = p->u * tot, run = 0;
  for (int i = 0; i < vocab; i++) {
    if (!keep[i])
      continue;
    double before = run;
    run += wid[i];
    if (run > target) {
      if (target - before < EPS_MASS * tot || run - target < EPS_MASS * tot)
        return -1;
      return i;
    }
  }
  return -1;
}

static void test_sample(int vocab, int rows) {
  struct backend *g = pair_be[1];
  if (!g->ops->sample) {
    CHECK(0, "cuda backend has no sample op");
    return;
  }
  float *x = malloc(sizeof(float) * vocab * rows);
  for (size_t i = 0; i < (size_t)vocab * rows; i++) /* logits of a real model span a few units */
    x[i] = test_randf(&pair_rng) * 8.0f;
  struct backend_sample_params *p = malloc(sizeof *p * rows);
  for (int r = 0; r < rows; r++) {
    int kind = r % 6;
    p[r] = (struct backend_sample_params){.temperature = 0.3f + 1.2f * (test_randf(&pair_rng) + 1) / 2,
                                          .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                          .u = (test_randf(&pair_rng) + 1) / 2};
    if (kind == 0)
      p[r].temperature = 0; /* greedy */
    if (kind == 2 || kind == 5)
      p[r].top_k = pair_int(2, 60);
    if (kind == 3 || kind == 5)
      p[r].top_p = 0.5f + 0.45f * (test_randf(&pair_rng) + 1) / 2;
    if (kind == 4 || kind == 5)
      p[r].min_p = 0.02f + 0.2f * (test_randf(&pair_rng) + 1) / 2;
  }
  float *d = g->ops->alloc(g, sizeof(float) * vocab * rows);
  if (!d)
    pair_die("alloc");
  g->ops->upload(g, d, x, sizeof(float) * vocab * rows);
  int32_t *tok = malloc(4 * rows);
  if (g->ops->sample(g, tok, d, rows, vocab, p))
    pair_die("sample");
  struct ref_item *it = malloc(sizeof *it * vocab);
  double *w = malloc(sizeof(double) * vocab);
  char *keep = malloc(vocab);
  double *wid = malloc(sizeof(double) * vocab);
  int compared = 0, wrong = 0;
  for (int r = 0; r < rows; r++) {
    int want = ref_sample(x + (size_t)r * vocab, vocab, &p[r], it, w, keep, wid);
    if (want < 0)
      continue;
    compared++;
    if (tok[r] != want) {
      wrong++;
      fprintf(stderr, "sample row %d (T %.3f k %d p %.3f min_p %.3f u %.4f): gpu %d, reference %d\n", r,
              p[r].temperature, p[r].top_k, p[r].top_p, p[r].min_p, p[r].u, tok[r], want);
    }
  }
  CHECK(wrong == 0, "sample vocab %d: %d of %d rows differ", vocab, wrong, compared);
  /* with 128256 tokens and no cut-off each token holds ~1e-5 of the mass, so a draw within
   * EPS_MASS of a boundary is common there: a third of the rows may go uncompared */
  CHECK(compared >= rows * 2 / 3, "sample: only %d of %d rows unambiguous", compared, rows);
  printf("  sample vocab %d: %d rows compared, %d differ\n", vocab, compared, wrong);
  g->ops->free(g, d);
  free(x);
  free(p);
  free(tok);
  free(it);
  free(w);
  free(keep);
  free(wid);
}

int main(void) {
  if (!pair_open())
    return test_skip("no CUDA device");
  pair_seed();
  test_embed();
  test_rmsnorm(64, 0);
  test_rmsnorm(64, 1);
  test_rmsnorm(2048, 0);
  test_rmsnorm(2048, 1);
  test_rmsnorm(4096, 1);
  test_matmul(1, 384, 512, 0, 0);
  test_matmul(7, 384, 512, 0, 1);
  test_matmul(64, 1000, 256, 1, 0);
  test_matmul(33, 256, 2048, 1, 1);
  test_matmul_src(DTYPE_F16);
  test_matmul_src(DTYPE_BF16);
  test_matmul_src(DTYPE_Q8_0);
  test_rope(64, 8, 2, 1, 4096);
  test_rope(64, 8, 2, 0, 4096);
  test_rope(128, 4, 4, 1, 4096);
  test_rope(8, 8, 4, 0, 256); /* stories260K's shape */
  test_rope_longrope(96, 8, 4); /* Phi-3's head_dim */
  test_rope_longrope(64, 4, 2);
  test_silu_mul(13, 344);
  test_gather_rows();
  test_kv_write_padding();
  test_copy_blocks();
  { /* fused ops: Llama-3.2-1B's q/k/v (2048/512/512 of 2048) and gate/up, Qwen2's biases, the
     * GEMV's T range, and shapes answered 1 (T past the GEMV) */
    const int qkv[3] = {2048, 512, 512}, qkv2[3] = {384, 128, 128}, gu[2] = {1024, 1024};
    test_matmul_n(1, 3, qkv, 2048, 0, 1);
    test_matmul_n(1, 3, qkv2, 512, 1, 1);
    test_matmul_n(8, 3, qkv2, 520, 1, 1);
    test_matmul_n(3, 2, gu, 256, 0, 1);
    test_matmul_n(9, 3, qkv2, 512, 1, 0);
    test_matmul_silu_mul(1, 8192, 2048, 1);
    test_matmul_silu_mul(5, 344, 264, 1);
    test_matmul_silu_mul(8, 1000, 512, 1);
    test_matmul_silu_mul(9, 344, 256, 0);
    for (int f8 = 0; f8 < 2; f8++) {
      test_rope_kv_write(64, 32, 8, 16, 1, 64, 0, f8);   /* Llama-3.2-1B */
      test_rope_kv_write(128, 32, 8, 32, 1, 128, 0, f8); /* Llama-3.1-8B */
      test_rope_kv_write(64, 8, 2, 8, 0, 64, 0, f8);     /* GGUF adjacent pairs */
      test_rope_kv_write(96, 8, 4, 16, 1, 72, 1, f8);    /* Phi-3: partial rotary, LongRoPE */
      test_rope_kv_write(8, 8, 4, 32, 1, 8, 0, f8);      /* stories260K */
    }
  }
  test_prenorm_grid();
  test_qkv_rope_grid();
  test_errors();
  /* the grid: every block size x batch shape x GQA ratio (head_dim 64, as Llama-3.2-1B) */
  static const int gqa[][2] = {{4, 4}, {8, 2}, {8, 1}};
  static const int bss[] = {8, 16, 32};
  int cases = 0;
  for (int bi = 0; bi < 3; bi++)
    for (int s = 0; s < SHAPE_COUNT; s++)
      for (int gi = 0; gi < 3; gi++) {
        struct kv_case kc = {bss[bi], gqa[gi][0], gqa[gi][1], 64, (enum shape)s, 0, 0, 0, 0, 0};
        test_paged(&kc);
        cases++;
      }
  /* other head dims: Llama-3.1-8B's 128 and stories260K's 8 (the grouped kernel); 3 query
   * heads per KV head (the per-head kernel); head_dim 40 (the generic kernel) */
  for (int s = 0; s < SHAPE_COUNT; s++) {
    struct kv_case a = {16, 8, 2, 128, (enum shape)s, 0, 0, 0, 0, 0}, b = {32, 8, 4, 8, (enum shape)s, 0, 0, 0, 0, 0},
                   c = {8, 6, 2, 40, (enum shape)s, 0, 0, 0, 0, 0}, d = {16, 6, 2, 64, (enum shape)s, 0, 0, 0, 0, 0};
    test_paged(&a);
    test_paged(&b);
    test_paged(&c);
    test_paged(&d);
    cases += 4;
  }
  /* sliding window and softcapping (struct attn_params) through each kernel family */
  for (int s = 0; s < SHAPE_COUNT; s++) {
    struct kv_case w[4] = {{16, 8, 2, 128, (enum shape)s, 37, 0, 0, 0, 0},
                           {8, 6, 2, 64, (enum shape)s, 20, 2.5f, 0, 0, 0},
                           {32, 6, 2, 40, (enum shape)s, 50, 0, 0, 0, 0},
                           {16, 8, 4, 64, (enum shape)s, 0, 1.5f, 0, 0, 0}};
    for (int k = 0; k < 4; k++, cases++)
      test_paged(&w[k]);
  }
  /* the split-context decode kernel: long contexts (several partitions and the reduction),
   * loose host bounds with padded sequences (CUDA graphs), window and softcap, each block size
   * and GQA group, bf16 and f8e4m3; and f8e4m3 through the general kernels */
  for (int f8 = 0; f8 < 2; f8++)
    for (int bi = 0; bi < 3; bi++) {
      struct kv_case d[5] = {{bss[bi], 32, 8, 128, SHAPE_DECODE, 0, 0, f8, 1, 0},
                             {bss[bi], 8, 1, 128, SHAPE_DECODE, 0, 0, f8, 1, 1},
                             {bss[bi], 16, 8, 64, SHAPE_DECODE, 300, 0, f8, 1, 1},
                             {bss[bi], 8, 8, 128, SHAPE_DECODE, 0, 30.0f, f8, 1, 0},
                             {bss[bi], 8, 2, 64, (enum shape)(1 + bi), bi == 2 ? 25 : 0, 0, f8, 0, bi == 0}};
      for (int k = 0; k < 5; k++, cases++)
        test_paged(&d[k]);
    }
  for (int s = 0; s < SHAPE_COUNT; s++, cases += 2) { /* f8e4m3: the per-head and generic kernels */
    struct kv_case a = {16, 6, 2, 64, (enum shape)s, 0, 0, 1, 0, 0}, b = {8, 6, 2, 40, (enum shape)s, 20, 2.0f, 1, 0, 0};
    test_paged(&a);
    test_paged(&b);
  }
  /* head_dim 80, 96 (Phi-3) and 256 (Gemma 2) through the tensor-core kernels (80: rows end in a
   * shorter load; 80 and 96 take the padded shared-memory rows of the tile kernel, 256 its
   * one-block-per-warp variant): every batch shape at each block size with GQA groups 4, 1
   * (window) and 8 (softcap) and an f8e4m3 cache (window, softcap); then long decode contexts
   * (several partitions and the reduction), loose bounds and a window, bf16 and f8e4m3 */
  static const int hds[] = {80, 96, 256};
  for (int hi = 0; hi < 3; hi++) {
    for (int s = 0; s < SHAPE_COUNT; s++) {
      enum shape sh = (enum shape)s;
      struct kv_case c[4] = {{bss[s % 3], 8, 2, hds[hi], sh, 0, 0, 0, 0, 0},
                             {bss[(s + 1) % 3], 4, 4, hds[hi], sh, 29, 0, 0, 0, 0},
                             {bss[(s + 2) % 3], 8, 1, hds[hi], sh, 0, 2.5f, 0, 0, s == 1},
                             {bss[s % 3], 6, 2, hds[hi], sh, s == 2 ? 25 : 0, s == 3 ? 1.5f : 0, 1, 0, 0}};
      for (int k = 0; k < 4; k++, cases++)
        test_paged(&c[k]);
    }
    for (int f8 = 0; f8 < 2; f8++) {
      struct kv_case d[3] = {{bss[hi], 32, 32, hds[hi], SHAPE_DECODE, 0, 0, f8, 1, 0},
                             {bss[(hi + 1) % 3], 16, 8, hds[hi], SHAPE_DECODE, 300, 0, f8, 1, 1},
                             {bss[(hi + 2) % 3], 8, 1, hds[hi], SHAPE_DECODE, 0, 30.0f, f8, 1, 0}};
      for (int k = 0; k < 3; k++, cases++)
        test_paged(&d[k]);
    }
  }
  /* head_dim 128 prompts through the wgmma kernel (cuda_attn_wgmma.cu, on compute capability 9.0;
   * the tile kernel elsewhere): long prompts and chunks (several 192-row query tiles, 64-key
   * tiles, causal edges inside a tile), each block size, GQA 4, 1 and 8, a window, softcap and
   * loose bounds */
  for (int bi = 0; bi < 3; bi++)
    for (int s = SHAPE_PREFILL; s < SHAPE_COUNT; s++) {
      enum shape sh = (enum shape)s;
      struct kv_case c[3] = {{bss[bi], 8, 2, 128, sh, 0, 0, 0, 1, 0},
                             {bss[bi], 8, 1, 128, sh, bi == 1 ? 0 : 100, bi == 1 ? 30.0f : 0, 0, 1, s == SHAPE_MIXED},
                             {bss[bi], 8, 8, 128, sh, 0, 0, 0, 0, 0}};
      for (int k = 0; k < 3; k++, cases++)
        test_paged(&c[k]);
    }
  printf("  paged attention: %d cases\n", cases);
  /* the split-K fold against the reduce kernel: every head_dim of the tensor-core kernel (64 and
   * 128 also of the CUDA-core one, PAGODA_ATTN_DECODE=simd), G in {1, 2, 4, 8}, bf16 and f8e4m3,
   * the block sizes in turn; a window and softcap; the batch-1 shapes of Llama-3.2-1B and
   * Llama-3.1-8B (32 / 8 heads) at every block size */
  fold_open();
  int fcases = 0;
  static const int fold_hd[] = {64, 128, 80, 96, 256}, fold_g[] = {1, 2, 4, 8};
  for (int hi = 0; hi < 5; hi++)
    for (int gi = 0; gi < 4; gi++)
      for (int f8 = 0; f8 < 2; f8++, fcases++)
        test_decode_fold(bss[(hi + gi + f8) % 3], 2 * fold_g[gi], 2, fold_hd[hi], f8, 0, 0, 0, fcases);
  for (int f8 = 0; f8 < 2; f8++, fcases += 2) {
    test_decode_fold(16, 8, 2, 128, f8, 300, 0, 0, fcases);
    test_decode_fold(8, 32, 8, 64, f8, 0, 30.0f, 0, fcases + 1);
  }
  for (int bi = 0; bi < 3; bi++)
    for (int f8 = 0; f8 < 2; f8++, fcases += 2) {
      test_decode_fold(bss[bi], 32, 8, 64, f8, 0, 0, 1, fcases);
      test_decode_fold(bss[bi], 32, 8, 128, f8, 0, 0, 1, fcases + 1);
    }
  fold_close();
  printf("  decode fold: %d cases\n", fcases);
  test_sample(1000, 120);
  test_sample(128256, 60);
  pair_close();
  return test_finish("test_cuda_ops");
}
