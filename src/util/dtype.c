/* dtype.c - dtype names, sizes and conversions to f32 (IEEE half by bit manipulation). */
#include "util/dtype.h"

#include <math.h>

const char *dtype_name(enum dtype t) {
  static const char *names[DTYPE_COUNT] = {"f32", "f16", "bf16", "q8_0", "f8e4m3", "i32"};
  return (unsigned)t < DTYPE_COUNT ? names[t] : "unknown";
}

size_t dtype_row_bytes(enum dtype t, int64_t n) {
  switch (t) {
  case DTYPE_F32:
  case DTYPE_I32:
    return (size_t)n * 4;
  case DTYPE_F16:
  case DTYPE_BF16:
    return (size_t)n * 2;
  case DTYPE_Q8_0:
    return (size_t)(n / Q8_0_BLOCK) * Q8_0_BYTES;
  case DTYPE_F8E4M3:
    return (size_t)n;
  default:
    return 0;
  }
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
    break;
  }
}
