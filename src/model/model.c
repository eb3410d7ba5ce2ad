/* model.c - a Llama-family model on a backend: weights, RoPE frequencies, KV pool, forward pass. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "model/model_file.h"
#include "model/moe_block.h"
#include "model/quant_isq.h"
#include "dist/step_wire.h"
#include "dist/tp.h"
#include "util/log.h"

/* Every weight of a layer, whichever the architecture has (the others NULL). */
#define LAYER_WEIGHTS(L)                                                                          \
  {&(L)->attn_norm, &(L)->wq,     &(L)->wk,        &(L)->wv,     &(L)->wo,                       \
   &(L)->bq,        &(L)->bk,     &(L)->bv,        &(L)->ffn_norm, &(L)->w_gate,                 \
   &(L)->w_up,      &(L)->w_down, &(L)->wqkv,      &(L)->w_gate_up, &(L)->q_norm, &(L)->k_norm,    \
   &(L)->post_attn_norm, &(L)->post_ffw_norm, &(L)->moe_router, &(L)->exps_gate, &(L)->exps_up,      \
   &(L)->exps_down}

/* Offsets (in int32 elements) of the batch arrays inside model.meta. */
struct meta_layout {
  size_t ids, positions, slots, query_start, seq_lens, block_tables, logits_idx, total;
};

struct model {
  struct model_config config;
  const struct arch *arch;     /* the architecture's row: tensors and forward pass */
  struct backend *be;          /* borrowed */
  struct model_file *file;     /* kept open while weights alias its mapping (cpu); else NULL */
  int host_mem;                /* backend memory is host memory: batch and logits used in place */
  struct weight tok_embd;      /* (vocab, dim) */
  struct weight out_norm;      /* (1, dim) */
  struct weight lm_head;       /* (vocab_local, dim); aliases tok_embd's data when tied */
  struct layer_weights *layers; /* (n_layers) */
  float *inv_freq;             /* (rope_dim / 2) backend memory, scaling applied; longrope: the
                                  short factors' then the long factors' (rope_dim) */
  struct rope_params rope;

  /* Set by model_alloc_kv. */
  struct kv_layer *kv;         /* (n_layers) */
  float *kv_scales;            /* (n_layers, 2) the checkpoint's f8 KV scales (model_file.kv_scales), or NULL: 1.0 */
  /* Set by model_alloc_workspace (max_tokens 0: none yet). */
  int max_tokens, max_seqs, max_blocks_per_seq;
  size_t workspace_bytes;      /* backend bytes of the buffers below */
  void *x;     /* (max_tokens, dim) residual stream */
  void *xb;    /* (max_tokens, dim) normalized input of each sub-block; final hidden states */
  void *xb2;   /* (max_tokens, dim) attention / MLP output; gathered rows for the logits */
  void *q;     /* (max_tokens, n_heads, head_dim) */
  void *k;     /* (max_tokens, n_kv_heads, head_dim) */
  void *v;     /* (max_tokens, n_kv_heads, head_dim) */
  void *att;   /* (max_tokens, n_heads, head_dim) attention output */
  void *gate;  /* (max_tokens, ffn_dim) gate, then silu(gate) * up */
  void *up;    /* (max_tokens, ffn_dim) */
  void *fused; /* (max_tokens, blocks_fused_cols) fused projections' output, or NULL */
  int32_t *split_idx; /* blocks_split_idx_count gather indices splitting it, or NULL */
  void *arch_ws;      /* MoE models: the MoE block's scratch (moe_scratch_bytes), else NULL */
  float *logits_dev;      /* (max_seqs, vocab) f32; only when !host_mem */
  int32_t *meta;          /* backend copy of the batch's int arrays (see meta_layout); !host_mem */
  int32_t *meta_host;     /* its staging in pinned host memory (ops->alloc_host): one copy up per step;
                           * two halves of ml.total, used in turn (asynchronous steps stage step
                           * N + 1 while step N's copy may still wait on the stream) */
  int meta_half;          /* the half the next stage_batch fills */
  int num_hidden_rows;    /* rows gathered for logits by the last model_forward(..., NULL) (in xb2) */
  struct meta_layout ml;

  /* Tensor parallelism (docs/distributed.md). Every rank holds its shard (config: its heads, KV
   * heads and ffn columns); rank 0 also the whole lm_head and the other ranks' models, and
   * fans every public call out to them over TP (their threads). world 1: all unused. */
  int tp_rank, tp_world, tp_kv_total; /* tp_kv_total: the model's KV heads before the split */
  /* The vocabulary-parallel output head (when world divides the vocabulary): every rank's lm_head
   * is its rows [rank * vocab_local, (rank + 1) * vocab_local) (of tok_embd when tied: a view,
   * lm_head_view), its logits go into logits_local (max_seqs, vocab_local) and ops->gather_cols
   * brings them to rank 0 (gather_scratch: its (max_seqs, vocab) scratch) before the final
   * softcap. Otherwise rank 0 alone holds the whole lm_head and computes every logit. */
  int vocab_parallel, vocab_local, lm_head_view;
  float *logits_local, *gather_scratch;
  struct tp_group *tp;    /* rank 0 only; borrowed */
  int tp_ids_shared;      /* rank 0: the other ranks' resolve_ids read rank 0's sampled ids (backend.h
                           * peer_ar_connect), so asynchronous steps work under tensor parallelism */
  struct model **ranks;   /* rank 0 only: (tp_world), ranks[0] = the model itself */
  void **shard_bufs;      /* host copies of column slices (weights may alias them on cpu) */
  /* Multi-process tensor parallelism, rank 0 (model_set_mirror): every public call goes through
   * MIRROR, which sends it to the other processes and runs it here (model_run_call). */
  int (*mirror)(struct model *m, const struct step_msg *call, float *logits, void *user);
  void *mirror_user;
  int num_shard_bufs;
};

const struct model_config *model_get_config(const struct model *m) { return &m->config; }
int model_has_kv_scales(const struct model *m) { return m->kv_scales != NULL; }

int model_tp_vocab_split(const struct model *m) { return m->vocab_parallel ? m->vocab_local : 0; }
int model_tp_async_ok(const struct model *m) { return !m->mirror && (!m->ranks || m->tp_ids_shared); }

static int tp_free_rank(int r, void *ctx);
static int local_forward(struct model *m, const struct batch *batch, float *logits);

struct kv_layer *model_kv_layers(struct model *m) { return m->kv; }

static int load_weight(struct model *m, struct weight *w, const struct host_tensor *t, const char *what,
                       int layer) {
  memset(w, 0, sizeof *w);
  if (!t->data)
    return 0; /* optional tensor (biases) absent */
  if (m->be->ops->weight_from_host(m->be, w, t->data, t->dtype, t->rows, t->cols) != 0)
    return ERR("loading %s of layer %d: %s", what, layer, err_last());
  return 0;
}

/* Tensor parallelism: the parts of dimension KIND (of a layer tensor) rank r holds, as ranges
 * [start[i], start[i] + count[i]) in order, at most MAX_RANGES; returns how many (0: the
 * dimension is not split). Q heads and ffn columns are split evenly; KV heads too when there are
 * at least as many as ranks, else each rank holds KV head r * n_kv / world (replicated, as vLLM),
 * the one its query heads read. Fused and stacked dimensions take the same slice of each part:
 * Phi-3's qkv_proj (q | k | v), gate_up_proj (gate | up), Mixtral's experts (expert after expert).
 * HF and GGUF store these parts in the same order. */
#define MAX_RANGES MOE_MAX_EXPERTS
static int shard_ranges(const struct model *m, enum arch_dim kind, int64_t *start, int64_t *count) {
  const struct model_config *c = &m->config; /* already the rank's (local) config */
  int r = m->tp_rank, W = m->tp_world, hd = c->head_dim;
  int64_t q = (int64_t)c->n_heads * hd, kv = (int64_t)c->n_kv_heads * hd, F = c->ffn_dim;
  int64_t q_all = q * W, kv_all = (int64_t)m->tp_kv_total * hd, kv0 = (int64_t)(r * m->tp_kv_total / W) * hd;
  switch (kind) {
  case AD_Q: start[0] = r * q; count[0] = q; return 1;
  case AD_KV: start[0] = kv0; count[0] = kv; return 1;
  case AD_FFN: start[0] = r * F; count[0] = F; return 1;
  case AD_QKV:
    start[0] = r * q;
    start[1] = q_all + kv0;
    start[2] = q_all + kv_all + kv0;
    count[0] = q;
    count[1] = count[2] = kv;
    return 3;
  case AD_FFN2:
    start[0] = r * F;
    start[1] = F * W + r * F;
    count[0] = count[1] = F;
    return 2;
  case AD_EXP_FFN:
    for (int e = 0; e < c->n_experts; e++) {
      start[e] = (int64_t)e * F * W + r * F;
      count[e] = F;
    }
    return c->n_experts;
  default: return 0;
  }
}

/* A host buffer of BYTES the model keeps (freed with it); NULL with err_last() set. */
static char *shard_buf(struct model *m, size_t bytes) {
  void **bufs = realloc(m->shard_bufs, (size_t)(m->num_shard_bufs + 1) * sizeof *bufs);
  if (bufs)
    m->shard_bufs = bufs;
  char *buf = bufs ? malloc(bytes ? bytes : 1) : NULL;
  if (!buf) {
    ERR("out of memory");
    return NULL;
  }
  m->shard_bufs[m->num_shard_bufs++] = buf;
  return buf;
}

/* The rank's slice of T (a layer tensor of shape ROWS x COLS kinds) into *OUT: rows split in
 * place (a view) when they are one range, else the ranges copied one after the other into a
 * host buffer the model keeps; columns split by copying. */
static int shard_tensor(struct model *m, const struct host_tensor *t, enum arch_dim rows, enum arch_dim cols,
                        struct host_tensor *out, const char *what, int layer) {
  *out = *t;
  int64_t start[MAX_RANGES], count[MAX_RANGES];
  if (m->tp_world <= 1 || !t->data)
    return 0;
  int n = shard_ranges(m, rows, start, count);
  if (n > 0) {
    size_t rb = dtype_row_bytes(t->dtype, t->cols);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
      if (start[i] < 0 || start[i] + count[i] > t->rows)
        return ERR("--tp %d: %s of layer %d has %lld rows, rank %d's slice ends at row %lld", m->tp_world, what,
                   layer, (long long)t->rows, m->tp_rank, (long long)(start[i] + count[i]));
      total += count[i];
    }
    if (n == 1) {
      out->data = (const char *)t->data + (size_t)start[0] * rb;
    } else {
      char *buf = shard_buf(m, rb * (size_t)total);
      if (!buf)
        return -1;
      size_t at = 0;
      for (int i = 0; i < n; i++) {
        memcpy(buf + at, (const char *)t->data + (size_t)start[i] * rb, rb * (size_t)count[i]);
        at += rb * (size_t)count[i];
      }
      out->data = buf;
    }
    out->rows = total;
    return 0;
  }
  if (shard_ranges(m, cols, start, count) != 1) /* only one range of columns is split (o, down) */
    return 0;
  int bs = dtype_block_size(t->dtype);
  if (start[0] % bs || count[0] % bs)
    return ERR("--tp %d: %s of layer %d is %s, whose blocks of %d columns a split at column %lld cannot cut; "
               "use a smaller --tp", m->tp_world, what, layer, dtype_name(t->dtype), bs, (long long)start[0]);
  size_t rb = dtype_row_bytes(t->dtype, t->cols), ob = dtype_row_bytes(t->dtype, count[0]),
         off = dtype_row_bytes(t->dtype, start[0]);
  char *buf = shard_buf(m, ob * (size_t)t->rows);
  if (!buf)
    return -1;
  for (int64_t i = 0; i < t->rows; i++)
    memcpy(buf + (size_t)i * ob, (const char *)t->data + (size_t)i * rb + off, ob);
  out->data = buf;
  out->cols = count[0];
  return 0;
}

/* The shape tensor parallelism needs; 0 or -1 with err_last() naming what does not divide. Every
 * architecture of the table is split (docs/distributed.md says how). */
static int tp_check_config(const struct model *m, const char *path) {
  const struct model_config *c = &m->config;
  int W = m->tp_world;
  if (c->n_heads % W || c->ffn_dim % W || (c->n_kv_heads % W && W % c->n_kv_heads))
    return ERR("%s: --tp %d must divide the %d attention heads and the %d ffn columns, and divide or be a "
               "multiple of the %d KV heads", path, W, c->n_heads, c->ffn_dim, c->n_kv_heads);
  return 0;
}

static void free_weight(struct model *m, struct weight *w) {
  if (w->data)
    m->be->ops->weight_free(m->be, w);
}

/* inv_freq[i] = theta^(-2i/d), then the model's scaling. llama3 follows HF's
 * _compute_llama3_parameters: wavelengths longer than orig_max_pos / low_freq_factor are divided
 * by factor, shorter than orig_max_pos / high_freq_factor kept, and the band between interpolated
 * smoothly. GGUF files store llama3's result as rope_freqs (divisors), applied instead. */
static void compute_inv_freq(float *out, const struct model_config *c, const float *rope_freqs) {
  int half = c->rope_dim / 2;
  for (int i = 0; i < half; i++) {
    /* as torch: exponent in f32, then 1 / theta^exponent */
    float e = (float)(2 * i) / (float)c->rope_dim;
    double f = 1.0 / pow((double)c->rope_theta, (double)e);
    if (c->rope_scaling == ROPE_SCALING_LONGROPE) {
      /* transformers: 1 / (ext_factors * base^e) in f32; the long table follows the short */
      float base_e = (float)pow((double)c->rope_theta, (double)e);
      out[i] = 1.0f / (c->rope_short_factor[i] * base_e);
      out[half + i] = 1.0f / (c->rope_long_factor[i] * base_e);
      continue;
    }
    if (rope_freqs) {
      f /= rope_freqs[i];
    } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
      double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      double old_ctx = c->rope_orig_max_pos;
      double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
      double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_ctx / wavelen - lo) / (hi - lo);
        f = (1.0 - smooth) * f / factor + smooth * f;
      }
    }
    if (c->rope_scaling == ROPE_SCALING_LINEAR && c->rope_factor > 0)
      f /= c->rope_factor;
    out[i] = (float)f;
  }
}

static void free_kv(struct model *m) {
  struct backend *be = m->be;
  if (!m->kv)
    return;
  for (int l = 0; l < m->config.n_layers; l++) {
    be->ops->free(be, m->kv[l].k);
    be->ops->free(be, m->kv[l].v);
  }
  free(m->kv);
  m->kv = NULL;
}

static void free_workspace(struct model *m) {
  struct backend *be = m->be;
  void **bufs[] = {&m->x, &m->xb, &m->xb2, &m->q, &m->k, &m->v, &m->att, &m->gate, &m->up,
                   &m->fused, (void **)&m->split_idx, (void **)&m->logits_dev, (void **)&m->meta,
                   &m->arch_ws, (void **)&m->logits_local, (void **)&m->gather_scratch};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    if (*bufs[i])
      be->ops->free(be, *bufs[i]);
    *bufs[i] = NULL;
  }
  if (m->meta_host && be->ops->free_host)
    be->ops->free_host(be, m->meta_host);
  else
    free(m->meta_host);
  m->meta_host = NULL;
  m->max_tokens = m->max_seqs = m->max_blocks_per_seq = 0;
  m->workspace_bytes = 0;
}

void model_free(struct model *m) {
  if (!m)
    return;
  if (m->ranks) { /* rank 0 of a group: the others first, each on its own thread */
    m->ranks[0] = NULL;
    tp_group_run(m->tp, tp_free_rank, m->ranks);
    free(m->ranks);
    m->ranks = NULL;
  }
  if (!m->host_mem && m->max_tokens)
    m->be->ops->sync(m->be);
  free_kv(m);
  free_workspace(m);
  if (m->layers) {
    for (int l = 0; l < m->config.n_layers; l++) {
      struct layer_weights *L = &m->layers[l];
      struct weight *ws[] = LAYER_WEIGHTS(L);
      for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        free_weight(m, ws[i]);
    }
    free(m->layers);
  }
  if (m->lm_head.data && !m->lm_head_view)
    free_weight(m, &m->lm_head);
  free_weight(m, &m->tok_embd);
  free_weight(m, &m->out_norm);
  if (m->inv_freq)
    m->be->ops->free(m->be, m->inv_freq);
  model_file_close(m->file);
  free(m->kv_scales);
  for (int i = 0; i < m->num_shard_bufs; i++)
    free(m->shard_bufs[i]);
  free(m->shard_bufs);
  free(m);
}

struct model *model_load(const char *path, struct backend *be) { return model_load_isq(path, be, NULL); }

static struct model *load_model(const char *path, struct backend *be, const char *isq, int rank, int world) {
  int isq_t = -1;
  if (isq && (isq_t = isq_parse(isq)) < 0)
    return NULL;
  struct model_file *f = model_file_open(path);
  if (!f)
    return NULL;
  if (isq_t >= 0 && model_file_isq(f, (enum dtype)isq_t, be->num_threads) != 0) {
    model_file_close(f);
    return NULL;
  }
  struct model *m = calloc(1, sizeof *m);
  if (!m) {
    model_file_close(f);
    ERR("out of memory");
    return NULL;
  }
  m->be = be;
  m->file = f;
  m->config = f->config;
  if (f->kv_scales) {
    size_t nb = sizeof *m->kv_scales * 2 * (size_t)f->config.n_layers;
    if (!(m->kv_scales = malloc(nb))) {
      model_free(m);
      ERR("out of memory");
      return NULL;
    }
    memcpy(m->kv_scales, f->kv_scales, nb);
  }
  m->host_mem = be->caps.host_memory;
  m->tp_rank = rank;
  m->tp_world = world;
  m->tp_kv_total = f->config.n_kv_heads;
  const struct model_config *c = &m->config;
  if (world > 1) { /* the rank's shard: its query heads, KV heads and ffn columns */
    if (tp_check_config(m, path))
      goto fail;
    m->config.n_heads /= world;
    m->config.n_kv_heads = m->config.n_kv_heads >= world ? m->config.n_kv_heads / world : 1;
    m->config.ffn_dim /= world;
  }
  if (!(m->arch = arch_by_name(c->arch))) {
    ERR("%s: architecture %s has no forward pass", path, c->arch);
    goto fail;
  }
  if (c->head_dim % 2 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads) {
    ERR("%s: unsupported attention shape (%d heads, %d KV heads, head_dim %d)", path, c->n_heads,
        c->n_kv_heads, c->head_dim);
    goto fail;
  }
  m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
  if (!m->layers) {
    ERR("out of memory");
    goto fail;
  }
  if (load_weight(m, &m->tok_embd, &f->tok_embd, "token embeddings", -1) ||
      load_weight(m, &m->out_norm, &f->out_norm, "output norm", -1))
    goto fail;
  m->vocab_parallel = world > 1 && c->vocab_size % world == 0 && be->ops->gather_cols;
  m->vocab_local = m->vocab_parallel ? c->vocab_size / world : c->vocab_size;
  if (m->vocab_parallel) { /* the rank's rows of the output head */
    if (f->lm_head.data == f->tok_embd.data) {
      m->lm_head = m->tok_embd;
      m->lm_head.rows = m->vocab_local;
      m->lm_head.data = (char *)m->tok_embd.data +
                        dtype_row_bytes(m->tok_embd.dtype, m->tok_embd.cols) * (size_t)m->vocab_local * rank;
      m->lm_head_view = 1;
    } else {
      struct host_tensor ht = f->lm_head;
      ht.rows = m->vocab_local;
      ht.data = (const char *)ht.data + dtype_row_bytes(ht.dtype, ht.cols) * (size_t)m->vocab_local * rank;
      if (load_weight(m, &m->lm_head, &ht, "lm_head", -1))
        goto fail;
    }
  } else if (f->lm_head.data == f->tok_embd.data) {
    m->lm_head = m->tok_embd;
    m->lm_head_view = 1;
  } else if (rank == 0 && load_weight(m, &m->lm_head, &f->lm_head, "lm_head", -1)) {
    goto fail; /* tensor parallelism without a vocabulary split: only rank 0 computes logits */
  }
  for (int l = 0; l < c->n_layers; l++)
    for (int i = 0; i < m->arch->num_tensors; i++) {
      const struct arch_tensor *at = &m->arch->tensors[i];
      struct host_tensor ht;
      if (shard_tensor(m, (const struct host_tensor *)((const char *)&f->layers[l] + at->host_off), at->rows,
                       at->cols, &ht, at->hf, l) ||
          load_weight(m, (struct weight *)((char *)&m->layers[l] + at->w_off), &ht, at->hf, l))
        goto fail;
    }
  /* RoPE frequencies, once, on the host, then to the backend. */
  int half = c->rope_dim / 2, num_freqs = c->rope_scaling == ROPE_SCALING_LONGROPE ? 2 * half : half;
  float *host_freq = malloc(sizeof(float) * (size_t)half * 2);
  if (!host_freq) {
    ERR("out of memory");
    goto fail;
  }
  float *divisors = NULL;
  if (f->rope_freqs.data) {
    if (f->rope_freqs.rows * f->rope_freqs.cols != half || dtype_is_quant(f->rope_freqs.dtype)) {
      free(host_freq);
      ERR("%s: rope_freqs has %lld elements, expected head_dim/2 = %d", path,
          (long long)(f->rope_freqs.rows * f->rope_freqs.cols), half);
      goto fail;
    }
    divisors = host_freq + half;
    dtype_to_f32(divisors, f->rope_freqs.data, f->rope_freqs.dtype, half);
  }
  compute_inv_freq(host_freq, c, divisors);
  m->inv_freq = be->ops->alloc(be, sizeof(float) * (size_t)num_freqs);
  if (!m->inv_freq || be->ops->upload(be, m->inv_freq, host_freq, sizeof(float) * (size_t)num_freqs)) {
    free(host_freq);
    goto fail;
  }
  free(host_freq);
  m->rope = (struct rope_params){.inv_freq = m->inv_freq, .rot_dim = c->rope_dim, .neox = c->rope_neox};
  if (c->rope_scaling == ROPE_SCALING_LONGROPE) {
    m->rope.inv_freq_long = m->inv_freq + half;
    m->rope.long_after = c->rope_orig_max_pos;
    m->rope.mscale = c->rope_attn_factor;
  }
  if (!m->host_mem) { /* the weights were copied to the device: the mapping is no longer needed */
    model_file_close(m->file);
    m->file = NULL;
  }
  if (world > 1) {
    char head[96];
    if (m->vocab_parallel)
      snprintf(head, sizeof head, "vocabulary rows %d..%d", rank * m->vocab_local, (rank + 1) * m->vocab_local - 1);
    else
      snprintf(head, sizeof head, "%s", rank ? "no output head" : "the whole output head");
    log_info("loaded %s: %s, %d layers, dim %d, tensor-parallel rank %d of %d: %d/%d heads, ffn %d, %s, %s weights "
             "on %s", path, c->arch, c->n_layers, c->dim, rank, world, c->n_heads, c->n_kv_heads, c->ffn_dim, head,
             dtype_name(c->weight_dtype), be->ops->name);
  } else
    log_info("loaded %s: %s, %d layers, dim %d, %d/%d heads, vocab %d, %s weights on %s", path, c->arch,
             c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->vocab_size, dtype_name(c->weight_dtype),
             be->ops->name);
  return m;
fail:
  model_free(m);
  return NULL;
}

struct model *model_load_isq(const char *path, struct backend *be, const char *isq) {
  return load_model(path, be, isq, 0, 1);
}

/* ---- Tensor parallelism: rank 0's public calls run on every rank's thread ---- */
struct tp_load {
  const char *path, *isq;
  struct backend *const *bes;
  int world;
  struct model *models[TP_MAX_WORLD];
  unsigned char id[BACKEND_COMM_ID_BYTES];
  size_t peer_ar_max; /* 0: no peer all-reduce (off, or the backend has none) */
  int connect;        /* the backend has peer_ar_connect: every rank calls it */
  int no_peer;        /* set by a rank whose GPU cannot reach the others' */
};

static int tp_load_rank(int r, void *ctx) {
  struct tp_load *L = ctx;
  struct backend *be = L->bes[r];
  if (be->ops->bind && be->ops->bind(be))
    return -1;
  if (!(L->models[r] = load_model(L->path, be, L->isq, r, L->world)))
    return -1;
  if (be->ops->comm_init(be, L->id, r, L->world))
    return -1;
  return L->connect ? be->ops->peer_ar_alloc(be, L->world) : 0;
}

/* Each rank after all have loaded: the peer all-reduce between the GPUs of this process. */
static int tp_connect_rank(int r, void *ctx) {
  struct tp_load *L = ctx;
  struct backend *be = L->bes[r];
  int rc = be->ops->peer_ar_connect(be, L->bes, r, L->world, L->peer_ar_max);
  if (rc == 1) /* no peer access between these GPUs: NCCL only, no shared ids */
    __atomic_store_n(&L->no_peer, 1, __ATOMIC_RELAXED);
  return rc < 0 ? -1 : 0;
}

/* When any rank's GPU cannot reach the others', every rank turns the peer all-reduce off (bound
 * 0): all ranks then take NCCL for every all-reduce alike (a rank in the peer kernel and one in
 * NCCL would wait for each other for ever). */
static int tp_disconnect_rank(int r, void *ctx) {
  struct tp_load *L = ctx;
  struct backend *be = L->bes[r];
  return be->ops->peer_ar_connect(be, L->bes, r, L->world, 0) < 0 ? -1 : 0;
}

/* The bound of the peer all-reduce (backend.h peer_ar_connect) from $PAGODA_TP_CUSTOM_AR: unset or
 * 1: TP_PEER_AR_DEFAULT bytes; 0: off (NCCL for every all-reduce); a larger number: that many
 * bytes. -1 with err_last() set on anything else. */
#define TP_PEER_AR_DEFAULT ((size_t)8 << 20) /* the largest the CUDA backend takes: graphs of 512 rows of 8192 */
static long long tp_peer_ar_max(void) {
  const char *env = getenv("PAGODA_TP_CUSTOM_AR");
  if (!env || !*env)
    return (long long)TP_PEER_AR_DEFAULT;
  char *end;
  long long v = strtoll(env, &end, 10);
  if (*end || v < 0)
    return ERR("PAGODA_TP_CUSTOM_AR=%s: 0 (off), 1 (on, up to %zu bytes) or a bound in bytes", env, TP_PEER_AR_DEFAULT);
  return v == 1 ? (long long)TP_PEER_AR_DEFAULT : v;
}

static int tp_free_rank(int r, void *ctx) {
  struct model **ms = ctx;
  if (r > 0) /* rank 0 itself is freed by the caller */
    model_free(ms[r]);
  return 0;
}

struct model *model_load_tp(const char *path, struct backend *const *bes, struct tp_group *g, const char *isq) {
  int world = tp_group_world(g);
  if (world <= 1)
    return model_load_isq(path, bes[0], isq);
  struct tp_load *L = calloc(1, sizeof *L);
  if (!L) {
    ERR("out of memory");
    return NULL;
  }
  *L = (struct tp_load){.path = path, .isq = isq, .bes = bes, .world = world};
  const struct backend_ops *op = bes[0]->ops;
  if (!op->comm_id || !op->comm_init || !op->all_reduce_sum) {
    ERR("--tp %d: the %s backend of this build has no collectives (the CUDA backend needs NCCL at build "
        "time: see docs/distributed.md); use --tp 1", world, op->name);
    free(L);
    return NULL;
  }
  long long peer_max = tp_peer_ar_max();
  if (peer_max < 0) {
    free(L);
    return NULL;
  }
  L->connect = op->peer_ar_alloc && op->peer_ar_connect;
  L->peer_ar_max = L->connect ? (size_t)peer_max : 0;
  struct model *m = NULL;
  if (op->comm_id(bes[0], L->id) == 0 && tp_group_run(g, tp_load_rank, L) == 0 &&
      (!L->connect || tp_group_run(g, tp_connect_rank, L) == 0) &&
      (!L->no_peer || tp_group_run(g, tp_disconnect_rank, L) == 0)) {
    m = L->models[0];
    if (!(m->ranks = calloc((size_t)world, sizeof *m->ranks))) {
      ERR("out of memory");
      m = NULL;
    } else {
      memcpy(m->ranks, L->models, (size_t)world * sizeof *m->ranks);
      m->tp = g;
      m->tp_ids_shared = L->connect && !L->no_peer;
      free(L);
      return m;
    }
  }
  char why[1024];
  snprintf(why, sizeof why, "%s", err_last());
  tp_group_run(g, tp_free_rank, L->models);
  model_free(L->models[0]);
  free(L);
  ERR("%s", why);
  return NULL;
}



size_t model_kv_block_bytes(const struct model_config *c, int block_size, enum dtype kv_dtype) {
  size_t per_head = (size_t)block_size * dtype_row_bytes(kv_dtype, c->head_dim); /* f8e4m3: no per-token scales */
  return 2 * (size_t)c->n_layers * (size_t)c->n_kv_heads * per_head;
}

size_t model_weight_bytes(const struct model *m) {
  size_t total = 0;
  const struct weight *top[] = {&m->tok_embd, &m->out_norm, &m->lm_head};
  for (size_t i = 0; i < 3; i++)
    if (top[i]->data && (i < 2 || !m->lm_head_view))
      total += dtype_row_bytes(top[i]->dtype, top[i]->cols) * (size_t)top[i]->rows;
  for (int l = 0; m->layers && l < m->config.n_layers; l++) {
    const struct layer_weights *L = &m->layers[l];
    const struct weight *ws[] = LAYER_WEIGHTS(L);
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
      if (ws[i]->data)
        total += dtype_row_bytes(ws[i]->dtype, ws[i]->cols) * (size_t)ws[i]->rows;
  }
  return total;
}

size_t model_workspace_bytes(const struct model *m) { return m->workspace_bytes; }

/* Allocates and zeroes one buffer of the cache or workspace; names the flags to change on OOM. */
static void *alloc0(struct model *m, size_t bytes, const char *what) {
  void *p = m->be->ops->alloc(m->be, bytes);
  if (!p) {
    ERR("out of memory allocating the %s (%.1f MiB): lower --pa-memory-mb / --pa-memory-fraction / "
        "--pa-context-len, or --max-num-batched-tokens", what, (double)bytes / (1 << 20));
    return NULL;
  }
  if (m->be->ops->memset0(m->be, p, bytes) != 0)
    return NULL;
  return p;
}

/* The fused projections' output buffer and the gather indices that split it (blocks.h). */
static int alloc_fused(struct model *m, int max_tokens) {
  const struct model_config *c = &m->config;
  size_t cols = blocks_fused_cols(c, &m->layers[0]);
  size_t num_idx = blocks_split_idx_count(c, &m->layers[0], max_tokens);
  size_t fb = (size_t)max_tokens * cols * dtype_row_bytes(m->be->act_dtype, 1);
  int32_t *idx = malloc(num_idx * sizeof *idx);
  if (!idx)
    return ERR("out of memory");
  blocks_split_idx_fill(idx, c, &m->layers[0], max_tokens);
  int rc = -1;
  if ((m->fused = alloc0(m, fb, "activation workspace")) &&
      (m->split_idx = alloc0(m, num_idx * sizeof *idx, "activation workspace")) &&
      m->be->ops->upload(m->be, m->split_idx, idx, num_idx * sizeof *idx) == 0) {
    m->workspace_bytes += fb + num_idx * sizeof *idx;
    rc = 0;
  }
  free(idx);
  return rc;
}

static int local_alloc_workspace(struct model *m, int max_tokens, int max_seqs, int max_blocks_per_seq) {
  const struct model_config *c = &m->config;
  if (max_tokens < 1 || max_seqs < 1 || max_blocks_per_seq < 1)
    return ERR("workspace: %d tokens, %d sequences, %d blocks per sequence: each must be positive",
               max_tokens, max_seqs, max_blocks_per_seq);
  free_workspace(m);
  struct backend *be = m->be;
  size_t act = dtype_row_bytes(be->act_dtype, 1);
  size_t T = (size_t)max_tokens, qd = (size_t)c->n_heads * c->head_dim,
         kvd = (size_t)c->n_kv_heads * c->head_dim;
  struct {
    void **buf;
    size_t bytes;
  } bufs[] = {
      {&m->x, T * c->dim * act},      {&m->xb, T * c->dim * act},       {&m->xb2, T * c->dim * act},
      {&m->q, T * qd * act},          {&m->k, T * kvd * act},           {&m->v, T * kvd * act},
      {&m->att, T * qd * act},        {&m->gate, T * c->ffn_dim * act}, {&m->up, T * c->ffn_dim * act},
  };
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    if (!(*bufs[i].buf = alloc0(m, bufs[i].bytes, "activation workspace")))
      goto fail;
    m->workspace_bytes += bufs[i].bytes;
  }
  if (blocks_fused_cols(c, &m->layers[0]) && alloc_fused(m, max_tokens))
    goto fail;
  if (c->n_experts > 0) { /* the MoE block's scratch (arch_mixtral.c) */
    size_t wb = moe_scratch_bytes(be, max_tokens, c->n_experts, c->n_experts_used, c->dim, c->ffn_dim);
    if (!(m->arch_ws = alloc0(m, wb, "architecture workspace")))
      goto fail;
    m->workspace_bytes += wb;
  }
  struct meta_layout *ml = &m->ml;
  ml->ids = 0;
  ml->positions = ml->ids + T;
  ml->slots = ml->positions + T;
  ml->query_start = ml->slots + T;
  ml->seq_lens = ml->query_start + (size_t)max_seqs + 1;
  ml->block_tables = ml->seq_lens + (size_t)max_seqs;
  ml->logits_idx = ml->block_tables + (size_t)max_seqs * max_blocks_per_seq;
  ml->total = ml->logits_idx + T;
  if (m->vocab_parallel) { /* the rank's logits and the gather's scratch (every rank: backend.h) */
    size_t lb = (size_t)max_seqs * m->vocab_local * sizeof(float), sb = (size_t)max_seqs * c->vocab_size * sizeof(float);
    if (!(m->logits_local = alloc0(m, lb, "logits buffer")) || !(m->gather_scratch = alloc0(m, sb, "logits buffer")))
      goto fail;
    m->workspace_bytes += lb + sb;
  }
  if (!m->host_mem) {
    /* tensor parallelism: only rank 0 holds the logits of the whole vocabulary */
    size_t meta_b = ml->total * sizeof(int32_t),
           logits_b = m->tp_rank == 0 ? (size_t)max_seqs * c->vocab_size * sizeof(float) : 0;
    if (!(m->meta = alloc0(m, meta_b, "batch metadata")) ||
        (logits_b && !(m->logits_dev = alloc0(m, logits_b, "logits buffer"))))
      goto fail;
    m->meta_host = be->ops->alloc_host ? be->ops->alloc_host(be, 2 * meta_b) : malloc(2 * meta_b);
    if (!m->meta_host) {
      if (!be->ops->alloc_host)
        ERR("out of memory for the batch metadata staging (%.1f MiB)", (double)meta_b / 1048576.0);
      goto fail;
    }
    m->workspace_bytes += meta_b + logits_b;
  }
  if (be->ops->reserve && be->ops->reserve(be, max_tokens, max_seqs, max_blocks_per_seq))
    goto fail;
  m->max_tokens = max_tokens;
  m->max_seqs = max_seqs;
  m->max_blocks_per_seq = max_blocks_per_seq;
  return 0;
fail:
  free_workspace(m);
  return -1;
}

/* Allocates n_layers K/V caches of num_blocks blocks (no lower bound: the profiling pass uses
 * one block); frees any earlier pool first. */
static int alloc_kv(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype) {
  const struct model_config *c = &m->config;
  free_kv(m);
  m->kv = calloc((size_t)c->n_layers, sizeof *m->kv);
  if (!m->kv)
    return ERR("out of memory");
  size_t kv_bytes = (size_t)num_blocks * c->n_kv_heads * block_size * dtype_row_bytes(kv_dtype, c->head_dim);
  for (int l = 0; l < c->n_layers; l++) {
    struct kv_layer *kv = &m->kv[l];
    kv->dtype = kv_dtype;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->n_kv_heads = c->n_kv_heads;
    kv->head_dim = c->head_dim;
    if (!(kv->k = alloc0(m, kv_bytes, "KV cache")) || !(kv->v = alloc0(m, kv_bytes, "KV cache")))
      goto fail;
    /* per-layer f8e4m3 scales: the checkpoint's k_scale / v_scale, else 1.0 (docs/kv-cache.md) */
    kv->k_scale = m->kv_scales ? m->kv_scales[2 * l] : 1.0f;
    kv->v_scale = m->kv_scales ? m->kv_scales[2 * l + 1] : 1.0f;
  }
  return 0;
fail:
  free_kv(m);
  return -1;
}

/* The KV dtypes the backend's kernels implement are its caps.kv_dtypes (cpu: f32, f16, f8e4m3;
 * cuda: bf16, f8e4m3). */
static int check_kv_args(const struct model *m, int block_size, enum dtype kv_dtype) {
  if (block_size != 8 && block_size != 16 && block_size != 32)
    return ERR("--pa-block-size %d: must be 8, 16 or 32", block_size);
  if (!backend_kv_dtype_ok(m->be, kv_dtype))
    return ERR("--pa-cache-type %s: the %s backend's kernels do not implement a KV cache of that dtype; "
               "use --pa-cache-type auto (%s)", dtype_name(kv_dtype), m->be->ops->name,
               dtype_name(m->be->caps.kv_auto));
  return 0;
}

static int local_alloc_kv(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype) {
  if (check_kv_args(m, block_size, kv_dtype))
    return -1;
  if (num_blocks < 2)
    return ERR("KV cache of %d blocks: at least 2 (block 0 is reserved)", num_blocks);
  return alloc_kv(m, num_blocks, block_size, kv_dtype);
}

static int local_alloc_cache(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype,
                      int max_tokens, int max_seqs, int max_blocks_per_seq) {
  if (check_kv_args(m, block_size, kv_dtype))
    return -1;
  if (num_blocks < 2)
    return ERR("KV cache of %d blocks: at least 2 (block 0 is reserved)", num_blocks);
  if (local_alloc_workspace(m, max_tokens, max_seqs, max_blocks_per_seq))
    return -1;
  if (local_alloc_kv(m, num_blocks, block_size, kv_dtype)) {
    free_workspace(m);
    return -1;
  }
  return 0;
}

static int local_profile(struct model *m, int block_size, enum dtype kv_dtype) {
  if (!m->max_tokens)
    return ERR("model_profile before model_alloc_workspace");
  if (m->kv)
    return ERR("model_profile after model_alloc_kv (it runs before the pool exists)");
  if (check_kv_args(m, block_size, kv_dtype))
    return -1;
  const int V = m->config.vocab_size;
  int64_t cap = (int64_t)m->max_seqs * m->max_blocks_per_seq * block_size;
  int T = cap < m->max_tokens ? (int)cap : m->max_tokens;
  int B = m->max_seqs < T ? m->max_seqs : T;
  int32_t *ints = calloc((size_t)4 * T + 2 * (size_t)B + 1 + (size_t)B * m->max_blocks_per_seq, sizeof(int32_t));
  float *logits = malloc((size_t)B * V * sizeof(float));
  int rc = -1;
  if (!ints || !logits) {
    ERR("out of memory for the profiling batch");
    goto done;
  }
  int32_t *ids = ints, *pos = ids + T, *slots = pos + T, *lidx = slots + T, *qs = lidx + T, *lens = qs + B + 1;
  int32_t *tables = lens + B; /* (B, max_blocks_per_seq) all 0: the null block */
  qs[0] = 0;
  for (int s = 0; s < B; s++) {
    lens[s] = T / B + (s < T % B);
    qs[s + 1] = qs[s] + lens[s];
    for (int i = 0; i < lens[s]; i++) {
      int t = qs[s] + i;
      ids[t] = t % V;
      pos[t] = i;
      slots[t] = -1; /* written nowhere */
    }
    lidx[s] = qs[s + 1] - 1;
  }
  struct batch b = {0};
  b.num_tokens = T;
  b.num_seqs = B;
  b.input_ids = ids;
  b.positions = pos;
  b.slot_mapping = slots;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_tables = tables;
  b.max_blocks_per_seq = m->max_blocks_per_seq;
  b.logits_idx = lidx;
  b.num_logits = B;
  b.max_seq_len = b.max_query_len = T / B + (T % B != 0);
  if (alloc_kv(m, 1, block_size, kv_dtype) == 0) {
    rc = local_forward(m, &b, logits);
    free_kv(m);
  }
done:
  free(ints);
  free(logits);
  return rc;
}

static int local_copy_blocks(struct model *m, const int32_t *src, const int32_t *dst, int n) {
  if (!m->kv)
    return ERR("model_copy_blocks before model_alloc_kv");
  return m->be->ops->copy_blocks(m->be, m->kv, m->config.n_layers, src, dst, n);
}

/* Checks everything in a step's batch that could make a kernel read or write out of bounds.
 * Request-path input: a bad batch is an error, never a crash. */
static int check_batch(const struct model *m, const struct batch *b) {
  const struct kv_layer *kv = &m->kv[0];
  int T = b->num_tokens, B = b->num_seqs, bs = kv->block_size;
  if (T < 1 || T > m->max_tokens)
    return ERR("batch of %d tokens (the workspace holds 1..%d)", T, m->max_tokens);
  if (B < 1 || B > m->max_seqs || b->max_blocks_per_seq < 1 ||
      (size_t)B * b->max_blocks_per_seq > (size_t)m->max_seqs * m->max_blocks_per_seq)
    return ERR("batch of %d sequences x %d blocks exceeds the allocated %d x %d", B,
               b->max_blocks_per_seq, m->max_seqs, m->max_blocks_per_seq);
  if (b->num_logits < 0 || b->num_logits > T)
    return ERR("batch asks for %d logits rows of %d tokens", b->num_logits, T);
  for (int i = 0; i < b->num_logits; i++)
    if (b->logits_idx[i] < 0 || b->logits_idx[i] >= T)
      return ERR("logits_idx[%d] = %d outside the %d tokens", i, b->logits_idx[i], T);
  if (b->query_start[0] != 0 || b->query_start[B] != T)
    return ERR("query_start must run from 0 to %d", T);
  int64_t num_slots = (int64_t)kv->num_blocks * bs;
  for (int s = 0; s < B; s++) {
    int len = b->seq_lens[s];
    if (b->query_start[s + 1] < b->query_start[s])
      return ERR("query_start decreases at sequence %d", s);
    if (len < 1 || len > (int64_t)b->max_blocks_per_seq * bs)
      return ERR("sequence %d of %d tokens does not fit %d blocks", s, len, b->max_blocks_per_seq);
    const int32_t *table = b->block_tables + (size_t)s * b->max_blocks_per_seq;
    for (int i = 0; i < (len + bs - 1) / bs; i++)
      if (table[i] < 0 || table[i] >= kv->num_blocks)
        return ERR("sequence %d maps block %d to %d (pool of %d)", s, i, table[i], kv->num_blocks);
    for (int t = b->query_start[s]; t < b->query_start[s + 1]; t++) {
      if (b->positions[t] < 0 || b->positions[t] >= len)
        return ERR("token %d at position %d outside its sequence of %d", t, b->positions[t], len);
      if (b->slot_mapping[t] >= num_slots)
        return ERR("token %d: slot %d beyond the pool of %lld", t, b->slot_mapping[t], (long long)num_slots);
      if ((b->input_ids[t] < 0 && !(m->be->ops->resolve_ids && !m->host_mem && b->input_ids[t] >= -2 * m->max_seqs)) ||
          b->input_ids[t] >= m->config.vocab_size)
        return ERR("token id %d out of range (vocabulary of %d)", b->input_ids[t], m->config.vocab_size);
    }
  }
  return 0;
}

/* The batch in backend memory: the host arrays themselves when the backend's memory is host
 * memory, else packed into one half of the pinned staging m->meta_host (room for m->ml.total
 * each) and sent up in one copy into m->meta; the halves alternate, so a half is rewritten only
 * after the step before the previous one was read back (its copy long done). Ids the previous
 * step sampled on the device (ids < 0, see struct batch) are resolved there after the copy. */
static int stage_batch(struct model *m, const struct batch *hb, struct batch *db) {
  *db = *hb;
  if (m->host_mem)
    return 0;
  struct backend *be = m->be;
  int T = hb->num_tokens, B = hb->num_seqs;
  struct {
    const int32_t *src;
    size_t n;
    const int32_t **dst;
  } parts[] = {
      {hb->input_ids, (size_t)T, &db->input_ids},
      {hb->positions, (size_t)T, &db->positions},
      {hb->slot_mapping, (size_t)T, &db->slot_mapping},
      {hb->query_start, (size_t)B + 1, &db->query_start},
      {hb->seq_lens, (size_t)B, &db->seq_lens},
      {hb->block_tables, (size_t)B * hb->max_blocks_per_seq, &db->block_tables},
      {hb->logits_idx, (size_t)hb->num_logits, &db->logits_idx},
  };
  size_t end = 0; /* packed back to back (never more than ml->total), so only what is used goes up */
  int32_t *host = m->meta_host + (size_t)m->meta_half * m->ml.total;
  m->meta_half ^= 1;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    if (parts[i].n)
      memcpy(host + end, parts[i].src, parts[i].n * sizeof(int32_t));
    *parts[i].dst = m->meta + end;
    end += parts[i].n;
  }
  if (be->ops->upload(be, m->meta, host, end * sizeof(int32_t)))
    return -1;
  for (int t = 0; t < T; t++)
    if (hb->input_ids[t] < 0) /* (check_batch allowed them: the backend resolves them) */
      return be->ops->resolve_ids(be, (int32_t *)db->input_ids, T, m->max_seqs);
  return 0;
}

/* The ops of one step on a staged batch, from the embedding to the final norm (into m->xb); for
 * a graph batch also the logits rows into m->logits_dev. Only enqueues: it is what a CUDA graph
 * captures (model_forward_graph). */
struct forward_ctx {
  struct model *m;
  const struct batch *b;
  int graph;
};

static int forward_ops(void *ctx) {
  struct model *m = ((struct forward_ctx *)ctx)->m;
  const struct batch b = *((struct forward_ctx *)ctx)->b;
  struct backend *be = m->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = &m->config;
  const int T = b.num_tokens, dim = c->dim;
  /* Each call returns nonzero with err_last() set; the first failure ends the step (TRY). */
  /* The layers: the architecture's forward pass leaves the final normed states in xb. */
  struct rope_params rope = m->rope;
  if (rope.inv_freq_long) { /* longrope picks its factors from each sequence's length */
    rope.query_start = b.query_start;
    rope.seq_lens = b.seq_lens;
    rope.num_seqs = b.num_seqs;
  }
  struct fwd fw = {be, c, m->layers, &m->tok_embd, &m->out_norm, m->kv, &b, &rope, T,
                   m->max_tokens, m->x, m->xb, m->xb2, m->q, m->k, m->v, m->att, m->gate, m->up,
                   m->fused, m->split_idx, m->arch_ws, m->tp_world};
  TRY(m->arch->forward(&fw));
  /* a graph step's output head: rank 0's logits (without tensor parallelism, or with rank 0
   * holding the whole head), or every rank's slice of a split vocabulary (gathered after the
   * graph, outside it: forward) */
  if (((struct forward_ctx *)ctx)->graph && (m->tp_rank == 0 || m->vocab_parallel)) {
    TRY(op->gather_rows(be, m->xb2, m->xb, b.logits_idx, b.num_logits, dim));
    if (m->vocab_parallel)
      return op->matmul(be, m->logits_local, m->xb2, &m->lm_head, NULL, b.num_logits, 1);
    TRY(op->matmul(be, m->logits_dev, m->xb2, &m->lm_head, NULL, b.num_logits, 1));
    if (c->final_softcap > 0) /* Gemma 2 */
      TRY(op->softcap(be, m->logits_dev, b.num_logits, c->vocab_size, c->final_softcap));
  }
  return 0;
}

/* The output head on N (<= max_seqs when vocabulary-parallel) rows of final hidden states HID
 * (act, (n, dim)): logits into OUT (n, vocab) F32 backend memory on rank 0, Gemma 2's softcap
 * included. Vocabulary-parallel: every rank's slice into logits_local, then gathered into rank
 * 0's OUT (ranks > 0 pass NULL); every rank must call it with the same N. */
static int head_logits(struct model *m, float *out, const void *hid, int n) {
  struct backend *be = m->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = &m->config;
  if (m->vocab_parallel) {
    if (op->matmul(be, m->logits_local, hid, &m->lm_head, NULL, n, 1) ||
        op->gather_cols(be, m->tp_rank == 0 ? out : NULL, m->logits_local, m->gather_scratch, n, m->vocab_local))
      return -1;
  } else if (op->matmul(be, out, hid, &m->lm_head, NULL, n, 1)) {
    return -1;
  }
  if (m->tp_rank == 0 && c->final_softcap > 0) /* Gemma 2, on the whole vocabulary */
    return op->softcap(be, out, n, c->vocab_size, c->final_softcap);
  return 0;
}

/* One step. Under tensor parallelism every rank runs it with the same batch, and ranks > 0 ignore
 * LOGITS: what they do (their collectives must match rank 0's) depends on the batch alone. With a
 * split vocabulary on a device that is the first max_seqs logits rows; model_forward gets rank 0's
 * other rows with model_logits_rows, a call of every rank. */
static int forward(struct model *m, const struct batch *batch, float *logits, int graph) {
  if (!m->kv || !m->max_tokens)
    return ERR("model_forward before model_alloc_kv and model_alloc_workspace");
  if (check_batch(m, batch) != 0)
    return -1;
  struct backend *be = m->be;
  const struct backend_ops *op = be->ops;
  const struct model_config *c = &m->config;
  const int dim = c->dim, rank0 = m->tp_rank == 0;
  struct batch b;
  if (!rank0)
    logits = NULL;
  /* tensor-parallel ranks > 0: nobody else syncs their stream, so the staging of the previous
   * step is known free only after this */
  if (!rank0 && op->sync(be))
    return -1;
  if (stage_batch(m, batch, &b) != 0)
    return -1;
  /* MoE routing reads the experts' row counts back to the host in every layer, which a graph
   * cannot hold: those models run their (padded) decode batches directly. Under single-process
   * tensor parallelism every rank captures and replays its own graph of the same key at the same
   * step (all ranks see the same batches; cuda_graph.cu), its all-reduces inside; multi-process
   * ranks never get here with GRAPH set (the mirror runs model_forward). */
  struct forward_ctx ctx = {m, &b, graph && !m->host_mem && op->graph_run && c->n_experts == 0};
  if (ctx.graph) {
    /* Its launches depend only on B: same staged pointers (packed by size), same scalars. */
    if (b.num_tokens != b.num_seqs || b.num_logits != b.num_seqs || b.max_blocks_per_seq != m->max_blocks_per_seq ||
        b.num_seqs > m->max_seqs)
      return ERR("graph batch of %d tokens, %d sequences, %d logits rows, %d blocks per sequence: a padded "
                 "decode batch has one of each per sequence and %d blocks", b.num_tokens, b.num_seqs,
                 b.num_logits, b.max_blocks_per_seq, m->max_blocks_per_seq);
    /* the key: the padded batch size, and whether the bound is the short context (its own graph) */
    const int short_ctx = be->caps.graph_short_ctx;
    if (op->graph_run(be, b.num_seqs * 2 + (short_ctx > 0 && b.max_seq_len <= short_ctx), forward_ops, &ctx))
      return -1;
    m->num_hidden_rows = b.num_logits;
    if (m->vocab_parallel) { /* the slices to rank 0, then Gemma 2's softcap on the whole vocabulary */
      TRY(op->gather_cols(be, rank0 ? m->logits_dev : NULL, m->logits_local, m->gather_scratch, b.num_logits,
                          m->vocab_local));
      if (rank0 && c->final_softcap > 0)
        TRY(op->softcap(be, m->logits_dev, b.num_logits, c->vocab_size, c->final_softcap));
    }
    if (!logits)
      return 0;
    return model_logits_download(m, 0, b.num_logits, logits);
  }
  if (forward_ops(&ctx))
    return -1;
  if (!rank0 && !m->vocab_parallel) /* tensor parallelism: rank 0 alone computes the logits */
    return 0;
  /* logits only for the rows asked for; in chunks of max_seqs rows on a device (and whenever the
   * vocabulary is split: its buffers hold max_seqs rows) */
  int n = b.num_logits;
  if (n == 0)
    return rank0 ? op->sync(be) : 0;
  TRY(op->gather_rows(be, m->xb2, m->xb, b.logits_idx, n, dim));
  size_t act = dtype_row_bytes(be->act_dtype, 1), V = (size_t)c->vocab_size;
  if (m->host_mem) {
    if (rank0 && !logits)
      return ERR("model_forward: the logits stay in backend memory only on a device backend");
    int chunk = m->vocab_parallel ? m->max_seqs : n;
    for (int r0 = 0; r0 < n; r0 += chunk) {
      int nr = n - r0 < chunk ? n - r0 : chunk;
      TRY(head_logits(m, rank0 ? logits + (size_t)r0 * V : NULL, (char *)m->xb2 + (size_t)r0 * dim * act, nr));
    }
    return 0;
  }
  /* the first max_seqs rows into model_logits_device, the others later by model_logits_rows (the
   * hidden states stay in xb2); without LOGITS no sync */
  int first = n < m->max_seqs ? n : m->max_seqs;
  m->num_hidden_rows = n;
  TRY(head_logits(m, m->logits_dev, m->xb2, first));
  if (!logits)
    return 0;
  TRY(op->download(be, logits, m->logits_dev, (size_t)first * V * sizeof(float)));
  for (int r0 = first; r0 < n && !m->vocab_parallel; r0 += m->max_seqs) {
    int nr = n - r0 < m->max_seqs ? n - r0 : m->max_seqs;
    TRY(head_logits(m, m->logits_dev, (char *)m->xb2 + (size_t)r0 * dim * act, nr));
    TRY(op->download(be, logits + (size_t)r0 * V, m->logits_dev, (size_t)nr * V * sizeof(float)));
  }
  return op->sync(be);
}

static int local_forward(struct model *m, const struct batch *batch, float *logits) { return forward(m, batch, logits, 0); }

static int local_forward_graph(struct model *m, const struct batch *batch, float *logits) {
  return forward(m, batch, logits, 1);
}

static int local_logits_rows(struct model *m, int r0, int n) {
  if (m->host_mem || r0 < 0 || n < 1 || n > m->max_seqs || r0 + n > m->num_hidden_rows)
    return ERR("model_logits_rows: rows %d..%d of the %d kept (at most %d at a time)", r0, r0 + n,
               m->num_hidden_rows, m->max_seqs);
  size_t off = (size_t)r0 * m->config.dim * dtype_row_bytes(m->be->act_dtype, 1);
  return head_logits(m, m->logits_dev, (char *)m->xb2 + off, n);
}

float *model_logits_device(struct model *m) { return m->host_mem ? NULL : m->logits_dev; }

int model_logits_download(struct model *m, int row0, int n, float *dst) {
  size_t V = (size_t)m->config.vocab_size;
  if (m->host_mem || row0 < 0 || n < 0 || row0 + n > m->max_seqs)
    return ERR("model_logits_download: rows %d..%d of %d on the device", row0, row0 + n, m->max_seqs);
  return n ? m->be->ops->download(m->be, dst, m->logits_dev + (size_t)row0 * V, (size_t)n * V * sizeof(float)) : 0;
}

/* ---- Multi-process tensor parallelism (src/dist/mp.c): a rank's shard alone, and its calls ---- */
struct model *model_load_rank(const char *path, struct backend *be, const char *isq, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    ERR("tensor-parallel rank %d of %d: out of range", rank, world);
    return NULL;
  }
  return load_model(path, be, isq, rank, world);
}

void model_set_mirror(struct model *m, int (*mirror)(struct model *m, const struct step_msg *call, float *logits,
                                                     void *user),
                      void *user) {
  m->mirror = mirror;
  m->mirror_user = user;
}

int model_run_call(struct model *m, const struct step_msg *c, float *logits) {
  const int32_t *a = c->args;
  switch (c->op) {
  case STEP_FORWARD: return local_forward(m, &c->batch, m->tp_rank == 0 ? logits : NULL);
  case STEP_COPY_BLOCKS: return local_copy_blocks(m, c->src, c->dst, a[0]);
  case STEP_ALLOC_WORKSPACE: return local_alloc_workspace(m, a[0], a[1], a[2]);
  case STEP_PROFILE: return local_profile(m, a[0], (enum dtype)a[1]);
  case STEP_ALLOC_KV: return local_alloc_kv(m, a[0], a[1], (enum dtype)a[2]);
  case STEP_ALLOC_CACHE: return local_alloc_cache(m, a[0], a[1], (enum dtype)a[2], a[3], a[4], a[5]);
  case STEP_LOGITS_ROWS: return local_logits_rows(m, a[0], a[1]);
  default: return ERR("model_run_call: op %d is not a model call", (int)c->op);
  }
}

static int mirror_call(struct model *m, enum step_op op, const int32_t *args, const struct batch *batch,
                       const int32_t *src, const int32_t *dst, float *logits) {
  struct step_msg c = {.op = op, .src = src, .dst = dst};
  if (args)
    memcpy(c.args, args, sizeof c.args);
  if (batch)
    c.batch = *batch;
  return m->mirror(m, &c, logits, m->mirror_user);
}

/* ---- The public calls: on rank 0 of a tensor-parallel group every rank runs the same call on
 * its own thread (its shard, its stream); otherwise the model alone. ---- */
struct fan {
  struct model *m;
  int (*fn)(struct model *m, void *arg);
  void *arg;
};

static int fan_rank(int r, void *ctx) {
  struct fan *f = ctx;
  return f->fn(f->m->ranks[r], f->arg);
}

static int fan_out(struct model *m, int (*fn)(struct model *m, void *arg), void *arg) {
  if (!m->ranks)
    return fn(m, arg);
  struct fan f = {m, fn, arg};
  return tp_group_run(m->tp, fan_rank, &f);
}

struct fan_args {
  int a, b, c;
  enum dtype t;
  int d, e, f;
  const struct batch *batch;
  float *logits;
  const int32_t *src, *dst;
};

static int fan_workspace(struct model *m, void *p) {
  struct fan_args *a = p;
  return local_alloc_workspace(m, a->a, a->b, a->c);
}
int model_alloc_workspace(struct model *m, int max_tokens, int max_seqs, int max_blocks_per_seq) {
  if (m->mirror)
    return mirror_call(m, STEP_ALLOC_WORKSPACE, (int32_t[STEP_NARGS]){max_tokens, max_seqs, max_blocks_per_seq},
                       NULL, NULL, NULL, NULL);
  struct fan_args a = {.a = max_tokens, .b = max_seqs, .c = max_blocks_per_seq};
  return fan_out(m, fan_workspace, &a);
}

static int fan_profile(struct model *m, void *p) {
  struct fan_args *a = p;
  return local_profile(m, a->a, a->t);
}
int model_profile(struct model *m, int block_size, enum dtype kv_dtype) {
  if (m->mirror)
    return mirror_call(m, STEP_PROFILE, (int32_t[STEP_NARGS]){block_size, (int32_t)kv_dtype}, NULL, NULL, NULL, NULL);
  struct fan_args a = {.a = block_size, .t = kv_dtype};
  return fan_out(m, fan_profile, &a);
}

static int fan_kv(struct model *m, void *p) {
  struct fan_args *a = p;
  return local_alloc_kv(m, a->a, a->b, a->t);
}
int model_alloc_kv(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype) {
  if (m->mirror)
    return mirror_call(m, STEP_ALLOC_KV, (int32_t[STEP_NARGS]){num_blocks, block_size, (int32_t)kv_dtype}, NULL,
                       NULL, NULL, NULL);
  struct fan_args a = {.a = num_blocks, .b = block_size, .t = kv_dtype};
  return fan_out(m, fan_kv, &a);
}

static int fan_cache(struct model *m, void *p) {
  struct fan_args *a = p;
  return local_alloc_cache(m, a->a, a->b, a->t, a->d, a->e, a->f);
}
int model_alloc_cache(struct model *m, int num_blocks, int block_size, enum dtype kv_dtype,
                      int max_tokens, int max_seqs, int max_blocks_per_seq) {
  if (m->mirror)
    return mirror_call(m, STEP_ALLOC_CACHE,
                       (int32_t[STEP_NARGS]){num_blocks, block_size, (int32_t)kv_dtype, max_tokens, max_seqs,
                                             max_blocks_per_seq},
                       NULL, NULL, NULL, NULL);
  struct fan_args a = {.a = num_blocks, .b = block_size, .t = kv_dtype, .d = max_tokens, .e = max_seqs,
                       .f = max_blocks_per_seq};
  return fan_out(m, fan_cache, &a);
}

/* Ranks > 0 run the layers (their all-reduces join rank 0's) and, when the vocabulary is split,
 * their slice of the logits (gathered to rank 0); rank 0 also the logits. With .a set (a padded
 * decode batch) each rank runs its own CUDA graph of the step (captured on its own thread). */
static int fan_forward(struct model *m, void *p) {
  struct fan_args *a = p;
  return forward(m, a->batch, m->tp_rank == 0 ? a->logits : NULL, a->a);
}

/* A split vocabulary on a device: the logits rows of the step beyond the first max_seqs into
 * LOGITS (host), max_seqs at a time, each a model_logits_rows of every rank. */
static int forward_rest_rows(struct model *m, int n, float *logits) {
  size_t V = (size_t)m->config.vocab_size;
  for (int r0 = m->max_seqs; r0 < n; r0 += m->max_seqs) {
    int nr = n - r0 < m->max_seqs ? n - r0 : m->max_seqs;
    if (model_logits_rows(m, r0, nr) || model_logits_download(m, 0, nr, logits + (size_t)r0 * V))
      return -1;
  }
  return n > m->max_seqs ? m->be->ops->sync(m->be) : 0;
}
static int tp_forward(struct model *m, const struct batch *batch, float *logits, int graph) {
  struct fan_args a = {.batch = batch, .logits = logits, .a = graph};
  int rc = fan_out(m, fan_forward, &a);
  if (rc == 0 && logits && m->vocab_parallel && !m->host_mem)
    rc = forward_rest_rows(m, batch->num_logits, logits);
  /* NCCL's asynchronous errors (a peer lost, a transport failure) surface here; any failure
   * aborts every rank's communicator so that no stream waits forever on a collective that a
   * failed rank will never join. The model takes no more steps afterwards. */
  for (int r = 0; rc == 0 && r < m->tp_world; r++) {
    struct backend *be = m->ranks[r]->be;
    if (be->ops->comm_check && be->ops->comm_check(be))
      rc = ERR("tensor-parallel rank %d: %s", r, err_last());
  }
  if (rc) {
    char why[1024];
    snprintf(why, sizeof why, "%s", err_last());
    for (int r = 0; r < m->tp_world; r++)
      if (m->ranks[r]->be->ops->comm_abort)
        m->ranks[r]->be->ops->comm_abort(m->ranks[r]->be);
    return ERR("%s (tensor parallelism stopped: the communicators were aborted)", why);
  }
  return 0;
}
int model_forward(struct model *m, const struct batch *batch, float *logits) {
  if (m->mirror) {
    int rc = mirror_call(m, STEP_FORWARD, NULL, batch, NULL, NULL, logits);
    if (rc == 0 && logits && m->vocab_parallel && !m->host_mem) /* the rows past max_seqs, each call mirrored */
      rc = forward_rest_rows(m, batch->num_logits, logits);
    return rc;
  }
  return m->ranks ? tp_forward(m, batch, logits, 0) : local_forward(m, batch, logits);
}
int model_forward_graph(struct model *m, const struct batch *batch, float *logits) {
  if (m->mirror) /* no graphs across processes (each worker runs its calls directly) */
    return model_forward(m, batch, logits);
  return m->ranks ? tp_forward(m, batch, logits, 1) : local_forward_graph(m, batch, logits);
}

static int fan_logits_rows(struct model *m, void *p) {
  struct fan_args *a = p;
  return local_logits_rows(m, a->a, a->b);
}
/* Vocabulary-parallel: every rank computes its slice of the rows (ranks > 0 kept their hidden
 * states too), rank 0 gathers them. */
int model_logits_rows(struct model *m, int r0, int n) {
  if (m->mirror && m->vocab_parallel) /* the other processes join the gather */
    return mirror_call(m, STEP_LOGITS_ROWS, (int32_t[STEP_NARGS]){r0, n}, NULL, NULL, NULL, NULL);
  if (!m->ranks || !m->vocab_parallel)
    return local_logits_rows(m, r0, n);
  struct fan_args a = {.a = r0, .b = n};
  return fan_out(m, fan_logits_rows, &a);
}

static int fan_copy(struct model *m, void *p) {
  struct fan_args *a = p;
  return local_copy_blocks(m, a->src, a->dst, a->a);
}
int model_copy_blocks(struct model *m, const int32_t *src, const int32_t *dst, int n) {
  if (m->mirror)
    return mirror_call(m, STEP_COPY_BLOCKS, (int32_t[STEP_NARGS]){n}, NULL, src, dst, NULL);
  struct fan_args a = {.a = n, .src = src, .dst = dst};
  return fan_out(m, fan_copy, &a);
}
