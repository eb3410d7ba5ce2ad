/* cuda_quant.c - the two CUDA paths for quantized weights side by side, to place the crossover:
 * the fused dequantize-and-multiply GEMV (passes of 8 activation rows, each pass reading the
 * weight once) and dequantize-to-bf16 slabs + cuBLAS, against a plain bf16 cuBLAS GEMM on the
 * same values. Llama-3.1-8B's matrix shapes, random blocks. Each timed call reads a different
 * copy of the weight, in turn, from enough copies (>= 256 MB) that none is still in the 60 MB
 * L2 (a decode step reads each matrix once, from HBM).
 * Usage: cuda_quant [iters [Tmax [nshapes]]]   (prints one line per type x shape x T: microseconds per call,
 *        the weight bytes read per second by the GEMV and by the bf16 path at the same T)
 *        cuda_quant fused [iters]   (T = 1: the fused forms of the decode step against the launches
 *        they replace, see bench_fused) */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench_util.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/quant.h"

static uint64_t rng = 0x1234567;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)rng;
}

/* random blocks; f16 scale fields (util/quant.h) set to small finite values */
struct qt {
  enum dtype t;
  int qk;
  size_t bytes;
  int f16a, f16b;
};
static const struct qt types[] = {
    {DTYPE_Q8_0, QK8_0, sizeof(struct block_q8_0), offsetof(struct block_q8_0, d), -1},
    {DTYPE_Q4_0, QK4_0, sizeof(struct block_q4_0), offsetof(struct block_q4_0, d), -1},
    {DTYPE_Q4_K, QK_K, sizeof(struct block_q4_K), offsetof(struct block_q4_K, d), offsetof(struct block_q4_K, dmin)},
    {DTYPE_Q5_K, QK_K, sizeof(struct block_q5_K), offsetof(struct block_q5_K, d), offsetof(struct block_q5_K, dmin)},
    {DTYPE_Q6_K, QK_K, sizeof(struct block_q6_K), offsetof(struct block_q6_K, d), -1},
};

static void die(const char *what) {
  fprintf(stderr, "%s: %s\n", what, err_last_where());
  exit(1);
}

static struct backend *make_be(const char *max_t) {
  setenv("PAGODA_QGEMV_MAX_T", max_t, 1);
  struct backend *be = backend_create(&(struct backend_params){.device = "cuda"}); /* the dlopen'ed module */
  if (!be)
    die("backend_create(cuda)");
  /* waits for the kernel preloading, which slows what runs beside it (as bench/cuda_attention.c) */
  if (be->ops->reserve && be->ops->reserve(be, 1, 1, 1))
    die("reserve");
  return be;
}

#define ROT_BYTES ((size_t)256 << 20) /* weight copies cycled through per timing: > 4x the L2 */
#define MAX_ROT 32

static int rot_count(size_t bytes) {
  size_t n = (ROT_BYTES + bytes - 1) / bytes;
  return n > MAX_ROT ? MAX_ROT : (int)n;
}

static double time_mm(struct backend *be, void *out, void *x, struct weight *w, int nw, int T, int iters) {
  for (int i = 0; i < nw; i++)
    if (be->ops->matmul(be, out, x, &w[i], NULL, T, 0))
      die("matmul");
  if (be->ops->sync(be))
    die("sync");
  double t0 = bench_now();
  for (int i = 0; i < iters; i++)
    if (be->ops->matmul(be, out, x, &w[i % nw], NULL, T, 0))
      die("matmul");
  if (be->ops->sync(be))
    die("sync");
  return (bench_now() - t0) / iters * 1e6;
}

/* Random blocks of type Q for an (N, K) matrix (BYTES of them), the f16 scale fields small and
 * finite. */
static uint8_t *random_blocks(const struct qt *q, int N, int K, size_t *bytes_out) {
  size_t nb = (size_t)N * (K / q->qk), bytes = nb * q->bytes;
  uint8_t *wq = malloc(bytes);
  for (size_t i = 0; i < bytes; i++)
    wq[i] = (uint8_t)rnd();
  for (size_t b = 0; b < nb; b++) {
    uint16_t h = f32_to_f16(0.001f + 0.004f * (rnd() % 1000) / 1000.0f);
    memcpy(wq + b * q->bytes + q->f16a, &h, 2);
    if (q->f16b >= 0)
      memcpy(wq + b * q->bytes + q->f16b, &h, 2);
  }
  *bytes_out = bytes;
  return wq;
}

/* NROT copies on BE of one random (N, K) matrix of type Q. */
static void make_weights(struct backend *be, const struct qt *q, int N, int K, struct weight *w, int nrot) {
  size_t bytes;
  uint8_t *wq = random_blocks(q, N, K, &bytes);
  for (int r = 0; r < nrot; r++)
    if (be->ops->weight_from_host(be, &w[r], wq, q->t, N, K))
      die("weight_from_host");
  free(wq);
}

/* The fused forms of a quantized decode step at T = 1 on the 8B shape (dim 4096, 32 / 8 heads of
 * 128), each against the launches it replaces, per call in microseconds:
 *  - prenorm: matmul_n(q, k, v) with the input RMSNorm inside the x quantization, against
 *    rmsnorm + matmul_n;
 *  - add: matmul_add of the o projection (4096 x 4096) into the residual, against matmul +
 *    rmsnorm's residual add (only where the backend has the matmul_add op).
 * The weight copies rotate as in the main table, so every call reads its matrices from HBM. */
static void bench_fused(struct backend *be, int iters) {
  enum { D = 4096, KV = 1024 };
  const float eps = 1e-5f;
  float *g = malloc(sizeof(float) * D);
  uint16_t *xh = malloc(2 * D);
  for (int k = 0; k < D; k++) {
    g[k] = 1.0f + (float)(rnd() % 1000) / 2000.0f;
    xh[k] = f32_to_bf16(((int)(rnd() % 2001) - 1000) / 1000.0f);
  }
  struct weight nw;
  void *x = be->ops->alloc(be, 2 * D), *xn = be->ops->alloc(be, 2 * D), *resid = be->ops->alloc(be, 2 * D);
  void *o[3] = {be->ops->alloc(be, 2 * D), be->ops->alloc(be, 2 * KV), be->ops->alloc(be, 2 * KV)};
  if (!x || !xn || !resid || !o[0] || !o[1] || !o[2] || be->ops->weight_from_host(be, &nw, g, DTYPE_F32, 1, D) ||
      be->ops->upload(be, x, xh, 2 * D) || be->ops->upload(be, resid, xh, 2 * D))
    die("alloc");
  const struct backend_prenorm pre = {.w = &nw, .eps = eps, .xn = xn};
  printf("%-6s %-8s %12s %10s %9s\n", "type", "form", "separate_us", "fused_us", "saved_us");
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const struct qt *q = &types[ti];
    static struct weight wq[MAX_ROT], wk[MAX_ROT], wv[MAX_ROT];
    size_t set = dtype_row_bytes(q->t, D) * (D + 2 * KV);
    int nrot = rot_count(set);
    make_weights(be, q, D, D, wq, nrot);
    make_weights(be, q, KV, D, wk, nrot);
    make_weights(be, q, KV, D, wv, nrot);
    double us[4] = {0, 0, 0, 0};
    int have_add = be->ops->matmul_add != NULL;
    for (int form = 0; form < (have_add ? 4 : 2); form++) {
      for (int rep = 0; rep < 2; rep++) { /* a warm-up pass over every copy, then the timed one */
        int n = rep ? iters : nrot;
        if (be->ops->sync(be))
          die("sync");
        double t0 = bench_now();
        for (int i = 0; i < n; i++) {
          const int r = i % nrot;
          const struct weight *ws[3] = {&wq[r], &wk[r], &wv[r]};
          int rc = 0;
          if (form == 0)
            rc = be->ops->rmsnorm(be, xn, NULL, x, &nw, 1, D, eps) || be->ops->matmul_n(be, 3, o, xn, NULL, ws, NULL, 1);
          else if (form == 1)
            rc = be->ops->matmul_n(be, 3, o, x, &pre, ws, NULL, 1);
          else if (form == 2)
            rc = be->ops->matmul(be, o[0], x, &wq[r], NULL, 1, 0) || be->ops->rmsnorm(be, xn, resid, o[0], &nw, 1, D, eps);
          else
            rc = be->ops->matmul_add(be, resid, x, &wq[r], o[0], 1);
          if (rc)
            die(form == 1 ? "matmul_n with a prenorm (answered 1: not fused for this type?)"
                : form == 3 ? "matmul_add (answered 1: not fused for this type?)" : "separate ops");
        }
        if (be->ops->sync(be))
          die("sync");
        us[form] = (bench_now() - t0) / n * 1e6;
      }
    }
    printf("%-6s %-8s %12.1f %10.1f %9.1f\n", dtype_name(q->t), "prenorm", us[0], us[1], us[0] - us[1]);
    if (have_add)
      printf("%-6s %-8s %12.1f %10.1f %9.1f\n", dtype_name(q->t), "add", us[2], us[3], us[2] - us[3]);
    else
      printf("%-6s %-8s (no matmul_add op in this build)\n", dtype_name(q->t), "add");
    fflush(stdout);
    for (int r = 0; r < nrot; r++) {
      be->ops->weight_free(be, &wq[r]);
      be->ops->weight_free(be, &wk[r]);
      be->ops->weight_free(be, &wv[r]);
    }
  }
  be->ops->weight_free(be, &nw);
  be->ops->free(be, x);
  be->ops->free(be, xn);
  be->ops->free(be, resid);
  for (int i = 0; i < 3; i++)
    be->ops->free(be, o[i]);
  free(g);
  free(xh);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "fused") == 0) {
    if (!backend_device_available("cuda")) {
      fprintf(stderr, "no CUDA device\n");
      return 77;
    }
    struct backend *be = make_be("8");
    bench_fused(be, argc > 2 ? atoi(argv[2]) : 200);
    be->ops->destroy(be);
    return 0;
  }
  int iters = argc > 1 ? atoi(argv[1]) : 50;
  int tlim = argc > 2 ? atoi(argv[2]) : 256;
  int nshapes = argc > 3 ? atoi(argv[3]) : 4; /* the first n of the 4 shapes (4: with the output head) */
  if (!backend_device_available("cuda")) {
    fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  struct backend *gemv = make_be("1000000"), *gemm = make_be("0");
  static const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  static const int Ts[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int Tmax = 256;
  printf("%-6s %6s %6s %4s %10s %10s %10s %9s %9s  %s\n", "type", "N", "K", "T", "gemv_us", "deq+gemm_us",
         "bf16_us", "gemv_GB/s", "bf16_GB/s", "faster");
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && (int)si < nshapes; si++) {
    int N = shapes[si][0], K = shapes[si][1];
    size_t xbytes = (size_t)Tmax * K * 2, obytes = (size_t)Tmax * N * 2;
    void *x[2], *o[2];
    struct backend *bes[2] = {gemv, gemm};
    uint16_t *xh = malloc(xbytes);
    for (size_t i = 0; i < xbytes / 2; i++)
      xh[i] = f32_to_bf16(((int)(rnd() % 2001) - 1000) / 1000.0f);
    for (int b = 0; b < 2; b++) {
      x[b] = bes[b]->ops->alloc(bes[b], xbytes);
      o[b] = bes[b]->ops->alloc(bes[b], obytes);
      if (!x[b] || !o[b] || bes[b]->ops->upload(bes[b], x[b], xh, xbytes))
        die("alloc");
    }
    free(xh);
    int bf16_done = 0;
    double bf16_us[sizeof Ts / sizeof Ts[0]];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
      const struct qt *q = &types[ti];
      if (N == 128256 && q->t != DTYPE_Q6_K && q->t != DTYPE_Q8_0)
        continue; /* the output head: Q6_K in Q4_K_M files, Q8_0 in Q8_0 files */
      size_t bytes;
      uint8_t *wq = random_blocks(q, N, K, &bytes);
      static struct weight w[2][MAX_ROT], wb[MAX_ROT];
      int nrot = rot_count(bytes);
      for (int b = 0; b < 2; b++)
        for (int r = 0; r < nrot; r++)
          if (bes[b]->ops->weight_from_host(bes[b], &w[b][r], wq, q->t, N, K))
            die("weight_from_host");
      if (!bf16_done) { /* bf16 reference GEMM on the dequantized values of the first type */
        float *row = malloc(sizeof(float) * K);
        uint16_t *wbh = malloc((size_t)N * K * 2);
        size_t rb = dtype_row_bytes(q->t, K);
        for (int r = 0; r < N; r++) {
          dtype_to_f32(row, wq + (size_t)r * rb, q->t, K);
          for (int k = 0; k < K; k++)
            wbh[(size_t)r * K + k] = f32_to_bf16(row[k]);
        }
        int nb16 = rot_count((size_t)N * K * 2);
        for (int r = 0; r < nb16; r++)
          if (gemm->ops->weight_from_host(gemm, &wb[r], wbh, DTYPE_BF16, N, K))
            die("weight_from_host bf16");
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0] && Ts[t] <= tlim; t++)
          bf16_us[t] = time_mm(gemm, o[1], x[1], wb, nb16, Ts[t], iters);
        for (int r = 0; r < nb16; r++)
          gemm->ops->weight_free(gemm, &wb[r]);
        free(row);
        free(wbh);
        bf16_done = 1;
      }
      free(wq);
      for (size_t t = 0; t < sizeof Ts / sizeof Ts[0] && Ts[t] <= tlim; t++) {
        int T = Ts[t];
        double a = time_mm(gemv, o[0], x[0], w[0], nrot, T, iters);
        double c = time_mm(gemm, o[1], x[1], w[1], nrot, T, iters);
        int passes = (T + 7) / 8;
        printf("%-6s %6d %6d %4d %10.1f %10.1f %10.1f %9.0f %9.0f  %s\n", dtype_name(q->t), N, K, T, a, c,
               bf16_us[t], (double)bytes * passes / (a * 1e-6) / 1e9,
               T <= 8 ? (double)N * K * 2 / (bf16_us[t] * 1e-6) / 1e9 : 0.0, a < c ? "gemv" : "deq+gemm");
        fflush(stdout);
      }
      for (int b = 0; b < 2; b++)
        for (int r = 0; r < nrot; r++)
          bes[b]->ops->weight_free(bes[b], &w[b][r]);
    }
    for (int b = 0; b < 2; b++) {
      bes[b]->ops->free(bes[b], x[b]);
      bes[b]->ops->free(bes[b], o[b]);
    }
  }
  gemv->ops->destroy(gemv);
  gemm->ops->destroy(gemm);
  return 0;
}
