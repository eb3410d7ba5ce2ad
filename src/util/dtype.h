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
  /* GGML block-quantized weights (layouts in util/quant.h); a row is (cols / block) blocks. */
  DTYPE_Q4_0,    /* blocks of 32, 18 bytes */
  DTYPE_Q4_1,    /* blocks of 32, 20 bytes */
  DTYPE_Q5_0,    /* blocks of 32, 22 bytes */
  DTYPE_Q5_1,    /* blocks of 32, 24 bytes */
  DTYPE_Q2_K,    /* blocks of 256, 84 bytes */
  DTYPE_Q3_K,    /* blocks of 256, 110 bytes */
  DTYPE_Q4_K,    /* blocks of 256, 144 bytes */
  DTYPE_Q5_K,    /* blocks of 256, 176 bytes */
  DTYPE_Q6_K,    /* blocks of 256, 210 bytes */
  DTYPE_Q8_K,    /* blocks of 256, 292 bytes; activations only */
  DTYPE_IQ4_NL,  /* blocks of 32, 18 bytes */
  DTYPE_IQ4_XS,  /* blocks of 256, 136 bytes */
  DTYPE_COUNT
};

#define Q8_0_BLOCK 32
#define Q8_0_BYTES 34

/* Elements per block: 1 for the scalar types. */
int dtype_block_size(enum dtype t);
/* Bytes per block (per element for the scalar types). */
size_t dtype_block_bytes(enum dtype t);
/* Whether T is a GGML block-quantized type (Q8_0 included). */
static inline int dtype_is_quant(enum dtype t) {
  return t == DTYPE_Q8_0 || (t >= DTYPE_Q4_0 && t <= DTYPE_IQ4_XS);
}
/* The dtype of a ggml type id, or -1 when pagoda cannot read it. */
int dtype_from_ggml(uint32_t ggml_type);
/* The ggml type id of T, or -1 (F8E4M3, I32). */
int dtype_to_ggml(enum dtype t);
/* The dtype named S ("q4_k", "Q4_K", "bf16", ...), or -1. */
int dtype_from_name(const char *s);

const char *dtype_name(enum dtype t);
/* Bytes taken by N elements of type T (N a multiple of the block size for quantized types). */
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

/* FP8 E4M3 ("fn": bias 7, no infinities, 0x7f/0xff NaN, largest finite 448, subnormals m * 2^-9),
 * the KV cache's F8E4M3 elements. f32_to_f8e4m3 rounds to nearest even and saturates to +-448
 * (infinities included), as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
 * NaN stays NaN. f8e4m3_to_f32 is exact. */
static inline float f8e4m3_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c >> 7) << 31, e = (c >> 3) & 15u, m = c & 7u;
  uint32_t u;
  float f;
  if (e == 15 && m == 7) {
    u = sign | 0x7fc00000u;
  } else if (e == 0) {
    f = (float)m * 0.001953125f; /* 2^-9 */
    return sign ? -f : f;
  } else {
    u = sign | ((e + 120u) << 23) | (m << 20);
  }
  memcpy(&f, &u, 4);
  return f;
}
uint8_t f32_to_f8e4m3(float f);

/* Converts N elements of SRC (type T: any but F8E4M3/I32; N a multiple of the block size) to f32. */
void dtype_to_f32(float *dst, const void *src, enum dtype t, int64_t n);

#endif
