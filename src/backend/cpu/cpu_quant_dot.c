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

/* Every type is written as a chunk decoder: for chunk c (32 values) of block i it sets
 *   u: the 32 levels (unsigned 0..127 when SIGNED is 0, else signed),
 *   sc0, sc1: the scale of the first and second 16 values (f32, weight units),
 *   mn0, mn1: the offset of each half (w = sc * level + mn),
 * and the driver multiplies the decoded chunk with NT tokens' activations at once, so a prefill
 * unpacks each weight block once per 4 tokens. Each token's arithmetic is the same whatever NT
 * is, so its result does not depend on the batch. */
#define QD_NT 4

#define DEFINE_DOT(NAME, BT, QK, SIGNED, PREP, ...)                                               \
  static inline __attribute__((always_inline)) void NAME##_nt(                                      \
      const void *vw, const struct cpu_act_q8 *const *a, int nt, int64_t k, float *out) {           \
    const BT *w = vw;                                                                               \
    __m256 acc[QD_NT];                                                                              \
    float bias[QD_NT];                                                                              \
    for (int t = 0; t < nt; t++)                                                                    \
      acc[t] = _mm256_setzero_ps(), bias[t] = 0.0f;                                                 \
    for (int64_t i = 0; i < k / (QK); i++) {                                                        \
      PREP;                                                                                         \
      for (int c = 0; c < (QK) / 32; c++) {                                                         \
        __m256i u;                                                                                  \
        float sc0, sc1, mn0, mn1;                                                                   \
        __VA_ARGS__;                                                                                \
        for (int t = 0; t < nt; t++) {                                                              \
          const struct cpu_act_q8 *ac = a[t] + i * ((QK) / 32) + c;                                 \
          float ad = ac->d;                                                                         \
          __m256 p = SIGNED ? idot_s(u, ac->qs) : idot_u(u, ac->qs);                                \
          float s0 = sc0 * ad, s1 = sc1 * ad;                                                       \
          acc[t] = _mm256_fmadd_ps(p, _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1), acc[t]);      \
          bias[t] += ad * (mn0 * (float)ac->s[0] + mn1 * (float)ac->s[1]);                          \
        }                                                                                           \
      }                                                                                             \
    }                                                                                               \
    for (int t = 0; t < nt; t++)                                                                    \
      out[t] = hsum(acc[t]) + bias[t];                                                              \
  }                                                                                                 \
  static void NAME(const void *w, const struct cpu_act_q8 *const *a, int nt, int64_t k, float *out) { \
    switch (nt) {                                                                                   \
    case 4: NAME##_nt(w, a, 4, k, out); break;                                                      \
    case 3: NAME##_nt(w, a, 3, k, out); break;                                                      \
    case 2: NAME##_nt(w, a, 2, k, out); break;                                                      \
    default: NAME##_nt(w, a, 1, k, out); break;                                                     \
    }                                                                                               \
  }

static inline uint32_t rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

DEFINE_DOT(dot_q4_0, struct block_q4_0, 32, 0, float d = h2f(w[i].d),
           u = nibbles16(w[i].qs); sc0 = sc1 = d; mn0 = mn1 = -8.0f * d)
DEFINE_DOT(dot_q4_1, struct block_q4_1, 32, 0, (void)0,
           u = nibbles16(w[i].qs); sc0 = sc1 = h2f(w[i].d); mn0 = mn1 = h2f(w[i].m))
DEFINE_DOT(dot_q5_0, struct block_q5_0, 32, 0, float d = h2f(w[i].d),
           u = _mm256_or_si256(nibbles16(w[i].qs), bits_to_0x10(rd32(w[i].qh))); sc0 = sc1 = d;
           mn0 = mn1 = -16.0f * d)
DEFINE_DOT(dot_q5_1, struct block_q5_1, 32, 0, (void)0,
           u = _mm256_or_si256(nibbles16(w[i].qs), bits_to_0x10(rd32(w[i].qh)));
           sc0 = sc1 = h2f(w[i].d); mn0 = mn1 = h2f(w[i].m))
DEFINE_DOT(dot_q8_0, struct block_q8_0, 32, 1, (void)0,
           u = _mm256_loadu_si256((const __m256i *)w[i].qs); sc0 = sc1 = h2f(w[i].d); mn0 = mn1 = 0.0f)
DEFINE_DOT(dot_iq4_nl, struct block_iq4_nl, 32, 1, (void)0,
           u = iq4_lookup(nibbles16(w[i].qs)); sc0 = sc1 = h2f(w[i].d); mn0 = mn1 = 0.0f)
/* Q2_K: chunk c = 4h + p: bits 2p of qs[32h ..]; sub-blocks 2c, 2c + 1. */
DEFINE_DOT(dot_q2_K, struct block_q2_K, QK_K, 0,
           float d = h2f(w[i].d); float dmin = h2f(w[i].dmin),
           {
             __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (c / 4)));
             u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), _mm256_set1_epi8(3));
             uint8_t s0 = w[i].scales[2 * c], s1 = w[i].scales[2 * c + 1];
             sc0 = d * (float)(s0 & 0xF), sc1 = d * (float)(s1 & 0xF);
             mn0 = -dmin * (float)(s0 >> 4), mn1 = -dmin * (float)(s1 >> 4);
           })
/* Q3_K: level + 4 = low 2 bits + 4 * high bit (bit c of hmask), unsigned 0..7. */
DEFINE_DOT(dot_q3_K, struct block_q3_K, QK_K, 0,
           float d = h2f(w[i].d);
           __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask),
           {
             __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (c / 4)));
             __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), _mm256_set1_epi8(3));
             __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, c), _mm256_set1_epi8(1));
             u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
             sc0 = d * (float)q3_K_scale(w[i].scales, 2 * c);
             sc1 = d * (float)q3_K_scale(w[i].scales, 2 * c + 1);
             mn0 = -4.0f * sc0, mn1 = -4.0f * sc1;
           })
/* Q4_K: chunk c: low (c even) or high nibbles of qs[32 (c / 2) ..]. */
DEFINE_DOT(dot_q4_K, struct block_q4_K, QK_K, 0,
           float d = h2f(w[i].d); float dmin = h2f(w[i].dmin),
           {
             __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (c / 2)));
             u = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
             uint8_t sc, m;
             get_scale_min_k4(c, w[i].scales, &sc, &m);
             sc0 = sc1 = d * (float)sc;
             mn0 = mn1 = -dmin * (float)m;
           })
DEFINE_DOT(dot_q5_K, struct block_q5_K, QK_K, 0,
           float d = h2f(w[i].d); float dmin = h2f(w[i].dmin);
           __m256i qh = _mm256_loadu_si256((const __m256i *)w[i].qh),
           {
             __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * (c / 2)));
             u = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
             __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, c), _mm256_set1_epi8(1));
             u = _mm256_or_si256(u, _mm256_slli_epi16(hb, 4));
             uint8_t sc, m;
             get_scale_min_k4(c, w[i].scales, &sc, &m);
             sc0 = sc1 = d * (float)sc;
             mn0 = mn1 = -dmin * (float)m;
           })
/* Q6_K: chunk c = 4h + g: nibble g / 2 of ql[64h + 32 (g % 2) ..], bits 2g of qh[32h ..]. */
DEFINE_DOT(dot_q6_K, struct block_q6_K, QK_K, 0, float d = h2f(w[i].d),
           {
             int h = c / 4, g = c % 4;
             __m256i ql = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32 * (g % 2)));
             __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
             __m256i lo = _mm256_and_si256(g / 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
             __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), _mm256_set1_epi8(3));
             u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
             sc0 = d * (float)w[i].scales[2 * c], sc1 = d * (float)w[i].scales[2 * c + 1];
             mn0 = -32.0f * sc0, mn1 = -32.0f * sc1;
           })
DEFINE_DOT(dot_iq4_xs, struct block_iq4_xs, QK_K, 1, float d = h2f(w[i].d),
           {
             int ls = ((w[i].scales_l[c / 2] >> (4 * (c % 2))) & 0xF) | (((w[i].scales_h >> (2 * c)) & 3) << 4);
             u = iq4_lookup(nibbles16(w[i].qs + 16 * c));
             sc0 = sc1 = d * (float)(ls - 32);
             mn0 = mn1 = 0.0f;
           })

typedef void (*dot_fn)(const void *w, const struct cpu_act_q8 *const *a, int nt, int64_t k, float *out);

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
  float r = NAN;
  if (f)
    f(w, &a, 1, k, &r);
  return r;
}

/* out[j] = dot(row W, activations A[j]) for j < NT (<= 4). */
static void vec_dot_nt(enum dtype t, const void *w, const struct cpu_act_q8 *const *a, int nt, int64_t k,
                       float *out) {
  dot_for(t)(w, a, nt, k, out);
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

static void vec_dot_nt(enum dtype t, const void *w, const struct cpu_act_q8 *const *a, int nt, int64_t k,
                       float *out) {
  for (int j = 0; j < nt; j++)
    out[j] = cpu_quant_vec_dot(t, w, a[j], k);
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
      for (int t0 = 0; t0 < T; t0 += 4) { /* 4 tokens share each decoded weight block */
        int nt = T - t0 < 4 ? T - t0 : 4;
        const struct cpu_act_q8 *ap[4];
        float o[4];
        for (int j = 0; j < nt; j++)
          ap[j] = act + (size_t)(t0 + j) * nb;
        vec_dot_nt(dt, wd + (size_t)r * row_bytes, ap, nt, K, o);
        for (int j = 0; j < nt; j++)
          out[(size_t)(t0 + j) * N + r] = b + o[j];
      }
    }
  }
  free(act);
  return 0;
}
