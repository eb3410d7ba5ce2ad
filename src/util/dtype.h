/* dtype.h - element types of tensors and the scalar conversions between them. */
#ifndef PAGODA_DTYPE_H
#define PAGODA_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype {
  DTYPE_F32,
  DTYPE_F16,
  DTYPE_BF16,
  DTYPE_Q8_0,    /* GGUF blocks of 32: f16 scale + 32 int8 (34 bytes) */
  DTYPE_F8E4M3,  /* KV cache only */
  DTYPE_I32,
  DTYPE_COUNT
};

#define Q8_0_BLOCK 32
#define Q8_0_BYTES 34

const char *dtype_name(enum dtype t);
/* Bytes taken by N elements of type T (N a multiple of 32 for Q8_0). */
size_t dtype_row_bytes(enum dtype t, int64_t n);

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* Converts N elements of SRC (type T, any of F32/F16/BF16/Q8_0) to f32. */
void dtype_to_f32(float *dst, const void *src, enum dtype t, int64_t n);

#endif
