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

void cpu_quantize_act(const float *x, struct cpu_act_q8 *a, int64_t k) {
  for (int64_t b = 0; b < k / 32; b++, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
      amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d > 0.0f ? 127.0f / amax : 0.0f;
    a[b].d = d;
    int s0 = 0, s1 = 0;
    for (int j = 0; j < 32; j++) {
      int q = (int)lrintf(x[j] * id);
      q = q > 127 ? 127 : q < -127 ? -127 : q;
      a[b].qs[j] = (int8_t)q;
      if (j < 16)
        s0 += q;
      else
        s1 += q;
    }
    a[b].s[0] = (int16_t)s0;
    a[b].s[1] = (int16_t)s1;
  }
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

static float dot_q4_0(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q4_0 *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int64_t i = 0; i < k / 32; i++) {
    float d = h2f(w[i].d) * a[i].d;
    ACC1(idot_u(nibbles16(w[i].qs), a[i].qs), d);
    bias -= 8.0f * d * (float)(a[i].s[0] + a[i].s[1]);
  }
  return hsum(acc) + bias;
}

static float dot_q4_1(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q4_1 *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int64_t i = 0; i < k / 32; i++) {
    ACC1(idot_u(nibbles16(w[i].qs), a[i].qs), h2f(w[i].d) * a[i].d);
    bias += h2f(w[i].m) * a[i].d * (float)(a[i].s[0] + a[i].s[1]);
  }
  return hsum(acc) + bias;
}

static float dot_q5_0(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q5_0 *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int64_t i = 0; i < k / 32; i++) {
    uint32_t qh;
    memcpy(&qh, w[i].qh, 4);
    float d = h2f(w[i].d) * a[i].d;
    ACC1(idot_u(_mm256_or_si256(nibbles16(w[i].qs), bits_to_0x10(qh)), a[i].qs), d);
    bias -= 16.0f * d * (float)(a[i].s[0] + a[i].s[1]);
  }
  return hsum(acc) + bias;
}

static float dot_q5_1(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q5_1 *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int64_t i = 0; i < k / 32; i++) {
    uint32_t qh;
    memcpy(&qh, w[i].qh, 4);
    ACC1(idot_u(_mm256_or_si256(nibbles16(w[i].qs), bits_to_0x10(qh)), a[i].qs), h2f(w[i].d) * a[i].d);
    bias += h2f(w[i].m) * a[i].d * (float)(a[i].s[0] + a[i].s[1]);
  }
  return hsum(acc) + bias;
}

static float dot_q8_0(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q8_0 *w = vw;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < k / 32; i++)
    ACC1(idot_s(_mm256_loadu_si256((const __m256i *)w[i].qs), a[i].qs), h2f(w[i].d) * a[i].d);
  return hsum(acc);
}

static float dot_iq4_nl(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_iq4_nl *w = vw;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < k / 32; i++)
    ACC1(idot_s(iq4_lookup(nibbles16(w[i].qs)), a[i].qs), h2f(w[i].d) * a[i].d);
  return hsum(acc);
}

static float dot_q2_K(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q2_K *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < k / QK_K; i++, a += 8) {
    float d = h2f(w[i].d), dmin = h2f(w[i].dmin);
    for (int h = 0; h < 2; h++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
      for (int p = 0; p < 4; p++) {
        int c = 4 * h + p;
        uint8_t s0 = w[i].scales[2 * c], s1 = w[i].scales[2 * c + 1];
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * p), m3);
        float ad = a[c].d;
        ACC2(idot_u(u, a[c].qs), d * ad * (float)(s0 & 0xF), d * ad * (float)(s1 & 0xF));
        bias -= dmin * ad * ((float)(s0 >> 4) * a[c].s[0] + (float)(s1 >> 4) * a[c].s[1]);
      }
    }
  }
  return hsum(acc) + bias;
}

static float dot_q3_K(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q3_K *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < k / QK_K; i++, a += 8) {
    float d = h2f(w[i].d);
    __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask);
    for (int h = 0; h < 2; h++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
      for (int p = 0; p < 4; p++) {
        int c = 4 * h + p;
        /* level + 4 = low 2 bits + 4 * high bit: unsigned 0..7 */
        __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * p), m3);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, c), one);
        __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
        float ad = a[c].d;
        float sc0 = d * ad * (float)q3_K_scale(w[i].scales, 2 * c);
        float sc1 = d * ad * (float)q3_K_scale(w[i].scales, 2 * c + 1);
        ACC2(idot_u(u, a[c].qs), sc0, sc1);
        bias -= 4.0f * (sc0 * a[c].s[0] + sc1 * a[c].s[1]);
      }
    }
  }
  return hsum(acc) + bias;
}

static float dot_q4_K(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q4_K *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < k / QK_K; i++, a += 8) {
    float d = h2f(w[i].d), dmin = h2f(w[i].dmin);
    for (int p = 0; p < 4; p++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * p));
      for (int half = 0; half < 2; half++) {
        int c = 2 * p + half;
        uint8_t sc, m;
        get_scale_min_k4(c, w[i].scales, &sc, &m);
        __m256i u = half ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
        float ad = a[c].d;
        ACC1(idot_u(u, a[c].qs), d * ad * (float)sc);
        bias -= dmin * ad * (float)m * (float)(a[c].s[0] + a[c].s[1]);
      }
    }
  }
  return hsum(acc) + bias;
}

static float dot_q5_K(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q5_K *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < k / QK_K; i++, a += 8) {
    float d = h2f(w[i].d), dmin = h2f(w[i].dmin);
    __m256i qh = _mm256_loadu_si256((const __m256i *)w[i].qh);
    for (int p = 0; p < 4; p++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * p));
      for (int half = 0; half < 2; half++) {
        int c = 2 * p + half;
        uint8_t sc, m;
        get_scale_min_k4(c, w[i].scales, &sc, &m);
        __m256i u = half ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
        __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, c), one);
        u = _mm256_or_si256(u, _mm256_slli_epi16(hb, 4));
        float ad = a[c].d;
        ACC1(idot_u(u, a[c].qs), d * ad * (float)sc);
        bias -= dmin * ad * (float)m * (float)(a[c].s[0] + a[c].s[1]);
      }
    }
  }
  return hsum(acc) + bias;
}

static float dot_q6_K(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_q6_K *w = vw;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < k / QK_K; i++, a += 8) {
    float d = h2f(w[i].d);
    for (int h = 0; h < 2; h++) {
      __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
      __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
      __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
      for (int g = 0; g < 4; g++) {
        int c = 4 * h + g;
        __m256i ql = g % 2 ? ql1 : ql0;
        __m256i lo = _mm256_and_si256(g / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m3);
        __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        float ad = a[c].d;
        float sc0 = d * ad * (float)w[i].scales[2 * c], sc1 = d * ad * (float)w[i].scales[2 * c + 1];
        ACC2(idot_u(u, a[c].qs), sc0, sc1);
        bias -= 32.0f * (sc0 * a[c].s[0] + sc1 * a[c].s[1]);
      }
    }
  }
  return hsum(acc) + bias;
}

static float dot_iq4_xs(const void *vw, const struct cpu_act_q8 *a, int64_t k) {
  const struct block_iq4_xs *w = vw;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < k / QK_K; i++, a += 8) {
    float d = h2f(w[i].d);
    for (int c = 0; c < 8; c++) {
      int ls = ((w[i].scales_l[c / 2] >> (4 * (c % 2))) & 0xF) | (((w[i].scales_h >> (2 * c)) & 3) << 4);
      ACC1(idot_s(iq4_lookup(nibbles16(w[i].qs + 16 * c)), a[c].qs), d * a[c].d * (float)(ls - 32));
    }
  }
  return hsum(acc);
}

typedef float (*dot_fn)(const void *w, const struct cpu_act_q8 *a, int64_t k);

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

int cpu_quant_supported(enum dtype t) { return dot_for(t) != NULL; }

float cpu_quant_vec_dot(enum dtype t, const void *w, const struct cpu_act_q8 *a, int64_t k) {
  dot_fn f = dot_for(t);
  return f ? f(w, a, k) : NAN;
}
#else
int cpu_quant_supported(enum dtype t) {
  (void)t;
  return 0; /* without AVX2 the matmul dequantizes tiles to f32 instead */
}

/* Scalar reference: the dequantized weights times the dequantized activations. */
float cpu_quant_vec_dot(enum dtype t, const void *w, const struct cpu_act_q8 *a, int64_t k) {
  float wf[256];
  int bs = dtype_block_size(t);
  int chunk = bs > 32 ? bs : 32;
  double s = 0;
  for (int64_t k0 = 0; k0 < k; k0 += chunk) {
    quant_dequantize_row(t, (const char *)w + dtype_row_bytes(t, k0), wf, chunk);
    for (int j = 0; j < chunk; j++)
      s += (double)wf[j] * a[(k0 + j) / 32].d * a[(k0 + j) / 32].qs[(k0 + j) % 32];
  }
  return (float)s;
}
#endif

int cpu_quant_matmul(struct backend *be, float *out, const float *x, const struct weight *w,
                     const struct weight *bias, int T) {
  const int64_t N = w->rows, K = w->cols, nb = K / 32;
  if (K % 32 || K % dtype_block_size(w->dtype))
    return ERR("matmul: %s weight with %lld columns", dtype_name(w->dtype), (long long)K);
  struct cpu_act_q8 *act = malloc(sizeof *act * (size_t)(nb * T));
  if (!act)
    return ERR("matmul: out of memory for %d quantized activation rows", T);
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (T > 8)
  for (int t = 0; t < T; t++)
    cpu_quantize_act(x + (size_t)t * K, act + (size_t)t * nb, K);
  const size_t row_bytes = dtype_row_bytes(w->dtype, K);
  const int64_t n_tasks = (N + QROWS - 1) / QROWS;
  const char *wd = w->data;
  enum dtype dt = w->dtype;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (n_tasks > 1)
  for (int64_t task = 0; task < n_tasks; task++) {
    int64_t r0 = task * QROWS, r1 = r0 + QROWS < N ? r0 + QROWS : N;
    for (int64_t r = r0; r < r1; r++) {
      float b = bias ? cpu_weight_elem(bias, r) : 0.0f;
      for (int t = 0; t < T; t++)
        out[(size_t)t * N + r] = b + cpu_quant_vec_dot(dt, wd + (size_t)r * row_bytes, act + (size_t)t * nb, K);
    }
  }
  free(act);
  return 0;
}
