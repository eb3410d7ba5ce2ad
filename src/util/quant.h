/* quant.h - GGML quantized block layouts and their scalar reference (de)quantizers.
 *
 * Every block type here is byte-for-byte the layout ggml writes in GGUF files (little-endian,
 * no padding; the static_asserts in quant.c pin each size). A row of N elements of a quantized
 * type is N / QK_<t> consecutive blocks; N must be a multiple of the block size.
 *
 * The dequantize_row_* functions are the reference the optimized CPU dot products and the CUDA
 * kernels are checked against. The quantize_row_* functions produce valid blocks: for Q4_0,
 * Q4_1, Q5_0, Q5_1 and Q8_0 the same bytes as ggml's reference quantizer (and gguf-py's); for the
 * K-quants and IQ4 a simpler search of our own (same layout, not the same bytes as llama.cpp).
 * Q2_K and Q3_K have no quantizer (files are read, never written in those types).
 *
 * This API is shared by the CPU and CUDA backends: keep it stable.
 */
#ifndef PAGODA_QUANT_H
#define PAGODA_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor type ids as stored in GGUF tensor infos. */
enum ggml_type_id {
  GGML_TYPE_F32 = 0,
  GGML_TYPE_F16 = 1,
  GGML_TYPE_Q4_0 = 2,
  GGML_TYPE_Q4_1 = 3,
  GGML_TYPE_Q5_0 = 6,
  GGML_TYPE_Q5_1 = 7,
  GGML_TYPE_Q8_0 = 8,
  GGML_TYPE_Q8_1 = 9,
  GGML_TYPE_Q2_K = 10,
  GGML_TYPE_Q3_K = 11,
  GGML_TYPE_Q4_K = 12,
  GGML_TYPE_Q5_K = 13,
  GGML_TYPE_Q6_K = 14,
  GGML_TYPE_Q8_K = 15,
  GGML_TYPE_IQ4_NL = 20,
  GGML_TYPE_IQ4_XS = 23,
  GGML_TYPE_BF16 = 30,
};

/* The name ggml gives type id ID ("Q4_K", "IQ2_XXS", ...), or "unknown". */
const char *ggml_type_name(uint32_t id);

/* Elements per block. */
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK4_NL 32
#define QK_K 256 /* super-block of the K-quants and IQ4_XS */
#define K_SCALE_SIZE 12

/* Scales are IEEE half floats, stored as raw bits (ggml_half). */
typedef uint16_t qhalf;

struct block_q4_0 { /* x = d * (q - 8), q in [0, 15] */
  qhalf d;
  uint8_t qs[QK4_0 / 2]; /* element j in the low nibble of qs[j], element j + 16 in the high */
};
struct block_q4_1 { /* x = d * q + m */
  qhalf d, m;
  uint8_t qs[QK4_1 / 2];
};
struct block_q5_0 { /* x = d * (q - 16), q in [0, 31]; bit 4 of element j is bit j of qh */
  qhalf d;
  uint8_t qh[4];
  uint8_t qs[QK5_0 / 2];
};
struct block_q5_1 { /* x = d * q + m */
  qhalf d, m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};
struct block_q8_0 { /* x = d * q */
  qhalf d;
  int8_t qs[QK8_0];
};
/* 16 sub-blocks of 16: x = d * (scales[i] & 15) * q - dmin * (scales[i] >> 4), q in [0, 3]. */
struct block_q2_K {
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];
  qhalf d, dmin;
};
/* 16 sub-blocks of 16 with 6-bit scales (packed in 12 bytes, biased by 32); q in [-4, 3] from 2
 * low bits in qs and a high bit in hmask (bit clear: subtract 4). */
struct block_q3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];
  qhalf d;
};
/* 8 sub-blocks of 32, 6-bit scale and min each (packed in 12 bytes):
 * x = d * sc * q - dmin * m, q in [0, 15]. */
struct block_q4_K {
  qhalf d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};
/* As q4_K with a fifth bit per element in qh: q in [0, 31]. */
struct block_q5_K {
  qhalf d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
/* 16 sub-blocks of 16, int8 scales: x = d * scales[i] * (q - 32), q in [0, 63] (4 low bits in
 * ql, 2 high bits in qh). */
struct block_q6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  qhalf d;
};
/* Activations only (never in files pagoda reads): x = d * q; bsums[i] = sum of qs[16i..16i+15]. */
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
/* Non-linear 4-bit: x = d * iq4nl_values[q]. Nibble order as q4_0. */
struct block_iq4_nl {
  qhalf d;
  uint8_t qs[QK4_NL / 2];
};
/* 8 sub-blocks of 32 with 6-bit scales (low 4 bits in scales_l, high 2 in scales_h), biased by
 * 32: x = d * (ls - 32) * iq4nl_values[q]. */
struct block_iq4_xs {
  qhalf d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};

/* The 16 levels of IQ4_NL and IQ4_XS. */
extern const int8_t iq4nl_values[16];

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block J (0..7) from the 12 packed bytes Q. */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}
/* Q3_K: the 6-bit scale of sub-block J (0..15), unbiased to [-32, 31]. */
static inline int q3_K_scale(const uint8_t *s, int j) {
  int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

/* Reference dequantizers: Y = the K values of the row X (K a multiple of the block size). */
void dequantize_row_q4_0(const struct block_q4_0 *x, float *y, int64_t k);
void dequantize_row_q4_1(const struct block_q4_1 *x, float *y, int64_t k);
void dequantize_row_q5_0(const struct block_q5_0 *x, float *y, int64_t k);
void dequantize_row_q5_1(const struct block_q5_1 *x, float *y, int64_t k);
void dequantize_row_q8_0(const struct block_q8_0 *x, float *y, int64_t k);
void dequantize_row_q2_K(const struct block_q2_K *x, float *y, int64_t k);
void dequantize_row_q3_K(const struct block_q3_K *x, float *y, int64_t k);
void dequantize_row_q4_K(const struct block_q4_K *x, float *y, int64_t k);
void dequantize_row_q5_K(const struct block_q5_K *x, float *y, int64_t k);
void dequantize_row_q6_K(const struct block_q6_K *x, float *y, int64_t k);
void dequantize_row_q8_K(const struct block_q8_K *x, float *y, int64_t k);
void dequantize_row_iq4_nl(const struct block_iq4_nl *x, float *y, int64_t k);
void dequantize_row_iq4_xs(const struct block_iq4_xs *x, float *y, int64_t k);

/* Reference quantizers: Y = blocks for the K values of X (K a multiple of the block size). */
void quantize_row_q4_0(const float *x, struct block_q4_0 *y, int64_t k);
void quantize_row_q4_1(const float *x, struct block_q4_1 *y, int64_t k);
void quantize_row_q5_0(const float *x, struct block_q5_0 *y, int64_t k);
void quantize_row_q5_1(const float *x, struct block_q5_1 *y, int64_t k);
void quantize_row_q8_0(const float *x, struct block_q8_0 *y, int64_t k);
void quantize_row_q4_K(const float *x, struct block_q4_K *y, int64_t k);
void quantize_row_q5_K(const float *x, struct block_q5_K *y, int64_t k);
void quantize_row_q6_K(const float *x, struct block_q6_K *y, int64_t k);
void quantize_row_q8_K(const float *x, struct block_q8_K *y, int64_t k);
void quantize_row_iq4_nl(const float *x, struct block_iq4_nl *y, int64_t k);
void quantize_row_iq4_xs(const float *x, struct block_iq4_xs *y, int64_t k);

/* By dtype (enum dtype from util/dtype.h, passed as int to keep this header standalone):
 * 0 on success, -1 when the type has no such function. */
int quant_dequantize_row(int dtype, const void *src, float *dst, int64_t k);
int quant_quantize_row(int dtype, const float *src, void *dst, int64_t k);
int quant_can_quantize(int dtype);

#endif
