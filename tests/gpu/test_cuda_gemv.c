/* test_cuda_gemv.c - the bf16 GEMV the CUDA matmul takes for decode-sized T (cuda_gemv.cu)
 * against the CPU backend's matmul on the same bf16-exact inputs, for every T it serves
 * (1..8), both output dtypes, with and without bias, and shapes that exercise its four-step
 * main loop (K >= 1024), its single-step tail (K not a multiple of 1024, K < 256 lanes' span)
 * and a row count that leaves the last block partly empty; then T = 9, which goes to cuBLAS.
 * Last, a chain of GEMVs and RMSNorms with programmatic dependent launch on and off, and one of
 * the fused forms (the norm in the GEMV's prologue, the residual add in its epilogue).
 *
 * Tolerances as test_cuda_ops.c: with f32 output only the summation order differs (1e-4 rel
 * L2 catches any wrong element); with bf16 output one bf16 rounding of each result (1e-2). */
#include "gpu_pair.h"

#define TOL_F32 1e-4
#define TOL_BF16 1e-2

static void check(int T, int N, int K, int out_f32, int with_bias) {
  float *x = malloc(sizeof(float) * (size_t)T * K), *wv = malloc(sizeof(float) * (size_t)N * K),
        *bv = malloc(sizeof(float) * (size_t)N);
  pair_fill(x, (size_t)T * K, 1.0f);
  pair_fill(wv, (size_t)N * K, 0.1f);
  pair_fill(bv, (size_t)N, 0.5f);
  struct weight w[2], b[2];
  for (int i = 0; i < 2; i++)
    if (pair_be[i]->ops->weight_from_host(pair_be[i], &w[i], wv, DTYPE_F32, N, K) ||
        pair_be[i]->ops->weight_from_host(pair_be[i], &b[i], bv, DTYPE_F32, 1, N))
      pair_die("weight_from_host");
  struct dbuf dx = pair_acts(x, (size_t)T * K);
  size_t n = (size_t)T * N;
  float *got[2] = {malloc(n * 4), malloc(n * 4)};
  for (int i = 0; i < 2; i++) {
    size_t bytes = n * (out_f32 ? 4 : pair_esz(i));
    void *out = pair_alloc1(i, bytes), *poison = malloc(bytes);
    memset(poison, 0xff, bytes); /* NaN: an element left unwritten fails */
    pair_be[i]->ops->upload(pair_be[i], out, poison, bytes);
    free(poison);
    if (pair_be[i]->ops->matmul(pair_be[i], out, dx.p[i], &w[i], with_bias ? &b[i] : NULL, T, out_f32))
      pair_die("matmul");
    if (out_f32)
      pair_be[i]->ops->download(pair_be[i], got[i], out, n * 4);
    else
      pair_get_act(i, got[i], out, n);
    pair_be[i]->ops->free(pair_be[i], out);
    pair_be[i]->ops->weight_free(pair_be[i], &w[i]);
    pair_be[i]->ops->weight_free(pair_be[i], &b[i]);
  }
  char what[96];
  snprintf(what, sizeof what, "gemv T%d N%d K%d%s%s", T, N, K, out_f32 ? " f32-out" : " bf16-out",
           with_bias ? " +bias" : "");
  pair_expect(what, got[1], got[0], n, out_f32 ? TOL_F32 : TOL_BF16);
  pair_free(dx);
  free(got[0]);
  free(got[1]);
  free(x);
  free(wv);
  free(bv);
}

/* At T = 1 a plain bf16 matmul of an even row count and K a multiple of 1024 takes the ring GEMV's
 * RING_STORE form (cuda_gemv.cu: the output head, tensor parallelism's o and down): byte for byte
 * what the per-row kernel gives (a backend made with PAGODA_GEMV_RING=0), both output dtypes, x in
 * shared memory (K <= 8192) or read through the read-only cache (K > 8192). */
static void check_ring_store(int N, int K, int out_f32) {
  struct backend *be[2] = {pair_be[1], pair_cuda_with_env("PAGODA_GEMV_RING", "0")};
  if (!be[1])
    pair_die("cuda backend with PAGODA_GEMV_RING=0");
  float *x = malloc(sizeof(float) * (size_t)K), *wv = malloc(sizeof(float) * (size_t)N * K);
  pair_fill(x, (size_t)K, 1.0f);
  pair_fill(wv, (size_t)N * K, 0.1f);
  void *dx = pair_alloc1(1, 2 * (size_t)K);
  pair_put_act(1, dx, x, (size_t)K);
  const size_t bytes = (size_t)N * (out_f32 ? 4 : 2);
  uint8_t *got[2];
  for (int i = 0; i < 2; i++) {
    struct weight w;
    void *out = pair_alloc1(1, bytes);
    got[i] = malloc(bytes);
    memset(got[i], 0xff, bytes); /* NaN: an element left unwritten fails */
    if (be[i]->ops->weight_from_host(be[i], &w, wv, DTYPE_F32, N, K) || be[i]->ops->upload(be[i], out, got[i], bytes) ||
        be[i]->ops->matmul(be[i], out, dx, &w, NULL, 1, out_f32) || be[i]->ops->sync(be[i]) ||
        be[i]->ops->download(be[i], got[i], out, bytes))
      pair_die("ring store matmul");
    be[i]->ops->weight_free(be[i], &w);
    pair_be[1]->ops->free(pair_be[1], out);
  }
  size_t first = 0;
  while (first < bytes && got[0][first] == got[1][first])
    first++;
  CHECK(first == bytes, "ring store N%d K%d %s: differs from the per-row GEMV at byte %zu", N, K,
        out_f32 ? "f32-out" : "bf16-out", first);
  be[1]->ops->destroy(be[1]);
  pair_be[1]->ops->free(pair_be[1], dx);
  free(got[0]);
  free(got[1]);
  free(x);
  free(wv);
}

/* A CUDA backend made with PAGODA_PDL=0 (the variable restored after), for the chains below. */
static struct backend *cuda_pdl_off(void) {
  struct backend *be = pair_cuda_with_env("PAGODA_PDL", "0");
  if (!be)
    pair_die("a second cuda backend (PAGODA_PDL=0)");
  return be;
}

/* N act-dtype elements of B's buffer SRC as floats (caller frees). */
static float *chain_get(struct backend *b, const void *src, size_t n) {
  float *h = malloc(n * 4);
  uint16_t *t = malloc(n * 2);
  int bf = b->act_dtype == DTYPE_BF16;
  if (bf ? b->ops->download(b, t, src, n * 2) : b->ops->download(b, h, src, n * 4))
    pair_die("download");
  for (size_t d = 0; bf && d < n; d++)
    h[d] = bf16_to_f32(t[d]);
  free(t);
  return h;
}

/* A chain's input: X (N random values, bf16-exact) as f32 and as bf16, and N elements' worth of
 * 0xff bytes (NaN in both dtypes) for buffers that must be written before they are read. */
struct chain_in {
  float *x;
  uint16_t *xb, *poison;
};

static struct chain_in chain_in_make(size_t n) {
  struct chain_in c = {malloc(n * 4), malloc(n * 2), malloc(n * 4)};
  pair_fill(c.x, n, 1.0f);
  for (size_t d = 0; d < n; d++)
    c.xb[d] = f32_to_bf16(c.x[d]);
  memset(c.poison, 0xff, n * 4);
  return c;
}

static void chain_in_free(struct chain_in *c) {
  free(c->x);
  free(c->xb);
  free(c->poison);
}

/* Uploads C's x to B's buffer D in B's activation dtype. */
static int chain_put_x(struct backend *b, void *d, const struct chain_in *c, size_t n) {
  return b->act_dtype == DTYPE_BF16 ? b->ops->upload(b, d, c->xb, n * 2) : b->ops->upload(b, d, c->x, n * 4);
}

/* A chain's results GOT[i][k] of N values (i: the CPU, the CUDA backend, the one with
 * PAGODA_PDL=0; k: x and the buffer named B): CUDA within 2e-2 of the CPU and byte-equal with PDL
 * off. Frees them. */
static void chain_expect(const char *what, const char *b, float *got[3][2], size_t n) {
  for (int k = 0; k < 2; k++) {
    char w[128];
    snprintf(w, sizeof w, "%s: %s", what, k ? b : "x");
    pair_expect(w, got[1][k], got[0][k], n, 2e-2);
    CHECK(memcmp(got[1][k], got[2][k], n * 4) == 0, "%s: differs between PDL on and PAGODA_PDL=0", w);
    for (int i = 0; i < 3; i++)
      free(got[i][k]);
  }
}

/* Programmatic dependent launch (cuda_pdl.cuh): ROUNDS of y = h W^T (the GEMV), then h =
 * rmsnorm(x += y) (the fused add), enqueued without a sync, each launch reading what the one
 * before wrote, on the pair's CUDA backend (PDL on unless PAGODA_PDL=0 is set) and on a second
 * one made with PAGODA_PDL=0: x and h must be byte-identical on the two, and match the CPU's
 * chain within bf16 tolerance. A kernel reading before its predecessor finished would see the
 * poison (NaN) in y or the previous round's values. */
static void check_pdl_chain(int D, int rounds) {
  struct backend *be[3] = {pair_be[0], pair_be[1], cuda_pdl_off()};
  size_t n = (size_t)D;
  struct chain_in in = chain_in_make(n);
  float *wv = malloc(n * n * 4), *nv = malloc(n * 4), *got[3][2];
  pair_fill(wv, n * n, 0.1f);
  for (size_t d = 0; d < n; d++)
    nv[d] = 1.0f + pair_rnd(0.5f);
  for (int i = 0; i < 3; i++) {
    struct backend *b = be[i];
    size_t esz = dtype_row_bytes(b->act_dtype, 1);
    struct weight w, nw;
    if (b->ops->weight_from_host(b, &w, wv, DTYPE_F32, D, D) || b->ops->weight_from_host(b, &nw, nv, DTYPE_F32, 1, D))
      pair_die("weight_from_host");
    void *dx = b->ops->alloc(b, n * esz), *dh = b->ops->alloc(b, n * esz), *dy = b->ops->alloc(b, n * esz);
    if (!dx || !dh || !dy)
      pair_die("alloc");
    if (chain_put_x(b, dx, &in, n) || b->ops->rmsnorm(b, dh, NULL, dx, &nw, 1, D, 1e-5f))
      pair_die("upload / rmsnorm");
    for (int r = 0; r < rounds; r++)
      if (b->ops->upload(b, dy, in.poison, n * esz) || b->ops->matmul(b, dy, dh, &w, NULL, 1, 0) ||
          b->ops->rmsnorm(b, dh, dx, dy, &nw, 1, D, 1e-5f))
        pair_die("chain");
    got[i][0] = chain_get(b, dx, n);
    got[i][1] = chain_get(b, dh, n);
    b->ops->free(b, dx);
    b->ops->free(b, dh);
    b->ops->free(b, dy);
    b->ops->weight_free(b, &w);
    b->ops->weight_free(b, &nw);
  }
  char what[96];
  snprintf(what, sizeof what, "PDL chain D%d x%d rounds", D, rounds);
  chain_expect(what, "h", got, n);
  be[2]->ops->destroy(be[2]);
  chain_in_free(&in);
  free(wv);
  free(nv);
}

/* The same with the fused forms of the decode step (cuda_gemv.cu): ROUNDS of y = rmsnorm(x) W1^T
 * (matmul_n with a prenorm: the norm in the GEMV's prologue), then x += y W2^T (matmul_add: the add
 * in its epilogue), T rows of D, every launch reading what the one before wrote with no copy
 * between them. x and y must be byte-identical with PDL on and PAGODA_PDL=0 and match the CPU's
 * chain; both fused forms must have been taken (answered 0). */
static void check_pdl_fused_chain(int D, int T, int rounds) {
  struct backend *be[3] = {pair_be[0], pair_be[1], cuda_pdl_off()};
  size_t n = (size_t)T * D;
  struct chain_in in = chain_in_make(n);
  float *w1 = malloc((size_t)D * D * 4), *w2 = malloc((size_t)D * D * 4), *nv = malloc((size_t)D * 4), *got[3][2];
  pair_fill(w1, (size_t)D * D, 0.1f);
  pair_fill(w2, (size_t)D * D, 0.02f);
  for (int d = 0; d < D; d++)
    nv[d] = 1.0f + pair_rnd(0.5f);
  for (int i = 0; i < 3; i++) {
    struct backend *b = be[i];
    size_t esz = dtype_row_bytes(b->act_dtype, 1);
    struct weight a, c, nw;
    if (b->ops->weight_from_host(b, &a, w1, DTYPE_F32, D, D) || b->ops->weight_from_host(b, &c, w2, DTYPE_F32, D, D) ||
        b->ops->weight_from_host(b, &nw, nv, DTYPE_F32, 1, D))
      pair_die("weight_from_host");
    void *dx = b->ops->alloc(b, n * esz), *dy = b->ops->alloc(b, n * esz), *dn = b->ops->alloc(b, n * esz),
         *ds = b->ops->alloc(b, n * esz);
    if (!dx || !dy || !dn || !ds)
      pair_die("alloc");
    if (chain_put_x(b, dx, &in, n) || b->ops->upload(b, dy, in.poison, n * esz))
      pair_die("upload");
    const struct weight *ws[1] = {&a}, *bs[1] = {NULL};
    void *outs[1] = {dy};
    const struct backend_prenorm pre = {.w = &nw, .eps = 1e-5f, .xn = dn};
    for (int r = 0; r < rounds; r++) {
      int rc1 = b->ops->matmul_n(b, 1, outs, dx, &pre, ws, bs, T);
      int rc2 = rc1 < 0 ? -1 : b->ops->matmul_add(b, dx, dy, &c, ds, T);
      if (rc1 < 0 || rc2 < 0)
        pair_die("fused chain");
      CHECK(rc1 == 0 && rc2 == 0, "fused chain D%d T%d on backend %d: matmul_n answered %d, matmul_add %d", D, T, i,
            rc1, rc2);
    }
    got[i][0] = chain_get(b, dx, n);
    got[i][1] = chain_get(b, dy, n);
    void *bufs[4] = {dx, dy, dn, ds};
    for (int k = 0; k < 4; k++)
      b->ops->free(b, bufs[k]);
    b->ops->weight_free(b, &a);
    b->ops->weight_free(b, &c);
    b->ops->weight_free(b, &nw);
  }
  char what[96];
  snprintf(what, sizeof what, "PDL fused chain D%d T%d x%d rounds", D, T, rounds);
  chain_expect(what, "y", got, n);
  be[2]->ops->destroy(be[2]);
  chain_in_free(&in);
  free(w1);
  free(w2);
  free(nv);
}

int main(void) {
  pair_seed();
  if (!pair_open())
    return test_skip("no usable GPU");
  static const int shapes[][2] = {{384, 512}, {1001, 2048}, {130, 1032}, {67, 8}, {512, 3080}};
  for (int T = 1; T <= 9; T++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check(T, shapes[s][0], shapes[s][1], (T + (int)s) % 2, T % 3 == 0);
  check(1, 128256 / 16, 2048, 1, 0); /* an lm_head-like slab */
  check_ring_store(8016, 2048, 1);
  check_ring_store(4096, 2048, 0);
  check_ring_store(2000, 14336, 0);
  check_ring_store(264, 9216, 1);
  check_pdl_chain(2048, 8);
  check_pdl_chain(4096, 6);
  check_pdl_fused_chain(2048, 1, 8);
  check_pdl_fused_chain(2048, 4, 6);
  check_pdl_fused_chain(4096, 1, 6);
  pair_close();
  return test_finish("test_cuda_gemv");
}
