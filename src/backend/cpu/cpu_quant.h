/* cpu_quant.h - integer dot products of GGML-quantized weight rows with 8-bit activations.
 *
 * Activations are quantized per 32 values (cpu_act_q8: f32 scale, int8 values, the sums of each
 * half), as llama.cpp does with Q8_0/Q8_1 (finer than its Q8_K for the K-quants). Each weight
 * type's row is then read in place, block by block: its levels are expanded in registers and
 * multiplied with the activation bytes in int8 x int8 -> int32 (AVX2 maddubs), and the per-16 or
 * per-32 scales and mins are applied in f32:
 *   dot = sum over halves h of  ad * (sc_h * sum(lv * qa) + mn_h * sum(qa))
 * where a weight w = sc_h * lv + mn_h, and activation x = ad * qa.
 * A token's result depends only on its own row, never on the batch (T) it runs in.
 */
#ifndef PAGODA_CPU_QUANT_H
#define PAGODA_CPU_QUANT_H

#include <stdint.h>

#include "backend/cpu/cpu_backend.h"

struct cpu_act_q8 {
  float d;        /* x = d * qs */
  int16_t s[2];   /* sums of qs[0..15] and qs[16..31] */
  int8_t qs[32];
};

/* Quantizes K values of X (K a multiple of 32) into K / 32 blocks. */
void cpu_quantize_act(const float *x, struct cpu_act_q8 *a, int64_t k);

/* Whether the integer path handles weights of type T (every GGUF quant type, with AVX2). */
int cpu_quant_supported(enum dtype t);

/* dot(weight row W of type T, activations A) over K values (K a multiple of T's block size). */
float cpu_quant_vec_dot(enum dtype t, const void *w, const struct cpu_act_q8 *a, int64_t k);

/* out(T, w->rows) = x(T, w->cols) @ w^T (+ bias) with 8-bit activations; w of a supported type. */
int cpu_quant_matmul(struct backend *be, float *out, const float *x, const struct weight *w,
                     const struct weight *bias, int T);

#endif
