/* blocks.h - the shared pieces architectures build their forward pass from (backend ops only).
 *
 * Fused projections (Phi-3's qkv_proj, gate_up_proj) are used as stored: one matmul into
 * f->fused, (T, cols) with cols = q | k | v (or gate | up) per token, then split into the
 * contiguous buffers the following ops read by gather_rows over precomputed indices
 * (f->split_idx): the q rows of head_dim of token t are rows t * (n_heads + 2 n_kv) + h of
 * f->fused seen as rows of head_dim, and likewise for k, v, gate, up. The indices do not depend
 * on T, so one table made at workspace allocation serves every step (and CUDA graphs). */
#ifndef PAGODA_BLOCKS_H
#define PAGODA_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "model/arch.h"

/* The window (0: none) of layer L: config.sliding_window for layers >= swa_first_layer, except
 * every swa_pattern-th layer (global) when swa_pattern > 0; with local_window (Gemma 2's), that
 * window on the even layers and none on the odd ones. The one place the per-layer window is
 * decided: forward passes and model_kv_window (the KV manager's) both read it. */
int block_layer_window(const struct model_config *c, int l);

/* Attention sub-block of layer L: f->xb (normed input) -> f->xb2 (after o_proj). q/k/v from
 * wq/wk/wv (+ biases when present) or from the fused wqkv; q_norm / k_norm per head when
 * present; RoPE; KV write; paged attention with AP; o_proj. */
int block_attention(const struct fwd *f, int l, const struct attn_params *ap);
/* Gated SiLU MLP of layer L: f->xb -> f->xb2 = down(silu(gate(x)) * up(x)), from w_gate/w_up or
 * the fused w_gate_up. */
int block_gated_mlp(const struct fwd *f, int l);
/* The pre-norm decoder of Llama and its relatives (Mistral, Qwen2, Phi-3, Qwen3): embed, then per
 * layer x += attn(norm(x)); x += mlp(norm(x)), then the final norm into f->xb. Scores are
 * scaled by 1 / sqrt(head_dim) and windowed per block_layer_window. */
int blocks_prenorm_forward(const struct fwd *f);

/* Workspace of the fused projections, from the first layer's weights (every layer has the same
 * layout): elements per token of f->fused (0: nothing fused) and the int32 count of split_idx
 * for MAX_TOKENS tokens, which blocks_split_idx_fill writes. */
size_t blocks_fused_cols(const struct model_config *c, const struct layer_weights *l0);
size_t blocks_split_idx_count(const struct model_config *c, const struct layer_weights *l0,
                              int max_tokens);
void blocks_split_idx_fill(int32_t *idx, const struct model_config *c,
                           const struct layer_weights *l0, int max_tokens);

#endif
