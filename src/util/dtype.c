/* dtype.c - dtype names, sizes and conversions to f32 (IEEE half by bit manipulation). */
#include "util/dtype.h"

#include <math.h>
#include <strings.h>

#include "util/quant.h"

/* Per dtype: name, ggml id (-1: none), elements and bytes per block. */
static const struct {
  const char *name;
  int ggml;
  int block;
  size_t bytes;
} info[DTYPE_COUNT] = {
    [DTYPE_F32] = {"f32", GGML_TYPE_F32, 1, 4},
    [DTYPE_F16] = {"f16", GGML_TYPE_F16, 1, 2},
    [DTYPE_BF16] = {"bf16", GGML_TYPE_BF16, 1, 2},
    [DTYPE_Q8_0] = {"q8_0", GGML_TYPE_Q8_0, QK8_0, sizeof(struct block_q8_0)},
    [DTYPE_F8E4M3] = {"f8e4m3", -1, 1, 1},
    [DTYPE_I32] = {"i32", -1, 1, 4},
    [DTYPE_Q4_0] = {"q4_0", GGML_TYPE_Q4_0, QK4_0, sizeof(struct block_q4_0)},
    [DTYPE_Q4_1] = {"q4_1", GGML_TYPE_Q4_1, QK4_1, sizeof(struct block_q4_1)},
    [DTYPE_Q5_0] = {"q5_0", GGML_TYPE_Q5_0, QK5_0, sizeof(struct block_q5_0)},
    [DTYPE_Q5_1] = {"q5_1", GGML_TYPE_Q5_1, QK5_1, sizeof(struct block_q5_1)},
    [DTYPE_Q2_K] = {"q2_k", GGML_TYPE_Q2_K, QK_K, sizeof(struct block_q2_K)},
    [DTYPE_Q3_K] = {"q3_k", GGML_TYPE_Q3_K, QK_K, sizeof(struct block_q3_K)},
    [DTYPE_Q4_K] = {"q4_k", GGML_TYPE_Q4_K, QK_K, sizeof(struct block_q4_K)},
    [DTYPE_Q5_K] = {"q5_k", GGML_TYPE_Q5_K, QK_K, sizeof(struct block_q5_K)},
    [DTYPE_Q6_K] = {"q6_k", GGML_TYPE_Q6_K, QK_K, sizeof(struct block_q6_K)},
    [DTYPE_Q8_K] = {"q8_k", GGML_TYPE_Q8_K, QK_K, sizeof(struct block_q8_K)},
    [DTYPE_IQ4_NL] = {"iq4_nl", GGML_TYPE_IQ4_NL, QK4_NL, sizeof(struct block_iq4_nl)},
    [DTYPE_IQ4_XS] = {"iq4_xs", GGML_TYPE_IQ4_XS, QK_K, sizeof(struct block_iq4_xs)},
};

const char *dtype_name(enum dtype t) { return (unsigned)t < DTYPE_COUNT ? info[t].name : "unknown"; }

int dtype_block_size(enum dtype t) { return (unsigned)t < DTYPE_COUNT ? info[t].block : 1; }

size_t dtype_block_bytes(enum dtype t) { return (unsigned)t < DTYPE_COUNT ? info[t].bytes : 0; }

size_t dtype_row_bytes(enum dtype t, int64_t n) {
  if ((unsigned)t >= DTYPE_COUNT)
    return 0;
  return (size_t)(n / info[t].block) * info[t].bytes;
}

int dtype_from_ggml(uint32_t ggml_type) {
  for (int t = 0; t < DTYPE_COUNT; t++)
    if (info[t].ggml >= 0 && (uint32_t)info[t].ggml == ggml_type && t != DTYPE_Q8_K)
      return t; /* Q8_K is an activation format: never read from files */
  return -1;
}

int dtype_to_ggml(enum dtype t) { return (unsigned)t < DTYPE_COUNT ? info[t].ggml : -1; }

int dtype_from_name(const char *s) {
  for (int t = 0; t < DTYPE_COUNT; t++)
    if (strcasecmp(s, info[t].name) == 0)
      return t;
  return -1;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else { /* subnormal: value = mant * 2^-24 */
      float f = (float)mant * 5.9604644775390625e-8f;
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00);
  if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
    return (uint16_t)(sign | 0x7c00);
  if (a < 0x38800000u) { /* below the smallest normal half: round to a subnormal */
    float af;
    memcpy(&af, &a, 4);
    return (uint16_t)(sign | (uint32_t)lrintf(af * 16777216.0f));
  }
  uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - (112u << 23);
  return (uint16_t)(sign | (r >> 13));
}

void dtype_to_f32(float *dst, const void *src, enum dtype t, int64_t n) {
  switch (t) {
  case DTYPE_F32:
    memcpy(dst, src, (size_t)n * 4);
    break;
  case DTYPE_F16: {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++)
      dst[i] = f16_to_f32(s[i]);
    break;
  }
  case DTYPE_BF16: {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++)
      dst[i] = bf16_to_f32(s[i]);
    break;
  }
  case DTYPE_Q8_0: {
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / Q8_0_BLOCK; b++) {
      uint16_t d16;
      memcpy(&d16, s + b * Q8_0_BYTES, 2);
      float d = f16_to_f32(d16);
      const int8_t *q = (const int8_t *)(s + b * Q8_0_BYTES + 2);
      for (int i = 0; i < Q8_0_BLOCK; i++)
        dst[b * Q8_0_BLOCK + i] = d * (float)q[i];
    }
    break;
  }
  default:
    quant_dequantize_row((int)t, src, dst, n);
    break;
  }
}

uint8_t f32_to_f8e4m3(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return sign | 0x7f; /* NaN */
  if (a >= 0x43e00000u)
    return sign | 0x7e; /* >= 448 (and infinity): saturate to 448 */
  if (a < 0x3c800000u) { /* below 2^-6: subnormal steps of 2^-9, rounded half to even */
    float x;
    memcpy(&x, &a, 4);
    float q = x * 512.0f; /* exact; q < 8 */
    int n = (int)q;
    float r = q - (float)n;
    if (r > 0.5f || (r == 0.5f && (n & 1)))
      n++;
    return sign | (uint8_t)n; /* n = 8 is 2^-6, the smallest normal (0x08) */
  }
  a += 0x7ffffu + ((a >> 20) & 1u); /* round the 23-bit mantissa to 3 bits, half to even */
  uint32_t e = (a >> 23) - 120u, m = (a >> 20) & 7u;
  uint32_t c = (e << 3) | m;
  return sign | (uint8_t)(c > 0x7eu ? 0x7eu : c);
}
