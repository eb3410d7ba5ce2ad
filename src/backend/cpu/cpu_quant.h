/* cpu_quant.h - integer dot products of GGML-quantized weight rows with 8-bit activations,
 * computed as llama.cpp's CPU build computes them (docs/cpu-backend.md, "Fidelity to llama.cpp").
 *
 * Activations are quantized as llama.cpp quantizes them for the weight type: per 32 values for
 * the 32-value types (cpu_act_q8: its q8_0/q8_1, scale rounded to f16, q8_1's f16 sum), per 256
 * for the K-quants (struct block_q8_K: f32 scale, 16-value sums). Each weight row is read in
 * place, block by block: its levels are expanded in registers and multiplied with the activation
 * bytes in int8 x int8 -> int32 (AVX2 maddubs/madd), and the scales and mins are applied in f32
 * in llama.cpp's order for that type:
 *   dot = sum over blocks b of  d_a * (d_w * sum(lv * qa) + m_w * sum(qa))
 * where a weight w = d_w * lv + m_w, and activation x = d_a * qa.
 * Up to 4 tokens share each decoded weight block (prefill), each with its own accumulators and
 * the same operations in the same order as alone.
 *
 * Batch rule (the K-quants): llama.cpp's CPU build sums Q4_K, Q5_K and Q6_K rows in one order for
 * few tokens (its decode kernels) and another for more (Q4_K: its repacked gemm, from 4 tokens,
 * on whole groups of 4; Q5_K, Q6_K: its tiled matmul, from 8 tokens), results one f32 rounding
 * apart. pagoda follows it by the number T of tokens in the matmul (cpu_quant_prefill_tokens):
 *   Q4_K:        the first T - T % 4 tokens take the prefill order when T >= 4, the rest decode;
 *   Q5_K, Q6_K:  every token takes the prefill order when T >= 8, else decode;
 *   other types: one order for every T (their results never depend on the batch).
 * So a K-quant token's bits depend on T (and, for Q4_K, on its index mod the group), as
 * llama.cpp's do on its ubatch: in one step the matmul sees all sequences' tokens, and no op
 * below the model knows where a sequence starts. A token gives the same bits in any batch that
 * puts it on the same side of the rule (tests/c/test_cpu_quant.c); a prompt run alone matches
 * llama.cpp's prompt pass, and each generated token (T = 1) its decode step.
 */
#ifndef PAGODA_CPU_QUANT_H
#define PAGODA_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_backend.h"

struct cpu_act_q8 {
  float d;        /* x = d * qs; d is rounded to f16 (llama.cpp stores it so) */
  float sd;       /* f16(unrounded d * (s[0] + s[1])): llama.cpp's q8_1 "s" field */
  int16_t s[2];   /* sums of qs[0..15] and qs[16..31] */
  int8_t qs[32];
};

/* Quantizes K values of X (K a multiple of 32) into K / 32 blocks. */
void cpu_quantize_act(const float *x, struct cpu_act_q8 *a, int64_t k);

/* The K-quant types (Q2_K..Q6_K, IQ4_XS) take llama.cpp's q8_K activations instead
 * (struct block_q8_K, util/quant.h: one f32 scale per 256 values, 16-value sums). */
int cpu_quant_act_is_k(enum dtype t);
/* Bytes of one row of K activations quantized for weights of type T. */
size_t cpu_quant_act_bytes(enum dtype t, int64_t k);
/* Quantizes K values of X for weights of type T (cpu_quantize_act or quantize_row_q8_K). */
void cpu_quantize_act_for(enum dtype t, const float *x, void *a, int64_t k);
/* Value I of activations A quantized for type T (d * q): what the integer sums multiply. */
float cpu_quant_act_value(enum dtype t, const void *a, int64_t i);

/* Whether the integer path handles weights of type T (every GGUF quant type, with AVX2). */
int cpu_quant_supported(enum dtype t);

/* dot(weight row W of type T, activations A quantized for T) over K values (K a multiple of
 * T's block size). */
float cpu_quant_vec_dot(enum dtype t, const void *w, const void *a, int64_t k);

/* The same in the prefill order of type T (see cpu_quant_prefill_tokens; the decode order for a
 * type without one). */
float cpu_quant_vec_dot_prefill(enum dtype t, const void *w, const void *a, int64_t k);

/* How many of the T tokens of a matmul with weights of type T take the prefill order: the first
 * cpu_quant_prefill_tokens(t, T), the others the decode order. */
int cpu_quant_prefill_tokens(enum dtype t, int T);

/* out(T, w->rows) = x(T, w->cols) @ w^T (+ bias) with 8-bit activations; w of a supported type. */
int cpu_quant_matmul(struct backend *be, float *out, const float *x, const struct weight *w,
                     const struct weight *bias, int T);

#endif
