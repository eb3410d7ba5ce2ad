/* quant.c - scalar reference (de)quantizers for the GGML block types (layouts in quant.h). */
#include "util/quant.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "util/dtype.h"

static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 layout");
static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 layout");
static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 layout");
static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 layout");
static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 layout");
static_assert(sizeof(struct block_q2_K) == 84, "block_q2_K layout");
static_assert(sizeof(struct block_q3_K) == 110, "block_q3_K layout");
static_assert(sizeof(struct block_q4_K) == 144, "block_q4_K layout");
static_assert(sizeof(struct block_q5_K) == 176, "block_q5_K layout");
static_assert(sizeof(struct block_q6_K) == 210, "block_q6_K layout");
static_assert(sizeof(struct block_q8_K) == 292, "block_q8_K layout");
static_assert(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl layout");
static_assert(sizeof(struct block_iq4_xs) == 136, "block_iq4_xs layout");
static_assert(Q8_0_BYTES == sizeof(struct block_q8_0) && Q8_0_BLOCK == QK8_0, "dtype.h q8_0");

const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

const char *ggml_type_name(uint32_t id) {
  static const char *names[] = {"F32",     "F16",     "Q4_0",   "Q4_1",   "Q4_2",   "Q4_3",
                                "Q5_0",    "Q5_1",    "Q8_0",   "Q8_1",   "Q2_K",   "Q3_K",
                                "Q4_K",    "Q5_K",    "Q6_K",   "Q8_K",   "IQ2_XXS", "IQ2_XS",
                                "IQ3_XXS", "IQ1_S",   "IQ4_NL", "IQ3_S",  "IQ2_S",  "IQ4_XS",
                                "I8",      "I16",     "I32",    "I64",    "F64",    "IQ1_M",
                                "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0"};
  return id < sizeof names / sizeof names[0] ? names[id] : "unknown";
}

#define H2F(h) f16_to_f32(h)
#define F2H(f) f32_to_f16(f)

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- dequantizers ---------------------------------------------------------------------- */

void dequantize_row_q4_0(const struct block_q4_0 *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
    float d = H2F(x[i].d);
    for (int j = 0; j < QK4_0 / 2; j++) {
      y[j] = d * (float)((x[i].qs[j] & 0xF) - 8);
      y[j + QK4_0 / 2] = d * (float)((x[i].qs[j] >> 4) - 8);
    }
  }
}

void dequantize_row_q4_1(const struct block_q4_1 *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
    float d = H2F(x[i].d), m = H2F(x[i].m);
    for (int j = 0; j < QK4_1 / 2; j++) {
      y[j] = (float)(x[i].qs[j] & 0xF) * d + m;
      y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_row_q5_0(const struct block_q5_0 *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
    float d = H2F(x[i].d);
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < QK5_0 / 2; j++) {
      int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
      y[j] = d * (float)(((x[i].qs[j] & 0xF) | (h0 << 4)) - 16);
      y[j + QK5_0 / 2] = d * (float)(((x[i].qs[j] >> 4) | (h1 << 4)) - 16);
    }
  }
}

void dequantize_row_q5_1(const struct block_q5_1 *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
    float d = H2F(x[i].d), m = H2F(x[i].m);
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < QK5_1 / 2; j++) {
      int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
      y[j] = (float)((x[i].qs[j] & 0xF) | (h0 << 4)) * d + m;
      y[j + QK5_1 / 2] = (float)((x[i].qs[j] >> 4) | (h1 << 4)) * d + m;
    }
  }
}

void dequantize_row_q8_0(const struct block_q8_0 *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
    float d = H2F(x[i].d);
    for (int j = 0; j < QK8_0; j++)
      y[j] = d * (float)x[i].qs[j];
  }
}

/* Q2_K: element e of the super-block: 128-element half h = e / 128, within it the 2-bit plane
 * p = (e % 128) / 32 at shift 2p of byte qs[32h + e % 32]; sub-block e / 16. */
void dequantize_row_q2_K(const struct block_q2_K *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
    float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    for (int e = 0; e < QK_K; e++) {
      int h = e / 128, p = (e % 128) / 32, sc = x[i].scales[e / 16];
      int q = (x[i].qs[32 * h + e % 32] >> (2 * p)) & 3;
      y[e] = d * (float)(sc & 0xF) * (float)q - dmin * (float)(sc >> 4);
    }
  }
}

/* Q3_K: as Q2_K for the 2 low bits; the high bit of element e is bit (e / 32) of hmask[e % 32]. */
void dequantize_row_q3_K(const struct block_q3_K *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
    float d = H2F(x[i].d);
    for (int e = 0; e < QK_K; e++) {
      int h = e / 128, p = (e % 128) / 32;
      int q = (x[i].qs[32 * h + e % 32] >> (2 * p)) & 3;
      int hi = (x[i].hmask[e % 32] >> (e / 32)) & 1;
      y[e] = d * (float)q3_K_scale(x[i].scales, e / 16) * (float)(q - (hi ? 0 : 4));
    }
  }
}

/* Q4_K: 64-element pair p = e / 64 uses bytes qs[32p .. 32p + 31]: low nibbles for its first
 * 32 elements, high nibbles for the next 32. */
void dequantize_row_q4_K(const struct block_q4_K *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
    float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    for (int s = 0; s < QK_K / 32; s++) {
      uint8_t sc, m;
      get_scale_min_k4(s, x[i].scales, &sc, &m);
      float ds = d * (float)sc, dm = dmin * (float)m;
      const uint8_t *q = x[i].qs + 32 * (s / 2);
      for (int l = 0; l < 32; l++)
        y[32 * s + l] = ds * (float)((s & 1) ? q[l] >> 4 : q[l] & 0xF) - dm;
    }
  }
}

/* Q5_K: as Q4_K; the fifth bit of element 32s + l is bit s of qh[l]. */
void dequantize_row_q5_K(const struct block_q5_K *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
    float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    for (int s = 0; s < QK_K / 32; s++) {
      uint8_t sc, m;
      get_scale_min_k4(s, x[i].scales, &sc, &m);
      float ds = d * (float)sc, dm = dmin * (float)m;
      const uint8_t *q = x[i].qs + 32 * (s / 2);
      for (int l = 0; l < 32; l++) {
        int v = ((s & 1) ? q[l] >> 4 : q[l] & 0xF) | (((x[i].qh[l] >> s) & 1) << 4);
        y[32 * s + l] = ds * (float)v - dm;
      }
    }
  }
}

/* Q6_K: element e: half h = e / 128, quarter g = (e % 128) / 32, l = e % 32. Low 4 bits: nibble
 * (g / 2) of ql[64h + 32(g % 2) + l]; high 2 bits: bits 2g of qh[32h + l]. */
void dequantize_row_q6_K(const struct block_q6_K *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
    float d = H2F(x[i].d);
    for (int e = 0; e < QK_K; e++) {
      int h = e / 128, g = (e % 128) / 32, l = e % 32;
      int lo = (x[i].ql[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0xF;
      int hi = (x[i].qh[32 * h + l] >> (2 * g)) & 3;
      y[e] = d * (float)x[i].scales[e / 16] * (float)((lo | (hi << 4)) - 32);
    }
  }
}

void dequantize_row_q8_K(const struct block_q8_K *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, y += QK_K)
    for (int j = 0; j < QK_K; j++)
      y[j] = x[i].d * (float)x[i].qs[j];
}

void dequantize_row_iq4_nl(const struct block_iq4_nl *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) {
    float d = H2F(x[i].d);
    for (int j = 0; j < QK4_NL / 2; j++) {
      y[j] = d * (float)iq4nl_values[x[i].qs[j] & 0xF];
      y[j + QK4_NL / 2] = d * (float)iq4nl_values[x[i].qs[j] >> 4];
    }
  }
}

void dequantize_row_iq4_xs(const struct block_iq4_xs *x, float *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++) {
    float d = H2F(x[i].d);
    for (int s = 0; s < QK_K / 32; s++, y += 32) {
      int ls = ((x[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((x[i].scales_h >> (2 * s)) & 3) << 4);
      float dl = d * (float)(ls - 32);
      const uint8_t *q = x[i].qs + 16 * s;
      for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)iq4nl_values[q[j] & 0xF];
        y[j + 16] = dl * (float)iq4nl_values[q[j] >> 4];
      }
    }
  }
}

/* ---- quantizers ------------------------------------------------------------------------ */
/* Q4_0 .. Q8_0 follow ggml's reference rounding exactly, so their bytes match other tools. */

/* The element of largest magnitude (the first one on ties), with its sign. */
static float signed_absmax(const float *x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; j++)
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      max = x[j];
    }
  return max;
}

/* The 32 levels Q of a Q4_0 / Q4_1 block: level j in the low nibble of qs[j % 16] for j < 16, in the high one
 * after (the layout dequantize_row_q4_0 reads). */
static void pack_q4(const int *q, uint8_t *qs) {
  for (int j = 0; j < 16; j++)
    qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

/* The same for Q5_0 / Q5_1: the low 4 bits of the levels as in pack_q4, the fifth bit of level j in bit j of
 * QH (4 bytes, little-endian). */
static void pack_q5(const int *q, uint8_t *qs, uint8_t *qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 16; j++) {
    qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    bits |= (uint32_t)(q[j] >> 4) << j;
    bits |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
  }
  memcpy(qh, &bits, 4);
}

static void minmax(const float *x, int n, float *mn, float *mx) {
  *mn = FLT_MAX;
  *mx = -FLT_MAX;
  for (int j = 0; j < n; j++) {
    if (x[j] < *mn)
      *mn = x[j];
    if (x[j] > *mx)
      *mx = x[j];
  }
}

/* The levels Q of a 32-value Q4_0 / Q5_0 block, x = d * (q - HALF) with q in [0, 2 * HALF - 1]; returns d.
 * ggml's rounding: HALF 8 gives its / -8.0f and + 8.5f exactly. */
static float levels_sym(const float *x, int half, int *q) {
  float d = signed_absmax(x, 32) / -(float)half;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; j++) {
    float v = x[j] * id; /* its own statement, as ggml: one expression could be contracted to an FMA */
    q[j] = clampi((int8_t)(v + ((float)half + 0.5f)), 0, 2 * half - 1);
  }
  return d;
}

/* The levels Q of a 32-value Q4_1 / Q5_1 block, x = d * q + m with q in [0, NMAX]; returns d, the min in *M.
 * ggml casts Q4_1's levels through int8_t and Q5_1's through uint8_t: the value is in [0, NMAX + 1) here
 * (x >= m), where the two agree. */
static float levels_min(const float *x, int nmax, int *q, float *m) {
  float mn, mx;
  minmax(x, 32, &mn, &mx);
  float d = (mx - mn) / (float)nmax;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; j++) {
    float v = (x[j] - mn) * id; /* its own statement (levels_sym says why) */
    q[j] = clampi((int8_t)(v + 0.5f), 0, nmax);
  }
  *m = mn;
  return d;
}

void quantize_row_q4_0(const float *x, struct block_q4_0 *y, int64_t k) {
  for (int64_t i = 0; i < k / QK4_0; i++, x += QK4_0) {
    int q[QK4_0];
    y[i].d = F2H(levels_sym(x, 8, q));
    pack_q4(q, y[i].qs);
  }
}

void quantize_row_q4_1(const float *x, struct block_q4_1 *y, int64_t k) {
  for (int64_t i = 0; i < k / QK4_1; i++, x += QK4_1) {
    int q[QK4_1];
    float m;
    y[i].d = F2H(levels_min(x, 15, q, &m));
    y[i].m = F2H(m);
    pack_q4(q, y[i].qs);
  }
}

void quantize_row_q5_0(const float *x, struct block_q5_0 *y, int64_t k) {
  for (int64_t i = 0; i < k / QK5_0; i++, x += QK5_0) {
    int q[QK5_0];
    y[i].d = F2H(levels_sym(x, 16, q));
    pack_q5(q, y[i].qs, y[i].qh);
  }
}

void quantize_row_q5_1(const float *x, struct block_q5_1 *y, int64_t k) {
  for (int64_t i = 0; i < k / QK5_1; i++, x += QK5_1) {
    int q[QK5_1];
    float m;
    y[i].d = F2H(levels_min(x, 31, q, &m));
    y[i].m = F2H(m);
    pack_q5(q, y[i].qs, y[i].qh);
  }
}

void quantize_row_q8_0(const float *x, struct block_q8_0 *y, int64_t k) {
  for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++)
      amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < QK8_0; j++)
      y[i].qs[j] = (int8_t)roundf(x[j] * id);
  }
}

void quantize_row_q8_K(const float *x, struct block_q8_K *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
    float max = signed_absmax(x, QK_K);
    if (max == 0.0f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; j++)
      y[i].qs[j] = (int8_t)clampi((int)lrintf(iscale * x[j]), -127, 127);
    for (int s = 0; s < QK_K / 16; s++) {
      int sum = 0;
      for (int j = 0; j < 16; j++)
        sum += y[i].qs[16 * s + j];
      y[i].bsums[s] = (int16_t)sum;
    }
    y[i].d = 1.0f / iscale;
  }
}

/* The K-quant quantizers are llama.cpp's reference ones (ggml-quants.c: quantize_row_q4_K_ref,
 * q5_K_ref, q6_K_ref, what llama-quantize runs without an importance matrix), so --isq gives
 * llama-quantize's bytes (tests/c/test_quant_llamacpp.c). ggml-base is compiled without FMA, and
 * this file with -std=c11 (no contraction): each float operation below is one rounding in the
 * same order as there. Rounding to the nearest level is lrintf (ggml's nearest_int: the same for
 * |v| < 2^22, the only range these reach). */

/* Levels L[i] in [0, nmax] for x ~ scale * L + min over N values (min <= 0), weighted least
 * squares over NSTEP + 1 trial inverse scales (nmax + rmin + rdelta * is) / (max - min); returns
 * the scale and -min in *NEG_MIN (ggml's make_qkx2_quants, squared error). */
static float fit_asym_levels(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                             float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min)
      min = x[i];
    if (x[i] > max)
      max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0.0f)
    min = 0.0f;
  if (max == min) {
    memset(L, 0, (size_t)n);
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = (float)nmax / (max - min), scale = 1.0f / iscale, best_error = 0.0f;
  for (int i = 0; i < n; i++) {
    L[i] = (uint8_t)clampi((int)lrintf(iscale * (x[i] - min)), 0, nmax);
    float diff = scale * (float)L[i] + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  uint8_t Laux[32];
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; i++) {
      int l = clampi((int)lrintf(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = (uint8_t)l;
      float wl = w[i] * (float)l;
      sum_l += wl;
      sum_l2 += wl * (float)l;
      sum_xl += wl * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; i++) {
        float diff = this_scale * (float)Laux[i] + this_min - x[i];
        cur_error += w[i] * (diff * diff);
      }
      if (cur_error < best_error) {
        memcpy(L, Laux, (size_t)n);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

/* Packs 6-bit scales SC and mins M of 8 sub-blocks into the 12 bytes of Q4_K / Q5_K (the inverse
 * of get_scale_min_k4). */
static void pack_scale_min_k4(const uint8_t *sc, const uint8_t *m, uint8_t *q) {
  memset(q, 0, K_SCALE_SIZE);
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      q[j] |= sc[j];
      q[j + 4] |= m[j];
    } else {
      q[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
      q[j] |= (uint8_t)((m[j] >> 4) << 6);
    }
  }
}

/* Shared by Q4_K (NMAX 15: rmin -1, 20 steps) and Q5_K (NMAX 31: rmin -0.5, 15 steps): d, dmin,
 * the packed scales and the levels L[256] of one super-block. Each 32-value sub-block is fitted
 * with weights rms(x) + |x_i|; the scales and mins are rounded to 6 bits of the largest; the
 * levels are then recomputed with the rounded ones (a sub-block whose rounded scale is 0 keeps
 * its fitted levels). */
static void quantize_k_asym(const float *x, int nmax, float rmin, int nstep, qhalf *dh, qhalf *dminh,
                            uint8_t *scales, uint8_t *L) {
  float sc[8], mn[8], w[32], max_sc = 0.0f, max_mn = 0.0f;
  for (int s = 0; s < 8; s++) {
    const float *xs = x + 32 * s;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; l++)
      sum_x2 += xs[l] * xs[l];
    float av_x = sqrtf(sum_x2 / 32.0f);
    for (int l = 0; l < 32; l++)
      w[l] = av_x + fabsf(xs[l]);
    sc[s] = fit_asym_levels(32, nmax, xs, w, L + 32 * s, &mn[s], rmin, 0.1f, nstep);
    if (sc[s] > max_sc)
      max_sc = sc[s];
    if (mn[s] > max_mn)
      max_mn = mn[s];
  }
  float inv_sc = max_sc > 0.0f ? 63.0f / max_sc : 0.0f, inv_mn = max_mn > 0.0f ? 63.0f / max_mn : 0.0f;
  uint8_t qs[8], qm[8];
  for (int s = 0; s < 8; s++) { /* as uint8_t, then at most 63 (a negative scale wraps to 63, as in ggml) */
    qs[s] = (uint8_t)lrintf(inv_sc * sc[s]);
    qm[s] = (uint8_t)lrintf(inv_mn * mn[s]);
    qs[s] = qs[s] < 63 ? qs[s] : 63;
    qm[s] = qm[s] < 63 ? qm[s] : 63;
  }
  pack_scale_min_k4(qs, qm, scales);
  *dh = F2H(max_sc / 63.0f);
  *dminh = F2H(max_mn / 63.0f);
  for (int s = 0; s < 8; s++) {
    float ds = H2F(*dh) * (float)qs[s];
    if (ds == 0.0f)
      continue;
    float dm = H2F(*dminh) * (float)qm[s];
    for (int l = 0; l < 32; l++)
      L[32 * s + l] = (uint8_t)clampi((int)lrintf((x[32 * s + l] + dm) / ds), 0, nmax);
  }
}

void quantize_row_q4_K(const float *x, struct block_q4_K *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
    uint8_t L[QK_K];
    quantize_k_asym(x, 15, -1.0f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
    for (int s = 0; s < 8; s += 2)
      for (int l = 0; l < 32; l++)
        y[i].qs[16 * s + l] = (uint8_t)(L[32 * s + l] | (L[32 * (s + 1) + l] << 4));
  }
}

void quantize_row_q5_K(const float *x, struct block_q5_K *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
    uint8_t L[QK_K];
    quantize_k_asym(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
    memset(y[i].qh, 0, sizeof y[i].qh);
    for (int s = 0; s < 8; s++)
      for (int l = 0; l < 32; l++)
        y[i].qh[l] |= (uint8_t)((L[32 * s + l] >> 4) << s);
    for (int s = 0; s < 8; s += 2)
      for (int l = 0; l < 32; l++)
        y[i].qs[16 * s + l] = (uint8_t)((L[32 * s + l] & 0xF) | ((L[32 * (s + 1) + l] & 0xF) << 4));
  }
}

/* Q6_K sub-block scale (ggml's make_qx_quants with weights x^2): the largest magnitude v at
 * level -nmax, then the inverse scales -(nmax + 0.1 is) / v for is = -9..9, keeping the best
 * weighted least-squares fit; L[i] = level + nmax. */
static float fit_sym_levels(int n, int nmax, const float *x, int8_t *L) {
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; i++)
    if (fabsf(x[i]) > amax) {
      amax = fabsf(x[i]);
      max = x[i];
    }
  if (amax < 1e-15f) {
    memset(L, 0, (size_t)n);
    return 0.0f;
  }
  float iscale = (float)-nmax / max, sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; i++) {
    int l = clampi((int)lrintf(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)(l + nmax);
    float w = x[i] * x[i];
    sumlx += w * x[i] * (float)l;
    suml2 += w * (float)l * (float)l;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (is == 0)
      continue;
    iscale = -((float)nmax + 0.1f * (float)is) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
      float l = (float)clampi((int)lrintf(iscale * x[i]), -nmax, nmax - 1), w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++)
        L[i] = (int8_t)(nmax + clampi((int)lrintf(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quantize_row_q6_K(const float *x, struct block_q6_K *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
    float sc[16], max_sc = 0.0f, amax_sc = 0.0f;
    int8_t L[QK_K];
    for (int s = 0; s < 16; s++) {
      sc[s] = fit_sym_levels(16, 32, x + 16 * s, L + 16 * s);
      if (fabsf(sc[s]) > amax_sc) {
        amax_sc = fabsf(sc[s]);
        max_sc = sc[s];
      }
    }
    if (amax_sc < 1e-15f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    float iscale = -128.0f / max_sc;
    y[i].d = F2H(1.0f / iscale);
    for (int s = 0; s < 16; s++) {
      int q = (int)lrintf(iscale * sc[s]);
      y[i].scales[s] = (int8_t)(q < 127 ? q : 127);
      float ds = H2F(y[i].d) * (float)y[i].scales[s];
      if (ds == 0.0f)
        continue;
      for (int l = 0; l < 16; l++)
        L[16 * s + l] = (int8_t)(clampi((int)lrintf(x[16 * s + l] / ds), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 32; l++) {
        const uint8_t *q = (const uint8_t *)L + 128 * h + l; /* q[0], q[32], q[64], q[96]: quarters 0..3 */
        y[i].ql[64 * h + l] = (uint8_t)((q[0] & 0xF) | ((q[64] & 0xF) << 4));
        y[i].ql[64 * h + 32 + l] = (uint8_t)((q[32] & 0xF) | ((q[96] & 0xF) << 4));
        y[i].qh[32 * h + l] = (uint8_t)((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
      }
  }
}

static int iq4nl_nearest(float v) {
  int best = 0;
  float be = fabsf(v - iq4nl_values[0]);
  for (int i = 1; i < 16; i++) {
    float e = fabsf(v - iq4nl_values[i]);
    if (e < be)
      be = e, best = i;
  }
  return best;
}

/* Best scale of N values on the IQ4_NL grid: the largest magnitude on level -127, then one
 * least-squares refit of the scale over the chosen levels. */
static float iq4nl_scale(const float *x, int n) {
  float d = signed_absmax(x, n) / -127.0f;
  if (d == 0.0f)
    return 0.0f;
  double sxl = 0, sll = 0;
  for (int j = 0; j < n; j++) {
    int l = iq4nl_values[iq4nl_nearest(x[j] / d)];
    sxl += (double)x[j] * l;
    sll += (double)l * l;
  }
  return sll > 0 ? (float)(sxl / sll) : d;
}

void quantize_row_iq4_nl(const float *x, struct block_iq4_nl *y, int64_t k) {
  for (int64_t i = 0; i < k / QK4_NL; i++, x += QK4_NL) {
    y[i].d = F2H(iq4nl_scale(x, QK4_NL));
    float d = H2F(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK4_NL / 2; j++)
      y[i].qs[j] = (uint8_t)(iq4nl_nearest(x[j] * id) | (iq4nl_nearest(x[j + 16] * id) << 4));
  }
}

void quantize_row_iq4_xs(const float *x, struct block_iq4_xs *y, int64_t k) {
  for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
    float sc[8], max_sc = 0.0f, amax = 0.0f;
    for (int s = 0; s < 8; s++) {
      sc[s] = iq4nl_scale(x + 32 * s, 32);
      if (fabsf(sc[s]) > amax)
        amax = fabsf(sc[s]), max_sc = sc[s];
    }
    float d = max_sc / -32.0f;
    y[i].d = F2H(d);
    d = H2F(y[i].d);
    y[i].scales_h = 0;
    memset(y[i].scales_l, 0, sizeof y[i].scales_l);
    for (int s = 0; s < 8; s++) {
      int ls = d != 0.0f ? clampi((int)lrintf(sc[s] / d), -32, 31) + 32 : 32;
      y[i].scales_l[s / 2] |= (uint8_t)((ls & 0xF) << (4 * (s % 2)));
      y[i].scales_h |= (uint16_t)(((ls >> 4) & 3) << (2 * s));
      float dl = d * (float)(ls - 32), id = dl != 0.0f ? 1.0f / dl : 0.0f;
      const float *xs = x + 32 * s;
      for (int j = 0; j < 16; j++)
        y[i].qs[16 * s + j] = (uint8_t)(iq4nl_nearest(xs[j] * id) | (iq4nl_nearest(xs[j + 16] * id) << 4));
    }
  }
}

/* ---- by dtype -------------------------------------------------------------------------- */

int quant_dequantize_row(int t, const void *src, float *dst, int64_t k) {
  switch (t) {
#define DQ(DT, FN, BT)                                                                            \
  case DT:                                                                                        \
    FN((const struct BT *)src, dst, k);                                                           \
    return 0;
    DQ(DTYPE_Q4_0, dequantize_row_q4_0, block_q4_0)
    DQ(DTYPE_Q4_1, dequantize_row_q4_1, block_q4_1)
    DQ(DTYPE_Q5_0, dequantize_row_q5_0, block_q5_0)
    DQ(DTYPE_Q5_1, dequantize_row_q5_1, block_q5_1)
    DQ(DTYPE_Q8_0, dequantize_row_q8_0, block_q8_0)
    DQ(DTYPE_Q2_K, dequantize_row_q2_K, block_q2_K)
    DQ(DTYPE_Q3_K, dequantize_row_q3_K, block_q3_K)
    DQ(DTYPE_Q4_K, dequantize_row_q4_K, block_q4_K)
    DQ(DTYPE_Q5_K, dequantize_row_q5_K, block_q5_K)
    DQ(DTYPE_Q6_K, dequantize_row_q6_K, block_q6_K)
    DQ(DTYPE_Q8_K, dequantize_row_q8_K, block_q8_K)
    DQ(DTYPE_IQ4_NL, dequantize_row_iq4_nl, block_iq4_nl)
    DQ(DTYPE_IQ4_XS, dequantize_row_iq4_xs, block_iq4_xs)
#undef DQ
  default:
    return -1;
  }
}

int quant_quantize_row(int t, const float *src, void *dst, int64_t k) {
  switch (t) {
#define QZ(DT, FN, BT)                                                                            \
  case DT:                                                                                        \
    FN(src, (struct BT *)dst, k);                                                                 \
    return 0;
    QZ(DTYPE_Q4_0, quantize_row_q4_0, block_q4_0)
    QZ(DTYPE_Q4_1, quantize_row_q4_1, block_q4_1)
    QZ(DTYPE_Q5_0, quantize_row_q5_0, block_q5_0)
    QZ(DTYPE_Q5_1, quantize_row_q5_1, block_q5_1)
    QZ(DTYPE_Q8_0, quantize_row_q8_0, block_q8_0)
    QZ(DTYPE_Q4_K, quantize_row_q4_K, block_q4_K)
    QZ(DTYPE_Q5_K, quantize_row_q5_K, block_q5_K)
    QZ(DTYPE_Q6_K, quantize_row_q6_K, block_q6_K)
    QZ(DTYPE_Q8_K, quantize_row_q8_K, block_q8_K)
    QZ(DTYPE_IQ4_NL, quantize_row_iq4_nl, block_iq4_nl)
    QZ(DTYPE_IQ4_XS, quantize_row_iq4_xs, block_iq4_xs)
#undef QZ
  default:
    return -1;
  }
}

int quant_can_quantize(int t) {
  switch (t) {
  case DTYPE_Q4_0:
  case DTYPE_Q4_1:
  case DTYPE_Q5_0:
  case DTYPE_Q5_1:
  case DTYPE_Q8_0:
  case DTYPE_Q4_K:
  case DTYPE_Q5_K:
  case DTYPE_Q6_K:
  case DTYPE_Q8_K:
  case DTYPE_IQ4_NL:
  case DTYPE_IQ4_XS:
    return 1;
  default:
    return 0;
  }
}
