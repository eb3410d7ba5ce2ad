/* test_cuda_moe_act.c - the CUDA backend's Gemma 2 / Mixtral ops against the CPU backend on the
 * same random inputs: gelu_tanh_mul, scale, softcap, moe_route (the row layout must be
 * identical), moe_combine and the whole MoE block (moe_ffn) with bf16 and q8_0 experts.
 * Tolerances as in test_cuda_ops.c: bf16 outputs 1e-2 rel L2; f32 outputs 1e-5. */
#include <math.h>

#include "gpu_pair.h"
#include "model/moe_block.h"
#include "util/quant.h"

#define TOL_BF16_OUT 1e-2
/* The MoE block rounds to bf16 at each of its GEMMs, the GeGLU and the combine: 2e-2. */
#define TOL_MOE 2e-2
#define TOL_F32 1e-5

static void test_gelu_tanh_mul(int T, int F) {
  size_t n = (size_t)T * F;
  float *a = malloc(n * 4), *b = malloc(n * 4), *c, *g;
  pair_fill(a, n, 4.0f);
  pair_fill(b, n, 2.0f);
  struct dbuf da = pair_acts(a, n), db = pair_acts(b, n), out = pair_poisoned(n);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->gelu_tanh_mul(pair_be[i], out.p[i], da.p[i], db.p[i], T, F))
      pair_die("gelu_tanh_mul");
  pair_get_both(out, n, &c, &g);
  pair_expect("gelu_tanh_mul", g, c, n, TOL_BF16_OUT);
  free(c), free(g);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->gelu_tanh_mul(pair_be[i], da.p[i], da.p[i], db.p[i], T, F))
      pair_die("gelu_tanh_mul");
  pair_get_both(da, n, &c, &g);
  pair_expect("gelu_tanh_mul in place", g, c, n, TOL_BF16_OUT);
  free(c), free(g), free(a), free(b);
  pair_free(da), pair_free(db), pair_free(out);
}

static void test_scale(float s) {
  size_t n = 5000;
  float *a = malloc(n * 4), *c, *g;
  pair_fill(a, n, 3.0f);
  struct dbuf d = pair_acts(a, n);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->scale(pair_be[i], d.p[i], n, s))
      pair_die("scale");
  pair_get_both(d, n, &c, &g);
  char what[64];
  snprintf(what, sizeof what, "scale by %g", s);
  pair_expect(what, g, c, n, TOL_BF16_OUT);
  free(a), free(c), free(g);
  pair_free(d);
}

static void test_softcap(void) {
  int n = 5, vocab = 3001;
  size_t tot = (size_t)n * vocab;
  float *x = malloc(tot * 4), *c = malloc(tot * 4), *g = malloc(tot * 4);
  pair_fill(x, tot, 80.0f);
  struct dbuf d = pair_bytes(x, tot * 4);
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->softcap(pair_be[i], d.p[i], n, vocab, 30.0f))
      pair_die("softcap");
  pair_be[0]->ops->download(pair_be[0], c, d.p[0], tot * 4);
  pair_be[1]->ops->download(pair_be[1], g, d.p[1], tot * 4);
  pair_expect("softcap (f32 logits)", g, c, tot, TOL_F32);
  free(x), free(c), free(g);
  pair_free(d);
}

static void test_route(int T, int E, int k) {
  size_t tk = (size_t)T * k;
  float *l = calloc((size_t)T * E + E + 1, sizeof(float)); /* room for every upload below */
  pair_fill(l, (size_t)T * E, 4.0f);
  struct dbuf dl = pair_bytes(l, sizeof(float) * T * E);
  struct dbuf rt = pair_bytes(l, tk * 4), rw = pair_bytes(l, tk * 4), tr = pair_bytes(l, tk * 4),
              es = pair_bytes(l, (size_t)(E + 1) * 4);
  int32_t *hs[2], *h_rt[2], *h_tr[2];
  float *h_rw[2];
  for (int i = 0; i < 2; i++) {
    hs[i] = malloc((size_t)(E + 1) * 4);
    if (pair_be[i]->ops->moe_route(pair_be[i], dl.p[i], T, E, k, rt.p[i], rw.p[i], tr.p[i], es.p[i], hs[i]))
      pair_die("moe_route");
    h_rt[i] = malloc(tk * 4), h_tr[i] = malloc(tk * 4), h_rw[i] = malloc(tk * 4);
    pair_be[i]->ops->download(pair_be[i], h_rt[i], rt.p[i], tk * 4);
    pair_be[i]->ops->download(pair_be[i], h_tr[i], tr.p[i], tk * 4);
    pair_be[i]->ops->download(pair_be[i], h_rw[i], rw.p[i], tk * 4);
  }
  CHECK(memcmp(hs[0], hs[1], (size_t)(E + 1) * 4) == 0, "moe_route T=%d E=%d k=%d: expert_start differs", T, E, k);
  CHECK(memcmp(h_rt[0], h_rt[1], tk * 4) == 0, "moe_route T=%d E=%d k=%d: row_token differs", T, E, k);
  CHECK(memcmp(h_tr[0], h_tr[1], tk * 4) == 0, "moe_route T=%d E=%d k=%d: token_rows differs", T, E, k);
  char what[64];
  snprintf(what, sizeof what, "moe_route weights T=%d E=%d k=%d", T, E, k);
  pair_expect(what, h_rw[1], h_rw[0], tk, TOL_F32);
  for (int i = 0; i < 2; i++)
    free(hs[i]), free(h_rt[i]), free(h_tr[i]), free(h_rw[i]);
  pair_free(dl), pair_free(rt), pair_free(rw), pair_free(tr), pair_free(es);
  free(l);
}

/* The whole block, experts of dtype WT (f32 host data: bf16 on CUDA; or q8_0 on both). */
static void test_moe_ffn(int T, int E, int k, int D, int F, enum dtype wt) {
  struct weight router[2], *gate[2], *up[2], *down[2];
  float *rf = malloc(sizeof(float) * E * D);
  pair_fill(rf, (size_t)E * D, 0.3f);
  for (int i = 0; i < 2; i++) {
    if (pair_be[i]->ops->weight_from_host(pair_be[i], &router[i], rf, DTYPE_F32, E, D))
      pair_die("router");
    gate[i] = calloc((size_t)E, sizeof(struct weight));
    up[i] = calloc((size_t)E, sizeof(struct weight));
    down[i] = calloc((size_t)E, sizeof(struct weight));
  }
  void *keep[3 * 256]; /* host data the CPU backend uses in place: freed at the end */
  int n_keep = 0;
  for (int e = 0; e < E; e++) {
    int64_t shp[3][2] = {{F, D}, {F, D}, {D, F}};
    for (int m = 0; m < 3; m++) {
      size_t n = (size_t)shp[m][0] * shp[m][1];
      float *src = malloc(n * 4);
      pair_fill(src, n, 0.1f);
      void *host = src;
      if (wt == DTYPE_Q8_0) {
        host = malloc(dtype_row_bytes(DTYPE_Q8_0, (int64_t)n));
        quantize_row_q8_0(src, host, (int64_t)n);
      }
      for (int i = 0; i < 2; i++) {
        struct weight *w = m == 0 ? &gate[i][e] : m == 1 ? &up[i][e] : &down[i][e];
        if (pair_be[i]->ops->weight_from_host(pair_be[i], w, host, wt == DTYPE_Q8_0 ? DTYPE_Q8_0 : DTYPE_F32,
                                              shp[m][0], shp[m][1]))
          pair_die("expert weight");
      }
      keep[n_keep++] = host;
      if (host != src)
        free(src); /* the q8_0 copy is what both backends hold */
    }
  }
  float *x = malloc(sizeof(float) * T * D);
  pair_fill(x, (size_t)T * D, 1.0f);
  struct dbuf dx = pair_acts(x, (size_t)T * D), out = pair_poisoned((size_t)T * D);
  struct moe_scratch s[2];
  for (int i = 0; i < 2; i++) {
    struct moe_weights mw = {E, k, router[i], gate[i], up[i], down[i]};
    if (moe_scratch_alloc(pair_be[i], &s[i], T, E, k, D, F) || moe_ffn(pair_be[i], out.p[i], dx.p[i], &mw, &s[i], T))
      pair_die("moe_ffn");
  }
  CHECK(memcmp(s[0].expert_start_host, s[1].expert_start_host, sizeof(int32_t) * (size_t)(E + 1)) == 0,
        "moe_ffn: the same tokens per expert on both backends");
  float *c, *g;
  pair_get_both(out, (size_t)T * D, &c, &g);
  char what[96];
  snprintf(what, sizeof what, "moe_ffn T=%d E=%d k=%d D=%d F=%d %s", T, E, k, D, F, dtype_name(wt));
  pair_expect(what, g, c, (size_t)T * D, TOL_MOE);
  for (int i = 0; i < 2; i++) {
    moe_scratch_free(pair_be[i], &s[i]);
    for (int e = 0; e < E; e++) {
      pair_be[i]->ops->weight_free(pair_be[i], &gate[i][e]);
      pair_be[i]->ops->weight_free(pair_be[i], &up[i][e]);
      pair_be[i]->ops->weight_free(pair_be[i], &down[i][e]);
    }
    pair_be[i]->ops->weight_free(pair_be[i], &router[i]);
    free(gate[i]), free(up[i]), free(down[i]);
  }
  pair_free(dx), pair_free(out);
  for (int i = 0; i < n_keep; i++)
    free(keep[i]);
  free(c), free(g), free(x), free(rf);
}

int main(void) {
  if (!pair_open())
    return test_skip("no CUDA device");
  pair_seed();
  test_gelu_tanh_mul(13, 344);
  test_gelu_tanh_mul(1, 9216); /* Gemma-2-2B's intermediate size */
  test_scale(48.0f);           /* sqrt(2304): Gemma-2-2B, exact in bf16 */
  test_scale(sqrtf(3584.0f));  /* Gemma-2-9B: rounded to bf16 on CUDA, as HF does */
  test_softcap();
  test_route(1, 8, 2);
  test_route(37, 8, 2);
  test_route(2500, 8, 2);  /* three chunks of the routing kernel */
  test_route(1100, 60, 4); /* Qwen-MoE-like: 60 experts, top 4 */
  test_moe_ffn(1, 8, 2, 256, 512, DTYPE_BF16);
  test_moe_ffn(100, 8, 2, 256, 512, DTYPE_BF16);
  test_moe_ffn(300, 8, 2, 256, 512, DTYPE_Q8_0);
  test_moe_ffn(5, 8, 2, 256, 512, DTYPE_Q8_0); /* quantized GEMV path (few rows per expert) */
  pair_close();
  return test_finish("test_cuda_moe_act");
}
