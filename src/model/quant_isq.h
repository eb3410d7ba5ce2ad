/* quant_isq.h - in-situ quantization (ISQ): float weight matrices quantized at load. */
#ifndef PAGODA_QUANT_ISQ_H
#define PAGODA_QUANT_ISQ_H

#include "model/model_file.h"
#include "util/dtype.h"

/* The dtype named by an --isq value: q4_0, q4_k, q5_k, q6_k, q8_0, or the shorthands 4 (q4_k)
 * and 8 (q8_0), any case. -1 (with err_last() set) for anything else. */
int isq_parse(const char *s);

/* The type a matrix of COLS columns gets under --isq T, as llama.cpp chooses (docs/model-formats.md):
 * a K-quant whose 256-value blocks do not divide COLS falls back to Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0; -1 when no block fits (COLS not a multiple of 32: the tensor stays float).
 * OUTPUT: the output head (or the tied embeddings), which gets Q6_K unless T is Q8_0. */
int isq_tensor_type(enum dtype t, int64_t cols, int output);

/* Quantizes every float weight matrix of F to T in place of its host tensor (buffers owned by
 * F), in parallel over rows with N_THREADS (0: OpenMP's default); 1-D tensors (norms, biases) and
 * already quantized tensors are kept. Progress on stderr. 0, or -1 with err_last() set. */
int model_file_isq(struct model_file *f, enum dtype t, int num_threads);

#endif
