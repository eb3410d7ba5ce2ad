/* cuda_quant.c - the two CUDA paths for quantized weights side by side, to place the crossover:
 * the fused dequantize-and-multiply GEMV (passes of 8 activation rows, each pass reading the
 * weight once) and dequantize-to-bf16 slabs + cuBLAS, against a plain bf16 cuBLAS GEMM on the
 * same values. Llama-3.1-8B's matrix shapes, random blocks. Each timed call reads a different
 * copy of the weight, in turn, from enough copies (>= 256 MB) that none is still in the 60 MB
 * L2 (a decode step reads each matrix once, from HBM).
 * Usage: cuda_quant [iters [Tmax [nshapes]]]   (prints one line per type x shape x T: microseconds per call,
 *        the weight bytes read per second by the GEMV and by the bf16 path at the same T) */
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

int main(int argc, char **argv) {
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
