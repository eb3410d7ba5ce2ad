/* cpu_matmul.c - CPU matmul rate (GFLOP/s, weight GB/s) for 2048x2048 weights at T=1 and T=64,
 * next to the machine's copy bandwidth measured in the same run.
 *
 * Usage: cpu_matmul [threads] [seconds per case]   (threads 0 = all cores)
 * Weights are cycled through enough copies (>= 512 MiB) that T=1 streams them from memory rather
 * than from the last-level cache, as decoding a real model does.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "backend/backend.h"
#include "util/log.h"

#define N 2048
#define K 2048

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 0;
  double secs = argc > 2 ? atof(argv[2]) : 1.0;
  struct backend *be = backend_cpu_create(threads);
  if (!be) {
    fprintf(stderr, "%s\n", err_last());
    return 1;
  }
  threads = be->num_threads;
  double copy = bench_copy_gbps(threads, secs);
  printf("cpu_matmul: %d threads, weight %dx%d; copy bandwidth (read+write) %.1f GB/s\n", threads, N,
         K, copy);
  printf("%-6s %4s %10s %12s %16s\n", "dtype", "T", "ms/call", "GFLOP/s", "weight GB/s");
  const enum dtype types[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_Q8_0};
  const int Ts[] = {1, 64};
  float *x = malloc(sizeof(float) * 64 * K), *out = malloc(sizeof(float) * 64 * N);
  uint64_t r = 88172645463325252ull;
  for (int i = 0; i < 64 * K; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    x[i] = (float)(r % 2001) / 1000.0f - 1.0f;
  }
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    size_t wbytes = dtype_row_bytes(types[ti], K) * N;
    int copies = (int)(((size_t)512 << 20) / wbytes);
    unsigned char *data = malloc(wbytes * (size_t)copies);
    struct weight *w = calloc((size_t)copies, sizeof *w);
    /* one matrix of values in [-1, 1) in the dtype (q8_0: scale 1/127), copied */
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      int q = (int)(r % 255) - 127;
      float f = (float)q / 127.0f;
      if (types[ti] == DTYPE_F32) {
        memcpy(data + i * 4, &f, 4);
      } else if (types[ti] == DTYPE_Q8_0) {
        unsigned char *blk = data + (i / 32) * 34;
        if (i % 32 == 0) {
          uint16_t d = f32_to_f16(1.0f / 127.0f);
          memcpy(blk, &d, 2);
        }
        blk[2 + i % 32] = (unsigned char)(signed char)q;
      } else {
        uint16_t h = types[ti] == DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
        memcpy(data + i * 2, &h, 2);
      }
    }
    for (int c = 1; c < copies; c++)
      memcpy(data + wbytes * (size_t)c, data, wbytes);
    for (int c = 0; c < copies; c++)
      be->ops->weight_from_host(be, &w[c], data + wbytes * (size_t)c, types[ti], N, K);
    for (int i = 0; i < 2; i++) {
      int T = Ts[i], reps = 0;
      be->ops->matmul(be, out, x, &w[0], NULL, T, 0); /* warm-up */
      double t0 = bench_now(), t;
      do {
        be->ops->matmul(be, out, x, &w[reps % copies], NULL, T, 0);
        reps++;
        t = bench_now() - t0;
      } while (t < secs);
      double per = t / reps;
      printf("%-6s %4d %10.3f %12.1f %16.1f\n", dtype_name(types[ti]), T, per * 1e3,
             2.0 * N * K * T / per / 1e9, (double)wbytes / per / 1e9);
    }
    free(w);
    free(data);
  }
  free(x);
  free(out);
  be->ops->destroy(be);
  return 0;
}
