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

/* The residual stream f->x around the sub-blocks of a pre-norm decoder. A sub-block given one
 * reads rmsnorm(f->x) with NORM and adds its output into f->x itself. Where the backend has the
 * fused forms, the norm runs as the prologue of the sub-block's first matmuls (struct
 * backend_prenorm) and the add in the epilogue of its last one (matmul_add) or in the
 * all-reduce (all_reduce_add), so no add + rmsnorm launch sits between the sub-blocks of a
 * decode step. Where it lacks them (answers 1 for these shapes), the output waits in f->xb2 with
 * PENDING set and the next sub-block's rmsnorm adds it, as one add + rmsnorm op. Both orders
 * round alike (backend.h), so the choice never changes a token beyond the act_dtype rounding.
 * Invariant: PENDING is 0 whenever a sub-block's input is read from f->x directly. */
struct block_res {
  const struct weight *norm; /* the next sub-block's input norm */
  int pending;               /* 1 while a sub-block's output waits in f->xb2 */
  int normed;                /* 1 while f->xb holds the next sub-block's normalized input */
};

/* Attention sub-block of layer L: q/k/v from wq/wk/wv (+ biases when present) or from the fused
 * wqkv; q_norm / k_norm per head when present; RoPE; KV write; paged attention with AP;
 * o_proj. RES NULL: f->xb (normed input) -> f->xb2 (all-reduced under tensor parallelism);
 * else the residual stream as struct block_res says. */
int block_attention(const struct fwd *f, int l, const struct attn_params *ap, struct block_res *res);
/* Gated SiLU MLP of layer L: down(silu(gate(x)) * up(x)) from w_gate/w_up or the fused
 * w_gate_up; input and output as block_attention's. */
int block_gated_mlp(const struct fwd *f, int l, struct block_res *res);
/* The pre-norm decoder of Llama and its relatives (Mistral, Qwen2, Phi-3, Qwen3): embed, then per
 * layer x += attn(norm(x)); x += mlp(norm(x)) (struct block_res), then the final norm into
 * f->xb. Scores are scaled by 1 / sqrt(head_dim) and windowed per block_layer_window. */
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
