/* test_cuda_gemv.c - the bf16 GEMV the CUDA matmul takes for decode-sized T (cuda_gemv.cu)
 * against the CPU backend's matmul on the same bf16-exact inputs, for every T it serves
 * (1..8), both output dtypes, with and without bias, and shapes that exercise its four-step
 * main loop (K >= 1024), its single-step tail (K not a multiple of 1024, K < 256 lanes' span)
 * and a row count that leaves the last block partly empty; then T = 9, which goes to cuBLAS.
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

int main(void) {
  pair_seed();
  if (!pair_open())
    return test_skip("no usable GPU");
  static const int shapes[][2] = {{384, 512}, {1001, 2048}, {130, 1032}, {67, 8}, {512, 3080}};
  for (int T = 1; T <= 9; T++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check(T, shapes[s][0], shapes[s][1], (T + (int)s) % 2, T % 3 == 0);
  check(1, 128256 / 16, 2048, 1, 0); /* an lm_head-like slab */
  pair_close();
  return test_finish("test_cuda_gemv");
}
