/* cpu_attention.c - the CPU paged-attention op on SmolLM2-135M's attention shape (9 query heads
 * over 3 KV heads, head_dim 64) and Llama-3.2-1B's (32 over 8, head_dim 64), F16 and F32 caches:
 * one sequence, one decode query at context 1024 and 4096 (ms per call for all heads of one
 * layer), and a 256-token prefill chunk at the end of a 1024-token context. Random values: the
 * work does not depend on them.
 * Usage: cpu_attention [threads] [reps]   One line per case. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench_util.h"
#include "util/dtype.h"
#include "util/log.h"

#define BS 16

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rndf(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static double run_case(struct backend *be, enum dtype dt, int H, int KVH, int HD, int ctx, int T, int reps) {
  const int nb = (ctx + BS - 1) / BS;
  const size_t n = (size_t)nb * KVH * BS * HD, esz = dt == DTYPE_F16 ? 2 : 4;
  void *k = malloc(n * esz), *v = malloc(n * esz);
  for (size_t i = 0; i < n; i++) {
    float a = rndf(), c = rndf();
    if (dt == DTYPE_F16) {
      ((uint16_t *)k)[i] = f32_to_f16(a);
      ((uint16_t *)v)[i] = f32_to_f16(c);
    } else {
      ((float *)k)[i] = a;
      ((float *)v)[i] = c;
    }
  }
  float *q = malloc(sizeof(float) * T * H * HD), *o = malloc(sizeof(float) * T * H * HD);
  for (int i = 0; i < T * H * HD; i++)
    q[i] = rndf();
  int32_t *table = malloc(sizeof(int32_t) * nb), *pos = malloc(sizeof(int32_t) * T), qs[2] = {0, T}, len[1] = {ctx};
  for (int i = 0; i < nb; i++)
    table[i] = nb - 1 - i;
  for (int t = 0; t < T; t++)
    pos[t] = ctx - T + t;
  struct kv_layer kv = {k, v, 1.0f, 1.0f, dt, nb, BS, KVH, HD};
  struct batch b = {0};
  b.num_tokens = T;
  b.num_seqs = 1;
  b.max_blocks_per_seq = nb;
  b.max_seq_len = ctx;
  b.positions = pos;
  b.query_start = qs;
  b.seq_lens = len;
  b.block_tables = table;
  struct attn_params ap = {.n_heads = H, .scale = 0.125f};
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    if (be->ops->attention(be, o, q, &kv, &b, &ap) != 0) {
      fprintf(stderr, "error: attention: %s\n", err_last());
      exit(1);
    }
    double dt_s = bench_now() - t0;
    best = dt_s < best ? dt_s : best;
  }
  free(k), free(v), free(q), free(o), free(table), free(pos);
  return best * 1e3;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 20;
  struct backend *be = backend_cpu_create(threads);
  if (!be) {
    fprintf(stderr, "error: cpu backend: %s\n", err_last());
    return 1;
  }
  printf("cpu_attention: %d threads, best of %d; ms per call (all heads of one layer)\n", threads, reps);
  printf("shape            cache  ctx   T    ms\n");
  const struct { const char *name; int H, KVH; } shapes[2] = {{"smollm2-135m", 9, 3}, {"llama-3.2-1b", 32, 8}};
  const enum dtype dts[2] = {DTYPE_F16, DTYPE_F32};
  for (int s = 0; s < 2; s++)
    for (int d = 0; d < 2; d++) {
      const int cases[3][2] = {{1024, 1}, {4096, 1}, {1024, 256}};
      for (int c = 0; c < 3; c++)
        printf("%-16s %-5s %5d %4d %8.3f\n", shapes[s].name, dtype_name(dts[d]), cases[c][0], cases[c][1],
               run_case(be, dts[d], shapes[s].H, shapes[s].KVH, 64, cases[c][0], cases[c][1],
                        cases[c][1] > 1 ? (reps + 9) / 10 : reps));
    }
  be->ops->destroy(be);
  return 0;
}
