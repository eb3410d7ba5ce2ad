/* cpu_matmul.c - out = x @ W^T for f32/bf16/f16/q8_0 weights: OpenMP over row tiles, AVX2+FMA.
 *
 * Each task owns MM_ROWS output features (rows of W) for all T tokens, so tasks never write the
 * same output. Its weight rows are walked in chunks of MM_KC columns; a chunk is converted to f32
 * once into a small per-thread tile (f32 weights are read in place) and then used by every token,
 * so a prefill of T tokens reads each weight from memory once, not T times; below 4 tokens
 * (decode) the kernels convert in registers instead, reading each weight byte once. The register
 * kernel computes 4 rows x 3 tokens of dot products. Partial sums of each chunk are added to out, which
 * starts as the bias (or zero).
 */
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define MM_SIMD 1
#else
#define MM_SIMD 0
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_quant.h"
#include "util/log.h"
#include "util/quant.h"

#define MM_ROWS 16 /* output rows per task */
#define MM_KC 256  /* columns per chunk: a multiple of Q8_0_BLOCK and of 8 */

/* Converts rows [r0, r0 + nr) x cols [k0, k0 + kc) of W to f32 in tile (nr, kc). */
static void tile_to_f32(float *tile, const struct weight *w, int64_t r0, int nr, int64_t k0, int kc) {
  size_t row_bytes = dtype_row_bytes(w->dtype, w->cols);
  for (int r = 0; r < nr; r++) {
    const char *row = (const char *)w->data + (size_t)(r0 + r) * row_bytes;
    float *dst = tile + (size_t)r * kc;
    switch (w->dtype) {
    case DTYPE_BF16: {
      const uint16_t *s = (const uint16_t *)row + k0;
      int i = 0;
#if MM_SIMD
      for (; i + 8 <= kc; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
      }
#endif
      for (; i < kc; i++)
        dst[i] = bf16_to_f32(s[i]);
      break;
    }
    case DTYPE_F16: {
      const uint16_t *s = (const uint16_t *)row + k0;
      int i = 0;
#if MM_SIMD
      for (; i + 8 <= kc; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
      for (; i < kc; i++)
        dst[i] = f16_to_f32(s[i]);
      break;
    }
    case DTYPE_Q8_0: {
      /* k0 and kc are multiples of 32 here (cols is, and MM_KC is). */
      const uint8_t *blk = (const uint8_t *)row + (size_t)(k0 / Q8_0_BLOCK) * Q8_0_BYTES;
      for (int b = 0; b < kc / Q8_0_BLOCK; b++, blk += Q8_0_BYTES) {
        uint16_t d16;
        memcpy(&d16, blk, 2);
        float d = f16_to_f32(d16);
        const int8_t *q = (const int8_t *)(blk + 2);
        float *o = dst + b * Q8_0_BLOCK;
#if MM_SIMD
        __m256 dv = _mm256_set1_ps(d);
        for (int i = 0; i < Q8_0_BLOCK; i += 8) {
          __m128i q8 = _mm_loadl_epi64((const __m128i *)(q + i));
          __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
          _mm256_storeu_ps(o + i, _mm256_mul_ps(dv, f));
        }
#else
        for (int i = 0; i < Q8_0_BLOCK; i++)
          o[i] = d * (float)q[i];
#endif
      }
      break;
    }
    case DTYPE_F32: /* read in place, never converted */
      memcpy(dst, (const float *)row + k0, (size_t)kc * sizeof(float));
      break;
    default: /* other quant types (only without AVX2): k0 and kc are whole blocks */
      quant_dequantize_row((int)w->dtype, row + dtype_row_bytes(w->dtype, k0), dst, kc);
      break;
    }
  }
}

#if MM_SIMD
static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Loads 8 weights of row W (at column chunk start) from column k as f32. Every loader converts
 * exactly as tile_to_f32 does, so the direct path (small T) and the tile path (larger T) give a
 * token bit-for-bit the same output: a token's logits do not depend on the batch it ran in. */
static inline __m256 ld_f32(const void *w, int k) { return _mm256_loadu_ps((const float *)w + k); }
static inline __m256 ld_bf16(const void *w, int k) {
  __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
static inline __m256 ld_f16(const void *w, int k) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
}
static inline __m256 ld_q8_0(const void *w, int k) { /* w points at the chunk's first block */
  const uint8_t *blk = (const uint8_t *)w + (size_t)(k / Q8_0_BLOCK) * Q8_0_BYTES;
  uint16_t d16;
  memcpy(&d16, blk, 2);
  __m128i q8 = _mm_loadl_epi64((const __m128i *)(blk + 2 + k % Q8_0_BLOCK));
  return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(d16)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
}
/* Scalar loads for the ragged tail (kc % 8 columns; never for q8_0, whose kc is a multiple of 32). */
static inline float sc_f32(const void *w, int k) { return ((const float *)w)[k]; }
static inline float sc_bf16(const void *w, int k) { return bf16_to_f32(((const uint16_t *)w)[k]); }
static inline float sc_f16(const void *w, int k) { return f16_to_f32(((const uint16_t *)w)[k]); }
static inline float sc_q8_0(const void *w, int k) {
  (void)w, (void)k;
  return 0.0f;
}

/* out[t * ldo + r] += dot(row w[r], x[t * ldx .. + kc]) for r < nr (<= 4), t < NT. Rows past nr
 * repeat row 0 so that the loop shape stays fixed; their sums are dropped. */
#define MM_KERNEL(DT, NT)                                                                        \
  static void mm_##DT##_##NT(const void *const *w, int nr, const float *x, size_t ldx, float *out, \
                             size_t ldo, int kc) {                                               \
    __m256 acc[4][NT];                                                                           \
    for (int r = 0; r < 4; r++)                                                                  \
      for (int t = 0; t < NT; t++)                                                               \
        acc[r][t] = _mm256_setzero_ps();                                                         \
    int k = 0;                                                                                   \
    for (; k + 8 <= kc; k += 8) {                                                                \
      __m256 xv[NT];                                                                             \
      for (int t = 0; t < NT; t++)                                                               \
        xv[t] = _mm256_loadu_ps(x + t * ldx + k);                                                \
      for (int r = 0; r < 4; r++) {                                                              \
        __m256 wv = ld_##DT(w[r], k);                                                            \
        for (int t = 0; t < NT; t++)                                                             \
          acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);                                     \
      }                                                                                          \
    }                                                                                            \
    for (int r = 0; r < nr; r++)                                                                 \
      for (int t = 0; t < NT; t++) {                                                             \
        float s = hsum256(acc[r][t]);                                                            \
        for (int kk = k; kk < kc; kk++)                                                          \
          s += sc_##DT(w[r], kk) * x[t * ldx + kk];                                              \
        out[t * ldo + r] += s;                                                                   \
      }                                                                                          \
  }
#define MM_KERNELS(DT) MM_KERNEL(DT, 1) MM_KERNEL(DT, 2) MM_KERNEL(DT, 3)
MM_KERNELS(f32)
MM_KERNELS(bf16)
MM_KERNELS(f16)
MM_KERNELS(q8_0)

typedef void (*mm_kernel_fn)(const void *const *w, int nr, const float *x, size_t ldx, float *out,
                             size_t ldo, int kc);
static const mm_kernel_fn mm_kernels[4][3] = {
    {mm_f32_1, mm_f32_2, mm_f32_3},
    {mm_bf16_1, mm_bf16_2, mm_bf16_3},
    {mm_f16_1, mm_f16_2, mm_f16_3},
    {mm_q8_0_1, mm_q8_0_2, mm_q8_0_3},
};

static int mm_kernel_index(enum dtype t) {
  return t == DTYPE_F32 ? 0 : t == DTYPE_BF16 ? 1 : t == DTYPE_F16 ? 2 : 3;
}
#else
/* Portable fallback over f32 tiles; four partial sums keep the adds independent. */
static void mm_tile_scalar(const void *const *w, int nr, int nt, const float *x, size_t ldx, float *out,
                           size_t ldo, int kc) {
  for (int r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++) {
      const float *wr = w[r], *xt = x + t * ldx;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int k = 0;
      for (; k + 4 <= kc; k += 4) {
        s0 += wr[k] * xt[k];
        s1 += wr[k + 1] * xt[k + 1];
        s2 += wr[k + 2] * xt[k + 2];
        s3 += wr[k + 3] * xt[k + 3];
      }
      for (; k < kc; k++)
        s0 += wr[k] * xt[k];
      out[t * ldo + r] += (s0 + s1) + (s2 + s3);
    }
}
#endif

int cpu_matmul(struct backend *be, void *out, const void *x, const struct weight *w,
               const struct weight *bias, int T, int out_f32) {
  (void)out_f32; /* the CPU's activations are f32 already */
  if (w->dtype != DTYPE_F32 && w->dtype != DTYPE_BF16 && w->dtype != DTYPE_F16 &&
      !(dtype_is_quant(w->dtype) && w->dtype != DTYPE_Q8_K))
    return ERR("matmul: weight dtype %s not supported on cpu", dtype_name(w->dtype));
  /* GGUF quant types: integer dot products with 8-bit activations (cpu_quant_dot.c), as
   * llama.cpp computes them. */
  if (cpu_quant_supported(w->dtype))
    return cpu_quant_matmul(be, out, x, w, bias, T);
  if (bias && bias->cols * bias->rows != w->rows)
    return ERR("matmul: bias of %lld elements for %lld outputs", (long long)(bias->cols * bias->rows),
               (long long)w->rows);
  float *o = out;        /* (T, N) */
  const float *xs = x;   /* (T, K) */
  const int64_t N = w->rows, K = w->cols;
  const int64_t num_tasks = (N + MM_ROWS - 1) / MM_ROWS;
  /* Small T (decode): the kernels read and convert the weights directly, each byte once. Larger
   * T: each chunk is converted once into the tile and reused by all T tokens (f32 too: rows K
   * floats apart alias in the L1 cache sets when K is a power of two, and the copy is cheap next
   * to T uses). Without AVX2 the tile path is always taken. */
  const int direct = MM_SIMD && T < 4;
  const size_t row_bytes = dtype_row_bytes(w->dtype, K);

#pragma omp parallel num_threads(cpu_threads_for(be, N * K * T)) if (num_tasks > 1)
  {
    _Alignas(64) float tile[MM_ROWS * MM_KC]; /* (MM_ROWS, MM_KC) converted weights */
#pragma omp for schedule(static)
    for (int64_t task = 0; task < num_tasks; task++) {
      int64_t r0 = task * MM_ROWS;
      int nr = (int)(N - r0 < MM_ROWS ? N - r0 : MM_ROWS);
      for (int t = 0; t < T; t++)
        for (int r = 0; r < nr; r++)
          o[(size_t)t * N + r0 + r] = bias ? cpu_weight_elem(bias, r0 + r) : 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += MM_KC) {
        int kc = (int)(K - k0 < MM_KC ? K - k0 : MM_KC);
        const void *rows[MM_ROWS]; /* each row's first element of the chunk */
        if (direct) {
          size_t off = dtype_row_bytes(w->dtype, k0);
          for (int r = 0; r < nr; r++)
            rows[r] = (const char *)w->data + (size_t)(r0 + r) * row_bytes + off;
        } else {
          tile_to_f32(tile, w, r0, nr, k0, kc);
          for (int r = 0; r < nr; r++)
            rows[r] = tile + (size_t)r * kc;
        }
        for (int r = nr; r < MM_ROWS; r++)
          rows[r] = rows[0];
        for (int t0 = 0; t0 < T; t0 += 3) {
          int nt = T - t0 < 3 ? T - t0 : 3;
          for (int rr = 0; rr < nr; rr += 4) {
            int nrr = nr - rr < 4 ? nr - rr : 4;
#if MM_SIMD
            mm_kernels[direct ? mm_kernel_index(w->dtype) : 0][nt - 1](
                rows + rr, nrr, xs + (size_t)t0 * K + k0, (size_t)K, o + (size_t)t0 * N + r0 + rr, (size_t)N, kc);
#else
            mm_tile_scalar(rows + rr, nrr, nt, xs + (size_t)t0 * K + k0, (size_t)K,
                           o + (size_t)t0 * N + r0 + rr, (size_t)N, kc);
#endif
          }
        }
      }
    }
  }
  return 0;
}
