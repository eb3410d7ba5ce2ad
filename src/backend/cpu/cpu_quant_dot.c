/* cpu_quant_dot.c - AVX2 integer dot products of every GGUF quant type with 8-bit activations
 * (the scheme is described in cpu_quant.h). */
#include "backend/cpu/cpu_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QD_SIMD 1
#else
#define QD_SIMD 0
#endif

#include "util/log.h"
#include "util/quant.h"

#define QROWS 16 /* weight rows per parallel task */

/* f32 -> f16 -> f32, round to nearest even (what llama.cpp stores in its q8_0/q8_1 blocks). */
static inline float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }

void cpu_quantize_act(const float *x, struct cpu_act_q8 *a, int64_t k) {
  for (int64_t b = 0; b < k / 32; b++, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
      amax = fmaxf(amax, fabsf(x[j]));
    /* As llama.cpp's quantize_row_q8_0/q8_1 (x86): the values are scaled by 127 / amax and
     * rounded half to even, the scale amax / 127 is stored as f16, and q8_1's sum as
     * f16(unrounded scale * sum of the levels). */
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    a[b].d = round_f16(d);
    int s0 = 0, s1 = 0;
    for (int j = 0; j < 32; j++) {
      int q = (int)nearbyintf(x[j] * id);
      q = q > 127 ? 127 : q < -127 ? -127 : q;
      a[b].qs[j] = (int8_t)q;
      if (j < 16)
        s0 += q;
      else
        s1 += q;
    }
    a[b].s[0] = (int16_t)s0;
    a[b].s[1] = (int16_t)s1;
    a[b].sd = round_f16(d * (float)(s0 + s1));
  }
}

int cpu_quant_act_is_k(enum dtype t) {
  return t == DTYPE_Q2_K || t == DTYPE_Q3_K || t == DTYPE_Q4_K || t == DTYPE_Q5_K || t == DTYPE_Q6_K ||
         t == DTYPE_IQ4_XS;
}

size_t cpu_quant_act_bytes(enum dtype t, int64_t k) {
  return cpu_quant_act_is_k(t) ? sizeof(struct block_q8_K) * (size_t)(k / QK_K)
                               : sizeof(struct cpu_act_q8) * (size_t)(k / 32);
}

void cpu_quantize_act_for(enum dtype t, const float *x, void *a, int64_t k) {
  if (cpu_quant_act_is_k(t))
    quantize_row_q8_K(x, a, k); /* llama.cpp's quantize_row_q8_K (util/quant.c) */
  else
    cpu_quantize_act(x, a, k);
}

float cpu_quant_act_value(enum dtype t, const void *a, int64_t i) {
  if (cpu_quant_act_is_k(t)) {
    const struct block_q8_K *b = (const struct block_q8_K *)a + i / QK_K;
    return b->d * (float)b->qs[i % QK_K];
  }
  const struct cpu_act_q8 *b = (const struct cpu_act_q8 *)a + i / 32;
  return b->d * (float)b->qs[i % 32];
}

#if QD_SIMD
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Unsigned levels (0..127) x signed activations: 8 int32 sums, lanes 0-3 from bytes 0-15 and
 * lanes 4-7 from bytes 16-31. */
static inline __m256 idot_u(__m256i u, const int8_t *qa) {
  __m256i x = _mm256_loadu_si256((const __m256i *)qa);
  __m256i p = _mm256_maddubs_epi16(u, x);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
/* Signed levels (-127..127). */
static inline __m256 idot_s(__m256i w, const int8_t *qa) {
  __m256i x = _mm256_loadu_si256((const __m256i *)qa);
  __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* 16 packed bytes -> 32 nibbles: low nibbles first, then high nibbles (the Q4_0 order). */
static inline __m256i nibbles16(const uint8_t *q) {
  __m128i b = _mm_loadu_si128((const __m128i *)q);
  __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Bit j of BITS -> byte j = 0x10 (j < 32). */
static inline __m256i bits_to_0x10(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                        2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201ll);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

static inline __m256i iq4_lookup(__m256i idx) {
  const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
  return _mm256_shuffle_epi8(tab, idx);
}

/* acc += p * (one scale for all 32) */
#define ACC1(p, s) acc = _mm256_fmadd_ps((p), _mm256_set1_ps(s), acc)
/* acc += p * (scale s0 for the first 16 values, s1 for the next 16) */
#define ACC2(p, s0, s1) acc = _mm256_fmadd_ps((p), _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1), acc)

/* Sum of the 8 int32 lanes (exact). */
static inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/* The exact totals of NT (1..4) vectors of 8 int32 lanes: for 4, one reduction. */
static inline void hsum4_i32(const __m256i *v, int nt, int32_t *tot) {
  if (nt == 4) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_storeu_si128((__m128i *)tot, _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    return;
  }
  for (int j = 0; j < nt; j++)
    tot[j] = hsum_i32(v[j]);
}

/* Signed levels times activations, 32 values: the exact integer dot product. */
static inline int32_t idot_s_total(__m256i w, const int8_t *qa) {
  __m256i x = _mm256_loadu_si256((const __m256i *)qa);
  __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* Up to QD_NT tokens share each decoded weight block (prefill). Every token keeps its own
 * accumulators and gets exactly the operations it would get alone, in the same order, so its
 * result is bit-for-bit the same whatever T is. */
#define QD_NT 4
#define QD_INLINE static inline __attribute__((always_inline))

/* Q4_0 and IQ4_NL: llama.cpp repacks these weights 8 rows at a time when AVX2 is there
 * (ggml_gemv/gemm_q4_0_8x8_q8_0) and sums each row in one f32 lane: per block, the exact integer
 * dot product, converted to f32 and fused-multiply-added with f16(d_w) * d_a. Q8_0, Q5_0 (signed
 * levels) and Q4_1, Q5_1 (unsigned levels, plus the min as fma(f16(m), a.sd, s) in a scalar
 * added last) follow ggml_vec_dot_*_q8_0/q8_1 (x86), which llamafile's tinyBLAS_Q0_AVX matches:
 * per block the 8 int32 sums of 4 products each, converted to f32 and fused-multiply-added with
 * f16(d_w) * d_a into 8 f32 lanes, one horizontal sum at the end. */
QD_INLINE void dot32_n(enum dtype t, const void *vw, const struct cpu_act_q8 *const *a, int nt, int64_t k,
                       float *out) {
  __m256 acc[QD_NT];
  float sc[QD_NT];
  for (int j = 0; j < nt; j++)
    acc[j] = _mm256_setzero_ps(), sc[j] = 0.0f;
  int64_t i = 0;
  if (t == DTYPE_Q4_0 || t == DTYPE_IQ4_NL) {
    /* 4 blocks at a time: their 4 exact integer totals from one reduction, then the 4 fmas in
     * block order (the same values and operations as one block at a time). */
    for (; i + 4 <= k / 32; i += 4) {
      __m256i lv4[4];
      float dw4[4];
      for (int u = 0; u < 4; u++) {
        if (t == DTYPE_Q4_0) {
          const struct block_q4_0 *w = (const struct block_q4_0 *)vw + i + u;
          lv4[u] = _mm256_sub_epi8(nibbles16(w->qs), _mm256_set1_epi8(8)), dw4[u] = h2f(w->d);
        } else {
          const struct block_iq4_nl *w = (const struct block_iq4_nl *)vw + i + u;
          lv4[u] = iq4_lookup(nibbles16(w->qs)), dw4[u] = h2f(w->d);
        }
      }
      for (int j = 0; j < nt; j++) {
        const struct cpu_act_q8 *b = a[j] + i;
        __m256i p[4];
        for (int u = 0; u < 4; u++) {
          __m256i x = _mm256_loadu_si256((const __m256i *)b[u].qs);
          p[u] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(lv4[u], lv4[u]), _mm256_sign_epi8(x, lv4[u])),
                                   _mm256_set1_epi16(1));
        }
        __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        __m128 tot = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
        float tf[4];
        _mm_storeu_ps(tf, tot);
        for (int u = 0; u < 4; u++)
          sc[j] = fmaf(tf[u], dw4[u] * b[u].d, sc[j]);
      }
    }
  }
  for (; i < k / 32; i++) {
    __m256i lv;
    float dw, mw = 0.0f;
    uint32_t qh;
    switch (t) {
    case DTYPE_Q4_0: {
      const struct block_q4_0 *w = (const struct block_q4_0 *)vw + i;
      lv = _mm256_sub_epi8(nibbles16(w->qs), _mm256_set1_epi8(8)), dw = h2f(w->d);
      break;
    }
    case DTYPE_IQ4_NL: {
      const struct block_iq4_nl *w = (const struct block_iq4_nl *)vw + i;
      lv = iq4_lookup(nibbles16(w->qs)), dw = h2f(w->d);
      break;
    }
    case DTYPE_Q4_1: {
      const struct block_q4_1 *w = (const struct block_q4_1 *)vw + i;
      lv = nibbles16(w->qs), dw = h2f(w->d), mw = h2f(w->m);
      break;
    }
    case DTYPE_Q5_0: {
      const struct block_q5_0 *w = (const struct block_q5_0 *)vw + i;
      memcpy(&qh, w->qh, 4);
      /* level - 16: the nibble, with 0xF0 set where the fifth bit is clear */
      __m256i set = _mm256_cmpeq_epi8(bits_to_0x10(qh), _mm256_set1_epi8(0x10));
      lv = _mm256_or_si256(nibbles16(w->qs), _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0)));
      dw = h2f(w->d);
      break;
    }
    case DTYPE_Q5_1: {
      const struct block_q5_1 *w = (const struct block_q5_1 *)vw + i;
      memcpy(&qh, w->qh, 4);
      lv = _mm256_or_si256(nibbles16(w->qs), bits_to_0x10(qh)), dw = h2f(w->d), mw = h2f(w->m);
      break;
    }
    default: { /* DTYPE_Q8_0 */
      const struct block_q8_0 *w = (const struct block_q8_0 *)vw + i;
      lv = _mm256_loadu_si256((const __m256i *)w->qs), dw = h2f(w->d);
      break;
    }
    }
    for (int j = 0; j < nt; j++) {
      const struct cpu_act_q8 *b = a[j] + i;
      if (t == DTYPE_Q4_0 || t == DTYPE_IQ4_NL) {
        sc[j] = fmaf((float)idot_s_total(lv, b->qs), dw * b->d, sc[j]);
      } else if (t == DTYPE_Q4_1 || t == DTYPE_Q5_1) {
        sc[j] = fmaf(mw, b->sd, sc[j]); /* exact product of two f16s: = mul + add */
        acc[j] = _mm256_fmadd_ps(idot_u(lv, b->qs), _mm256_set1_ps(dw * b->d), acc[j]);
      } else {
        acc[j] = _mm256_fmadd_ps(idot_s(lv, b->qs), _mm256_set1_ps(dw * b->d), acc[j]);
      }
    }
  }
  for (int j = 0; j < nt; j++)
    out[j] = t == DTYPE_Q4_0 || t == DTYPE_IQ4_NL ? sc[j]
             : t == DTYPE_Q4_1 || t == DTYPE_Q5_1 ? hsum(acc[j]) + sc[j]
                                                  : hsum(acc[j]);
}

#define DOT32(NAME, T)                                                                  \
  static float dot_##NAME(const void *w, const void *a, int64_t k) {                     \
    float r;                                                                            \
    const struct cpu_act_q8 *as = a;                                                    \
    dot32_n(T, w, &as, 1, k, &r);                                                       \
    return r;                                                                           \
  }                                                                                     \
  static void dot4_##NAME(const void *w, const void *const *a, int64_t k, float *out) { \
    dot32_n(T, w, (const struct cpu_act_q8 *const *)a, QD_NT, k, out);                  \
  }
DOT32(q4_0, DTYPE_Q4_0)
DOT32(q4_1, DTYPE_Q4_1)
DOT32(q5_0, DTYPE_Q5_0)
DOT32(q5_1, DTYPE_Q5_1)
DOT32(q8_0, DTYPE_Q8_0)
DOT32(iq4_nl, DTYPE_IQ4_NL)

/* The K-quant types take llama.cpp's q8_K activations (cpu_act_q8k: one f32 scale per 256
 * values, 16-value sums). Q4_K, Q5_K and Q6_K follow its x86 ggml_vec_dot_*_q8_K: within a
 * super-block everything is integer (levels x activations x sub-block scales, the Q6_K offset
 * of 32 subtracted through the 16-value sums) in 8 int32 lanes, lane l holding bytes 4l..4l+3
 * of every 32-value chunk; the lanes are converted to f32 and fused-multiply-added with
 * d_a * f16(d_w) into one 8-lane accumulator per row. The Q5_K mins are summed in integers per
 * super-block and added in f32 as llama.cpp does (Q4_K: its repacked kernel, below). */
static inline __m256i scaled_pairs(__m256i u, const int8_t *qa, __m256i sc16) {
  __m256i x = _mm256_loadu_si256((const __m256i *)qa);
  return _mm256_madd_epi16(sc16, _mm256_maddubs_epi16(u, x));
}

static float dot_q2_K(const void *vw, const void *va, int64_t k) {
  const struct block_q2_K *w = vw;
  const struct block_q8_K *a = va;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < k / QK_K; i++) {
    float d = h2f(w[i].d) * a[i].d, dmin = h2f(w[i].dmin) * a[i].d;
    for (int h = 0; h < 2; h++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
      for (int p = 0; p < 4; p++) {
        int c = 4 * h + p;
        uint8_t s0 = w[i].scales[2 * c], s1 = w[i].scales[2 * c + 1];
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * p), m3);
        ACC2(idot_u(u, a[i].qs + 32 * c), d * (float)(s0 & 0xF), d * (float)(s1 & 0xF));
        bias -= dmin * ((float)(s0 >> 4) * a[i].bsums[2 * c] + (float)(s1 >> 4) * a[i].bsums[2 * c + 1]);
      }
    }
  }
  return hsum(acc) + bias;
}

static float dot_q3_K(const void *vw, const void *va, int64_t k) {
  const struct block_q3_K *w = vw;
  const struct block_q8_K *a = va;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < k / QK_K; i++) {
    float d = h2f(w[i].d) * a[i].d;
    __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask);
    for (int h = 0; h < 2; h++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
      for (int p = 0; p < 4; p++) {
        int c = 4 * h + p;
        /* level + 4 = low 2 bits + 4 * high bit: unsigned 0..7 */
        __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * p), m3);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, c), one);
        __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
        float sc0 = d * (float)q3_K_scale(w[i].scales, 2 * c);
        float sc1 = d * (float)q3_K_scale(w[i].scales, 2 * c + 1);
        ACC2(idot_u(u, a[i].qs + 32 * c), sc0, sc1);
        bias -= 4.0f * (sc0 * a[i].bsums[2 * c] + sc1 * a[i].bsums[2 * c + 1]);
      }
    }
  }
  return hsum(acc) + bias;
}

/* Q4_K: llama.cpp repacks these weights too (ggml_gemv/gemm_q4_K_8x8_q8_K, AVX2), one f32 lane
 * per row. Decode (its gemv): per super-block the exact integer sums of scale x level x
 * activation and of min x activation sums, each converted to f32 and fused-multiply-added with
 * f16(d_w) * d_a and f16(dmin_w) * d_a into two accumulators; the result is their difference.
 * Prefill (its gemm; PREFILL set): the same with one pair of fmas per 64 values (sub-blocks 2p and
 * 2p + 1 summed in integers), four per super-block. */
QD_INLINE void dot_q4_K_n(const void *vw, const struct block_q8_K *const *a, int nt, int64_t k, float *out,
                          int prefill) {
  const struct block_q4_K *w = vw;
  float acc[QD_NT], acc_m[QD_NT];
  for (int j = 0; j < nt; j++)
    acc[j] = acc_m[j] = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < k / QK_K; i++) {
    uint8_t sc[8], m[8];
    for (int c = 0; c < 8; c++)
      get_scale_min_k4(c, w[i].scales, &sc[c], &m[c]);
    float dw = h2f(w[i].d), dmw = h2f(w[i].dmin);
    __m256i lv[8];
    for (int p = 0; p < 4; p++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * p));
      lv[2 * p] = _mm256_and_si256(q, m4);
      lv[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    for (int j = 0; j < nt; j++) {
      const struct block_q8_K *b = a[j] + i;
      const float da = dw * b->d, dma = dmw * b->d;
      if (prefill) {
        __m256i s2[4];
        for (int p = 0; p < 4; p++)
          s2[p] = _mm256_add_epi32(scaled_pairs(lv[2 * p], b->qs + 64 * p, _mm256_set1_epi16(sc[2 * p])),
                                   scaled_pairs(lv[2 * p + 1], b->qs + 64 * p + 32, _mm256_set1_epi16(sc[2 * p + 1])));
        int32_t tot[4]; /* the 4 exact totals from one reduction, then the fmas in order */
        hsum4_i32(s2, 4, tot);
        float tf[4];
        _mm_storeu_ps(tf, _mm_cvtepi32_ps(_mm_loadu_si128((const __m128i *)tot)));
        for (int p = 0; p < 4; p++) {
          int32_t imin = m[2 * p] * (b->bsums[4 * p] + b->bsums[4 * p + 1]) +
                         m[2 * p + 1] * (b->bsums[4 * p + 2] + b->bsums[4 * p + 3]);
          acc[j] = fmaf(tf[p], da, acc[j]);
          acc_m[j] = fmaf((float)imin, dma, acc_m[j]);
        }
        continue;
      }
      int32_t imin = 0;
      for (int c = 0; c < 8; c++)
        imin += m[c] * (b->bsums[2 * c] + b->bsums[2 * c + 1]);
      __m256i sumi = _mm256_setzero_si256();
      for (int c = 0; c < 8; c++)
        sumi = _mm256_add_epi32(sumi, scaled_pairs(lv[c], b->qs + 32 * c, _mm256_set1_epi16(sc[c])));
      acc[j] = fmaf((float)hsum_i32(sumi), da, acc[j]);
      acc_m[j] = fmaf((float)imin, dma, acc_m[j]);
    }
  }
  for (int j = 0; j < nt; j++)
    out[j] = acc[j] - acc_m[j];
}

/* Q5_K and Q6_K, prefill (PREFILL set; decode as above): llama.cpp's tiled K-quant matmul (ggml-cpu/tiled, its
 * AVX512-VNNI microkernel) sums each row in one f32 scalar, super-block by super-block: the exact
 * integer sum S of scale x level x activation (Q6_K's offset of 32 included) and, for Q5_K, M of
 * min x activation sums, r = f16(d_w) * S (rounded), r = fma(-f16(dmin_w), M, r), then
 * acc = fma(r, d_a, acc). */
QD_INLINE void dot_q5_K_n(const void *vw, const struct block_q8_K *const *a, int nt, int64_t k, float *out,
                          int prefill) {
  const struct block_q5_K *w = vw;
  __m256 acc[QD_NT];
  float summs[QD_NT];
  for (int j = 0; j < nt; j++)
    acc[j] = _mm256_setzero_ps(), summs[j] = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < k / QK_K; i++) {
    uint8_t sc[8], m[8];
    for (int c = 0; c < 8; c++)
      get_scale_min_k4(c, w[i].scales, &sc[c], &m[c]);
    float dw = h2f(w[i].d), dmw = h2f(w[i].dmin);
    __m256i qh = _mm256_loadu_si256((const __m256i *)w[i].qh), lv[8];
    for (int p = 0; p < 4; p++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * p));
      for (int half = 0; half < 2; half++) {
        int c = 2 * p + half;
        __m256i u = half ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
        __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, c), one);
        lv[c] = _mm256_or_si256(u, _mm256_slli_epi16(hb, 4));
      }
    }
    __m256i sumi[QD_NT];
    int32_t msum[QD_NT];
    for (int j = 0; j < nt; j++) {
      const struct block_q8_K *b = a[j] + i;
      msum[j] = 0;
      for (int c = 0; c < 8; c++)
        msum[j] += m[c] * (b->bsums[2 * c] + b->bsums[2 * c + 1]);
      sumi[j] = _mm256_setzero_si256();
      for (int c = 0; c < 8; c++)
        sumi[j] = _mm256_add_epi32(sumi[j], scaled_pairs(lv[c], b->qs + 32 * c, _mm256_set1_epi16(sc[c])));
      if (prefill)
        continue;
      /* llama.cpp's C is compiled with FP contraction: this is one fma there */
      summs[j] = fmaf(-b->d * dmw, (float)msum[j], summs[j]);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(b->d * dw), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
    }
    if (prefill) {
      int32_t tot[QD_NT];
      hsum4_i32(sumi, nt, tot);
      for (int j = 0; j < nt; j++)
        summs[j] = fmaf(fmaf(-dmw, (float)msum[j], dw * (float)tot[j]), a[j][i].d, summs[j]);
    }
  }
  for (int j = 0; j < nt; j++)
    out[j] = prefill ? summs[j] : hsum(acc[j]) + summs[j];
}

QD_INLINE void dot_q6_K_n(const void *vw, const struct block_q8_K *const *a, int nt, int64_t k, float *out,
                          int prefill) {
  const struct block_q6_K *w = vw;
  __m256 acc[QD_NT];
  float accs[QD_NT];
  for (int j = 0; j < nt; j++)
    acc[j] = _mm256_setzero_ps(), accs[j] = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < k / QK_K; i++) {
    float dw = h2f(w[i].d);
    const int8_t *scs = w[i].scales;
    __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scs)), lv[8], sc[8];
    for (int h = 0; h < 2; h++) {
      __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
      __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
      __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
      for (int g = 0; g < 4; g++) {
        int c = 4 * h + g;
        __m256i ql = g % 2 ? ql1 : ql0;
        __m256i lo = _mm256_and_si256(g / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m3);
        lv[c] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        sc[c] = _mm256_setr_m128i(_mm_set1_epi16(scs[2 * c]), _mm_set1_epi16(scs[2 * c + 1]));
      }
    }
    __m256i sumi[QD_NT];
    for (int j = 0; j < nt; j++) {
      const struct block_q8_K *b = a[j] + i;
      /* the offset of 32: 32 * (S16[2l] * sc[2l] + S16[2l+1] * sc[2l+1]) in lane l */
      __m256i bs = _mm256_loadu_si256((const __m256i *)b->bsums);
      __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, scales16), 5);
      sumi[j] = _mm256_setzero_si256();
      for (int c = 0; c < 8; c++)
        sumi[j] = _mm256_add_epi32(sumi[j], scaled_pairs(lv[c], b->qs + 32 * c, sc[c]));
      sumi[j] = _mm256_sub_epi32(sumi[j], off);
      if (!prefill)
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(b->d * dw), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
    }
    if (prefill) {
      int32_t tot[QD_NT];
      hsum4_i32(sumi, nt, tot);
      for (int j = 0; j < nt; j++)
        accs[j] = fmaf(dw * (float)tot[j], a[j][i].d, accs[j]);
    }
  }
  for (int j = 0; j < nt; j++)
    out[j] = prefill ? accs[j] : hsum(acc[j]);
}

#define DOTK(NAME)                                                                       \
  static float dot_##NAME(const void *w, const void *a, int64_t k) {                      \
    float r;                                                                             \
    const struct block_q8_K *as = a;                                                     \
    dot_##NAME##_n(w, &as, 1, k, &r, 0);                                                 \
    return r;                                                                            \
  }                                                                                      \
  static void dot4_##NAME(const void *w, const void *const *a, int64_t k, float *out) {  \
    dot_##NAME##_n(w, (const struct block_q8_K *const *)a, QD_NT, k, out, 0);            \
  }                                                                                      \
  static float dotp_##NAME(const void *w, const void *a, int64_t k) {                     \
    float r;                                                                             \
    const struct block_q8_K *as = a;                                                     \
    dot_##NAME##_n(w, &as, 1, k, &r, 1);                                                 \
    return r;                                                                            \
  }                                                                                      \
  static void dot4p_##NAME(const void *w, const void *const *a, int64_t k, float *out) { \
    dot_##NAME##_n(w, (const struct block_q8_K *const *)a, QD_NT, k, out, 1);            \
  }
DOTK(q4_K)
DOTK(q5_K)
DOTK(q6_K)

static float dot_iq4_xs(const void *vw, const void *va, int64_t k) {
  const struct block_iq4_xs *w = vw;
  const struct block_q8_K *a = va;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < k / QK_K; i++) {
    float d = h2f(w[i].d) * a[i].d;
    for (int c = 0; c < 8; c++) {
      int ls = ((w[i].scales_l[c / 2] >> (4 * (c % 2))) & 0xF) | (((w[i].scales_h >> (2 * c)) & 3) << 4);
      ACC1(idot_s(iq4_lookup(nibbles16(w[i].qs + 16 * c)), a[i].qs + 32 * c), d * (float)(ls - 32));
    }
  }
  return hsum(acc);
}

typedef float (*dot_fn)(const void *w, const void *a, int64_t k);

static dot_fn dot_for(enum dtype t) {
  switch (t) {
  case DTYPE_Q4_0: return dot_q4_0;
  case DTYPE_Q4_1: return dot_q4_1;
  case DTYPE_Q5_0: return dot_q5_0;
  case DTYPE_Q5_1: return dot_q5_1;
  case DTYPE_Q8_0: return dot_q8_0;
  case DTYPE_Q2_K: return dot_q2_K;
  case DTYPE_Q3_K: return dot_q3_K;
  case DTYPE_Q4_K: return dot_q4_K;
  case DTYPE_Q5_K: return dot_q5_K;
  case DTYPE_Q6_K: return dot_q6_K;
  case DTYPE_IQ4_NL: return dot_iq4_nl;
  case DTYPE_IQ4_XS: return dot_iq4_xs;
  default: return NULL;
  }
}

/* QD_NT tokens at once (NULL: the type runs token by token). */
typedef void (*dot4_fn)(const void *w, const void *const *a, int64_t k, float *out);

static dot4_fn dot4_for(enum dtype t) {
  switch (t) {
  case DTYPE_Q4_0: return dot4_q4_0;
  case DTYPE_Q4_1: return dot4_q4_1;
  case DTYPE_Q5_0: return dot4_q5_0;
  case DTYPE_Q5_1: return dot4_q5_1;
  case DTYPE_Q8_0: return dot4_q8_0;
  case DTYPE_IQ4_NL: return dot4_iq4_nl;
  case DTYPE_Q4_K: return dot4_q4_K;
  case DTYPE_Q5_K: return dot4_q5_K;
  case DTYPE_Q6_K: return dot4_q6_K;
  default: return NULL;
  }
}

/* The prefill order (cpu_quant_prefill_tokens), for the types that have one. */
static dot_fn dotp_for(enum dtype t) {
  switch (t) {
  case DTYPE_Q4_K: return dotp_q4_K;
  case DTYPE_Q5_K: return dotp_q5_K;
  case DTYPE_Q6_K: return dotp_q6_K;
  default: return NULL;
  }
}

static dot4_fn dot4p_for(enum dtype t) {
  switch (t) {
  case DTYPE_Q4_K: return dot4p_q4_K;
  case DTYPE_Q5_K: return dot4p_q5_K;
  case DTYPE_Q6_K: return dot4p_q6_K;
  default: return NULL;
  }
}

int cpu_quant_supported(enum dtype t) { return dot_for(t) != NULL; }

float cpu_quant_vec_dot(enum dtype t, const void *w, const void *a, int64_t k) {
  dot_fn f = dot_for(t);
  return f ? f(w, a, k) : NAN;
}

float cpu_quant_vec_dot_prefill(enum dtype t, const void *w, const void *a, int64_t k) {
  dot_fn f = dotp_for(t);
  return f ? f(w, a, k) : cpu_quant_vec_dot(t, w, a, k);
}
#else
int cpu_quant_supported(enum dtype t) {
  (void)t;
  return 0; /* without AVX2 the matmul dequantizes tiles to f32 instead */
}

/* Scalar reference: the dequantized weights times the dequantized activations. */
float cpu_quant_vec_dot(enum dtype t, const void *w, const void *a, int64_t k) {
  float wf[256];
  int bs = dtype_block_size(t);
  int chunk = bs > 32 ? bs : 32;
  double s = 0;
  for (int64_t k0 = 0; k0 < k; k0 += chunk) {
    quant_dequantize_row(t, (const char *)w + dtype_row_bytes(t, k0), wf, chunk);
    for (int j = 0; j < chunk; j++)
      s += (double)wf[j] * cpu_quant_act_value(t, a, k0 + j);
  }
  return (float)s;
}

float cpu_quant_vec_dot_prefill(enum dtype t, const void *w, const void *a, int64_t k) {
  return cpu_quant_vec_dot(t, w, a, k);
}
#endif

int cpu_quant_prefill_tokens(enum dtype t, int T) {
  switch (t) {
  case DTYPE_Q4_K: return T >= 4 ? T - T % 4 : 0;
  case DTYPE_Q5_K: case DTYPE_Q6_K: return T >= 8 ? T : 0;
  default: return 0;
  }
}

int cpu_quant_matmul(struct backend *be, float *out, const float *x, const struct weight *w,
                     const struct weight *bias, int T) {
  const int64_t N = w->rows, K = w->cols;
  const enum dtype dt = w->dtype;
  const int64_t ablock = cpu_quant_act_is_k(dt) ? QK_K : 32;
  if (K % ablock || K % dtype_block_size(dt))
    return ERR("matmul: %s weight with %lld columns", dtype_name(dt), (long long)K);
  const size_t act_row = cpu_quant_act_bytes(dt, K);
  char *act = malloc(act_row * (size_t)T);
  if (!act)
    return ERR("matmul: out of memory for %d quantized activation rows", T);
#pragma omp parallel for schedule(static) num_threads(be->num_threads) if (T > 8)
  for (int t = 0; t < T; t++)
    cpu_quantize_act_for(dt, x + (size_t)t * K, act + (size_t)t * act_row, K);
  const int np = cpu_quant_prefill_tokens(dt, T); /* the first np tokens take the prefill order */
  const size_t row_bytes = dtype_row_bytes(dt, K);
  const int64_t num_tasks = (N + QROWS - 1) / QROWS;
  const char *wd = w->data;
#if QD_SIMD
  dot4_fn dot4 = dot4_for(dt), dot4p = dot4p_for(dt);
#endif
#pragma omp parallel for schedule(static) num_threads(be->num_threads) if (num_tasks > 1)
  for (int64_t task = 0; task < num_tasks; task++) {
    int64_t r0 = task * QROWS, r1 = r0 + QROWS < N ? r0 + QROWS : N;
    for (int64_t r = r0; r < r1; r++) {
      const char *wr = wd + (size_t)r * row_bytes;
      float b = bias ? cpu_weight_elem(bias, r) : 0.0f;
      int t = 0;
#if QD_SIMD
      /* 4 tokens share each decoded block; each gets the bits it would get alone in the same
       * order (np is a multiple of 4 or T) */
      for (; dot4 && t + QD_NT <= T; t += QD_NT) {
        const void *a4[QD_NT];
        float o4[QD_NT];
        for (int j = 0; j < QD_NT; j++)
          a4[j] = act + (size_t)(t + j) * act_row;
        (t < np ? dot4p : dot4)(wr, a4, K, o4);
        for (int j = 0; j < QD_NT; j++)
          out[(size_t)(t + j) * N + r] = b + o4[j];
      }
#endif
      for (; t < T; t++)
        out[(size_t)t * N + r] = b + (t < np ? cpu_quant_vec_dot_prefill : cpu_quant_vec_dot)(
                                         dt, wr, act + (size_t)t * act_row, K);
    }
  }
  free(act);
  return 0;
}
