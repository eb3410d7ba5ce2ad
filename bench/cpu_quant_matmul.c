/* cpu_quant_matmul.c - CPU matmul rate of every GGUF quant type (2048x2048 weights, T=1 and 64):
 * the integer path with 8-bit activations (cpu_quant_dot.c, what the backend uses for every
 * quant type, Q8_0 included) next to the f32-activation kernel of f32 weights.
 *
 * Usage: cpu_quant_matmul [threads] [seconds per case]   (threads 0 = all cores)
 * Weights are random blocks cycled through >= 256 MiB of copies, so that T=1 streams them from
 * memory as decoding a real model does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_quant.h"
#include "bench_util.h"
#include "util/log.h"

#define N 2048
#define K 2048

static uint64_t r = 88172645463325252ull;
static uint64_t next(void) {
  r ^= r << 13, r ^= r >> 7, r ^= r << 17;
  return r;
}

/* Random bytes with every f16 field (found by dequantizing: any non-finite value) rewritten. */
static void fill(unsigned char *p, enum dtype t, size_t bytes) {
  if (t == DTYPE_F32) {
    for (size_t i = 0; i < bytes / 4; i++) {
      float f = (float)(next() % 2001) / 1000.0f - 1.0f;
      memcpy(p + 4 * i, &f, 4);
    }
    return;
  }
  for (size_t i = 0; i < bytes; i++)
    p[i] = (unsigned char)next();
  size_t bb = dtype_block_bytes(t);
  int bs = dtype_block_size(t);
  float y[256];
  uint16_t h = f32_to_f16(0.01f);
  for (size_t b = 0; b < bytes / bb; b++)
    for (int tries = 0; tries < 64; tries++) { /* scales sit at a few fixed offsets: try them */
      dtype_to_f32(y, p + b * bb, t, bs);
      int bad = 0;
      for (int j = 0; j < bs; j++)
        bad |= !(y[j] > -1e6f && y[j] < 1e6f);
      if (!bad)
        break;
      static const int offs[] = {0, 2, 80, 82, 108, 208};
      for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++)
        if ((size_t)offs[o] + 2 <= bb)
          memcpy(p + b * bb + offs[o], &h, 2);
    }
}

static void run(struct backend *be, enum dtype t, int use_int8, const float *x, float *out, double secs) {
  size_t wbytes = dtype_row_bytes(t, K) * N;
  int copies = (int)(((size_t)256 << 20) / wbytes);
  unsigned char *data = malloc(wbytes * (size_t)copies);
  struct weight *w = calloc((size_t)copies, sizeof *w);
  fill(data, t, wbytes);
  for (int c = 1; c < copies; c++)
    memcpy(data + wbytes * (size_t)c, data, wbytes);
  for (int c = 0; c < copies; c++)
    be->ops->weight_from_host(be, &w[c], data + wbytes * (size_t)c, t, N, K);
  static const int Ts[] = {1, 64};
  for (int i = 0; i < 2; i++) {
    int T = Ts[i], reps = 0;
    double t0 = bench_now(), el;
    do {
      if (use_int8)
        cpu_quant_matmul(be, out, x, &w[reps % copies], NULL, T);
      else
        be->ops->matmul(be, out, x, &w[reps % copies], NULL, T, 0);
      reps++;
      el = bench_now() - t0;
    } while (el < secs);
    double per = el / reps;
    printf("%-7s %-11s %4d %10.3f %10.1f %14.1f\n", dtype_name(t), use_int8 ? "int8 act" : "f32 act", T,
           per * 1e3, 2.0 * N * K * T / per / 1e9, (double)wbytes / per / 1e9);
  }
  free(w);
  free(data);
}

int main(int argc, char **argv) {
  struct backend_params bp = {"cpu", argc > 1 ? atoi(argv[1]) : 0, 0};
  double secs = argc > 2 ? atof(argv[2]) : 1.0;
  struct backend *be = backend_create(&bp);
  if (!be) {
    fprintf(stderr, "%s\n", err_last());
    return 1;
  }
  double copy = bench_copy_gbps(be->num_threads, secs);
  printf("cpu_quant_matmul: %d threads, weight %dx%d; copy bandwidth (read+write) %.1f GB/s\n",
         be->num_threads, N, K, copy);
  printf("%-7s %-11s %4s %10s %10s %14s\n", "dtype", "path", "T", "ms/call", "GFLOP/s", "weight GB/s");
  float *x = malloc(sizeof(float) * 64 * K), *out = malloc(sizeof(float) * 64 * N);
  for (int i = 0; i < 64 * K; i++)
    x[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
  run(be, DTYPE_F32, 0, x, out, secs);
  static const enum dtype types[] = {DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1,
                                     DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K,
                                     DTYPE_IQ4_NL, DTYPE_IQ4_XS};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (cpu_quant_supported(types[i]))
      run(be, types[i], 1, x, out, secs);
  free(x);
  free(out);
  be->ops->destroy(be);
  return 0;
}
