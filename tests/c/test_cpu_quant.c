/* test_cpu_quant.c - the CPU matmul of every GGUF quant type against dequantize + f32 matmul.
 *
 * Weights are random blocks (random bytes, finite random f16 scales), so every level pattern of
 * every layout is exercised; their meaning is the reference dequantizer (checked against gguf-py
 * in test_quant). Two checks per type, each with its tolerance:
 *  - cpu_quant_vec_dot against the dequantized weights times the DEQUANTIZED 8-bit activations
 *    (per 32 values for the 32-value types, llama.cpp's q8_K per 256 for the K-quants),
 *    in double: the integer sums are exact, so only f32 rounding of scales and partial sums
 *    differs: 1e-5 relative L2. Q4_1 and Q5_1 apply their min m to the activations' stored sum
 *    (a.sd = f16(d * sum), llama.cpp's q8_1 "s"), so their reference does too.
 *  - the backend matmul (8-bit activations) against the f32 activations: x is uniform in [-1, 1)
 *    quantized per 32 values with step amax/127, an error of at most 1/254 of the block maximum
 *    (about 0.4% relative RMS); dot products average it down further, so 1e-2 relative L2
 *    bounds it with margin while a wrong level, scale or layout gives errors of order 1.
 * Also the batch rule (cpu_quant.h): in a call of T tokens, those past
 * cpu_quant_prefill_tokens(t, T) give bit-for-bit the rows they give alone (T = 1), the others
 * exactly cpu_quant_vec_dot_prefill of their activations and the same bits in the smallest call
 * that takes the prefill order (4 tokens for Q4_K, 8 for Q5_K/Q6_K); the prefill order is as
 * accurate as the decode order (1e-5 against the dequantized operands).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_quant.h"
#include "test_util.h"
#include "util/log.h"
#include "util/quant.h"

static uint64_t rng = 0x1234567887654321ull;

/* Byte offsets of each type's f16 scale fields within a block. */
static int half_fields(enum dtype t, int *off) {
  switch (t) {
  case DTYPE_Q4_1: case DTYPE_Q5_1: case DTYPE_Q4_K: case DTYPE_Q5_K:
    off[0] = 0, off[1] = 2;
    return 2;
  case DTYPE_Q2_K:
    off[0] = 80, off[1] = 82;
    return 2;
  case DTYPE_Q3_K:
    off[0] = 108;
    return 1;
  case DTYPE_Q6_K:
    off[0] = 208;
    return 1;
  default:
    off[0] = 0;
    return 1;
  }
}

static void *random_blocks(enum dtype t, int64_t rows, int64_t cols) {
  size_t bytes = dtype_row_bytes(t, cols) * (size_t)rows, bb = dtype_block_bytes(t);
  uint8_t *p = malloc(bytes);
  for (size_t i = 0; i < bytes; i++)
    p[i] = (uint8_t)test_rand(&rng);
  int off[2], n = half_fields(t, off);
  for (size_t b = 0; b < bytes / bb; b++)
    for (int f = 0; f < n; f++) {
      float v = test_randf(&rng) * ldexpf(1.0f, -(int)(test_rand(&rng) % 6));
      uint16_t h = f32_to_f16(v);
      memcpy(p + b * bb + off[f], &h, 2);
    }
  return p;
}

static float *rand_floats(size_t n) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++)
    p[i] = test_randf(&rng);
  return p;
}

static void test_type(struct backend *be, enum dtype t) {
  const char *name = dtype_name(t);
  /* K = 576 (not a multiple of 256) for the 32-value types; two super-blocks for the others. */
  const int N = 37, K = dtype_block_size(t) == 32 ? 576 : 512;
  void *wdata = random_blocks(t, N, K);
  float *wref = malloc(sizeof(float) * N * K);
  dtype_to_f32(wref, wdata, t, (int64_t)N * K);
  float *bias = rand_floats(N);
  struct weight w, bw;
  if (be->ops->weight_from_host(be, &w, wdata, t, N, K) != 0 ||
      be->ops->weight_from_host(be, &bw, bias, DTYPE_F32, 1, N) != 0) {
    CHECK(0, "%s weight: %s", name, err_last());
    return;
  }
  CHECK(w.data == wdata, "%s weight is used in place", name);

  /* Integer kernel vs dequantized operands. */
  float *x = rand_floats((size_t)K);
  void *act = malloc(cpu_quant_act_bytes(t, K));
  cpu_quantize_act_for(t, x, act, K);
  const struct cpu_act_q8 *a32 = act; /* the 32-value types' activations */
  float *got = malloc(sizeof(float) * N), *want = malloc(sizeof(float) * N);
  size_t rb = dtype_row_bytes(t, K);
  for (int n = 0; n < N; n++) {
    got[n] = cpu_quant_vec_dot(t, (const char *)wdata + (size_t)n * rb, act, K);
    double s = 0;
    const uint8_t *row = (const uint8_t *)wdata + (size_t)n * rb;
    for (int k = 0; k < K; k++) {
      double wk = wref[(size_t)n * K + k];
      if (t == DTYPE_Q4_1 || t == DTYPE_Q5_1) { /* w = d * level + m: the m part via a.sd */
        uint16_t m16;
        memcpy(&m16, row + (size_t)(k / 32) * dtype_block_bytes(t) + 2, 2);
        wk -= f16_to_f32(m16);
        if (k % 32 == 0)
          s += (double)f16_to_f32(m16) * a32[k / 32].sd;
      }
      s += wk * (double)cpu_quant_act_value(t, act, k);
    }
    want[n] = (float)s;
  }
  double e = test_rel_l2(got, want, N);
  /* Q4_1/Q5_1: the reference's weight is d*l + m rounded to f32 (dtype_to_f32) less m, off by up to
   * one f32 ulp of d*l + m; the AVX2 kernel happens to land on the same bits, the portable one
   * (sanitizer builds: no -march) within that error (6e-5 seen) */
  double tol = t == DTYPE_Q4_1 || t == DTYPE_Q5_1 ? 2e-4 : 1e-5;
  CHECK(e < tol, "%s vec_dot vs dequantized operands: rel L2 %g", name, e);
  for (int n = 0; n < N; n++)
    got[n] = cpu_quant_vec_dot_prefill(t, (const char *)wdata + (size_t)n * rb, act, K);
  double ep = test_rel_l2(got, want, N);
  CHECK(ep < tol, "%s vec_dot, prefill order, vs dequantized operands: rel L2 %g", name, ep);
  free(x);

  /* Backend matmul vs f32 activations, several batch sizes. */
  const int Ts[] = {1, 3, 17, 8, 6};
  for (int i = 0; i < 5; i++) {
    int T = Ts[i];
    float *xs = rand_floats((size_t)T * K), *out = malloc(sizeof(float) * T * N);
    float *ref = malloc(sizeof(float) * T * N);
    if (be->ops->matmul(be, out, xs, &w, &bw, T, 0) != 0) {
      CHECK(0, "%s matmul: %s", name, err_last());
    } else {
      for (int tt = 0; tt < T; tt++)
        for (int n = 0; n < N; n++) {
          double s = bias[n];
          for (int k = 0; k < K; k++)
            s += (double)wref[(size_t)n * K + k] * xs[(size_t)tt * K + k];
          ref[tt * N + n] = (float)s;
        }
      double e2 = test_rel_l2(out, ref, (size_t)T * N);
      CHECK(e2 < 1e-2, "%s matmul T=%d vs f32: rel L2 %g", name, T, e2);
      if (T == 17)
        printf("  %-7s vec_dot rel L2 %.2g, matmul (8-bit activations) vs f32 rel L2 %.2g\n", name, e, e2);
      /* the batch rule: decode-order tokens as alone; prefill-order tokens as the prefill
       * vec_dot and as in the smallest prefill call holding them. Without AVX2 (sanitizer
       * builds) the matmul dequantizes tiles to f32 instead: every token as alone. */
      const int tmin = t == DTYPE_Q4_K ? 4 : 8;
      const int np = cpu_quant_supported(t) ? cpu_quant_prefill_tokens(t, T) : 0;
      float row[64 * 8];
      for (int tt = 0; tt < T; tt++) {
        if (tt >= np) {
          be->ops->matmul(be, row, xs + (size_t)tt * K, &w, &bw, 1, 0);
          if (memcmp(row, out + (size_t)tt * N, sizeof(float) * N) != 0) {
            CHECK(0, "%s: token %d alone differs from inside T=%d", name, tt, T);
            break;
          }
          continue;
        }
        cpu_quantize_act_for(t, xs + (size_t)tt * K, act, K);
        int bad = 0;
        for (int n = 0; n < N; n++)
          bad |= out[(size_t)tt * N + n] != bias[n] + cpu_quant_vec_dot_prefill(t, (const char *)wdata + (size_t)n * rb, act, K);
        int ws = tt - tt % tmin; /* a window of tmin tokens holding tt */
        ws = ws + tmin > T ? T - tmin : ws;
        be->ops->matmul(be, row, xs + (size_t)ws * K, &w, &bw, tmin, 0);
        bad |= memcmp(row + (size_t)(tt - ws) * N, out + (size_t)tt * N, sizeof(float) * N) != 0;
        if (bad) {
          CHECK(0, "%s: prefill-order token %d inside T=%d differs from its prefill vec_dot or a %d-token call", name,
                tt, T, tmin);
          break;
        }
      }
      const int npr = cpu_quant_prefill_tokens(t, T);
      CHECK(npr == 0 || t == DTYPE_Q4_K || t == DTYPE_Q5_K || t == DTYPE_Q6_K, "%s: only K-quants have a prefill order", name);
      if (t == DTYPE_Q4_K || t == DTYPE_Q5_K || t == DTYPE_Q6_K)
        CHECK(npr == (T < tmin ? 0 : t == DTYPE_Q4_K ? T - T % 4 : T), "%s: %d of T=%d tokens in the prefill order", name, npr, T);
    }
    free(xs);
    free(out);
    free(ref);
  }
  be->ops->weight_free(be, &w);
  be->ops->weight_free(be, &bw);
  free(act);
  free(got);
  free(want);
  free(wdata);
  free(wref);
  free(bias);
}

int main(void) {
  struct backend_params bp = {"cpu", 2, 0};
  struct backend *be = backend_create(&bp);
  if (!be)
    return test_skip("no cpu backend");
  static const enum dtype types[] = {DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1,
                                     DTYPE_Q8_0, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q4_K,
                                     DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_IQ4_NL, DTYPE_IQ4_XS};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    test_type(be, types[i]);
  /* Q8_K is an activation format, never a weight. */
  struct weight w;
  static uint8_t blk[292];
  CHECK(be->ops->weight_from_host(be, &w, blk, DTYPE_Q8_K, 1, 256) != 0, "q8_k weight refused");
  be->ops->destroy(be);
  return test_finish("test_cpu_quant");
}
