/* model_file.c - opens HF safetensors directories and GGUF files as a struct model_file. */
#include "model/model_file.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "util/file.h"
#include "util/log.h"
#include "util/quant.h"

struct model_file_priv {
  struct gguf_file *gguf;       /* GGUF input, or NULL */
  struct safetensors_set *st;   /* HF input, or NULL */
  char *where;                  /* the file named in messages about missing tensors; owned */
  void **copies;                /* (num_copies) aligned copies of misaligned tensors; owned */
  int num_copies;
};

/* One tensor as found in either format, before checking. */
struct raw_tensor {
  int dtype;               /* enum dtype, or -1 when the format's type is unsupported */
  unsigned gguf_type;      /* GGUF only, for messages */
  int num_dims;
  int64_t rows, cols;      /* (rows, cols) = torch (out, in); 1-D: rows = 1 */
  int64_t extra;           /* 1 when any further dimensions are all 1, else 2 */
  int64_t ne2;             /* GGUF: the third dimension (ne[2]; stacked experts), else 1 */
  const void *data;
  size_t nbytes;
  const char *file;
};

static int find_raw(const struct model_file_priv *p, const char *name, struct raw_tensor *r) {
  memset(r, 0, sizeof *r);
  if (p->gguf) {
    const struct gguf_tensor *t = gguf_find_tensor(p->gguf, name);
    if (!t)
      return -1;
    r->dtype = t->dtype;
    r->gguf_type = t->ggml_type;
    r->num_dims = t->num_dims;
    /* ggml's ne[0] is the contiguous (input) dimension: torch (rows, cols) = (ne[1], ne[0]). */
    r->cols = t->ne[0];
    r->rows = t->ne[1];
    /* Only whether further dimensions exist matters; their product could overflow for the
     * tensors of unsupported types, whose sizes the parser does not bound. */
    r->extra = t->ne[2] == 1 && t->ne[3] == 1 ? 1 : 2;
    r->ne2 = t->num_dims == 3 && t->ne[3] == 1 ? t->ne[2] : 1;
    r->data = t->data;
    r->nbytes = t->nbytes;
    r->file = p->where;
    return 0;
  }
  const struct safetensors_tensor *t = safetensors_set_find(p->st, name);
  if (!t)
    return -1;
  r->dtype = (int)t->dtype;
  r->num_dims = t->num_dims;
  r->rows = t->num_dims >= 2 ? t->shape[t->num_dims - 2] : 1;
  r->cols = t->num_dims >= 1 ? t->shape[t->num_dims - 1] : 1;
  r->extra = 1;
  for (int i = 0; i + 2 < t->num_dims; i++)
    if (t->shape[i] != 1)
      r->extra = 2;
  r->data = t->data;
  r->nbytes = t->nbytes;
  r->file = t->file;
  return 0;
}

/* Alignment element reads need: F32 4; F16, BF16 and the quantized blocks (even sizes, f16
 * scales) 2. */
static size_t dtype_align(enum dtype t) { return t == DTYPE_F32 ? 4 : 2; }

/* Looks up NAME and checks it is a ROWS x COLS matrix (ONE_D: a vector of COLS) of a readable
 * dtype. OPTIONAL tensors may be absent (OUT->data stays NULL). */
static int take(struct model_file *mf, struct host_tensor *out, const char *name, int64_t rows,
                int64_t cols, int one_d, int optional) {
  struct model_file_priv *p = mf->priv;
  struct raw_tensor r;
  memset(out, 0, sizeof *out);
  if (find_raw(p, name, &r) != 0)
    return optional ? 0 : ERR("%s: tensor '%s' is missing", p->where, name);
  if (r.dtype < 0)
    return ERR("%s: tensor '%s' has ggml type %u (%s), which pagoda cannot read (F32, F16, BF16, "
               "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL and IQ4_XS are supported)",
               r.file, name, r.gguf_type, ggml_type_name(r.gguf_type));
  if (one_d && dtype_is_quant((enum dtype)r.dtype))
    return ERR("%s: tensor '%s' is a vector stored as %s (norms and biases must be F32, F16 or "
               "BF16)", r.file, name, ggml_type_name((uint32_t)dtype_to_ggml((enum dtype)r.dtype)));
  int dims_ok = one_d ? r.num_dims == 1 : r.num_dims == 2;
  if (!dims_ok || r.extra != 1 || r.rows != rows || r.cols != cols) {
    if (one_d)
      return ERR("%s: tensor '%s' has shape %s(%lld, %lld), expected a vector of %lld", r.file,
                 name, r.num_dims == 1 ? "1-D " : "", (long long)r.rows, (long long)r.cols,
                 (long long)cols);
    return ERR("%s: tensor '%s' has %d-D shape (%lld, %lld), expected (%lld, %lld) from the "
               "config", r.file, name, r.num_dims, (long long)r.rows, (long long)r.cols,
               (long long)rows, (long long)cols);
  }
  out->dtype = (enum dtype)r.dtype;
  out->rows = one_d ? 1 : rows;
  out->cols = cols;
  out->data = r.data;
  /* The safetensors format does not promise alignment; consumers read elements directly. */
  if ((uintptr_t)r.data % dtype_align(out->dtype)) {
    void **nc = realloc(p->copies, sizeof *nc * (size_t)(p->num_copies + 1));
    void *copy = malloc(r.nbytes ? r.nbytes : 1);
    if (!nc || !copy) {
      free(copy);
      if (nc)
        p->copies = nc;
      return ERR("%s: out of memory copying tensor '%s'", r.file, name);
    }
    p->copies = nc;
    memcpy(copy, r.data, r.nbytes);
    p->copies[p->num_copies++] = copy;
    out->data = copy;
  }
  return 0;
}

static const char *p_where(const struct model_file *mf) {
  return ((const struct model_file_priv *)mf->priv)->where;
}

static int64_t dim_of(const struct model_config *c, enum arch_dim k) {
  switch (k) {
  case AD_ONE: return 1;
  case AD_MODEL: return c->dim;
  case AD_Q: return (int64_t)c->n_heads * c->head_dim;
  case AD_KV: return (int64_t)c->n_kv_heads * c->head_dim;
  case AD_QKV: return (int64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
  case AD_FFN2: return 2 * (int64_t)c->ffn_dim;
  case AD_HEAD: return c->head_dim;
  case AD_EXPERTS: return c->n_experts;
  case AD_EXP_FFN: return (int64_t)c->n_experts * c->ffn_dim;
  case AD_EXP_MODEL: return (int64_t)c->n_experts * c->dim;
  default: return c->ffn_dim;
  }
}

/* Stacked experts (AN_EXPERTS) of layer L as one (ROWS, COLS) tensor, ROWS = N experts' rows:
 * GGUF stores one 3-D tensor (ne = cols, rows / n, n), taken in place; HF one tensor per expert,
 * named by the format SPEC with the expert's index, copied into one buffer F owns. */
static int take_experts(struct model_file *mf, struct host_tensor *out, const struct arch_tensor *spec,
                        int l, int gguf, int n, int64_t rows, int64_t cols) {
  struct model_file_priv *p = mf->priv;
  char name[192], sub[128];
  memset(out, 0, sizeof *out);
  if (n < 1 || rows % n)
    return ERR("%s: %d experts for %lld stacked rows", p->where, n, (long long)rows);
  int64_t per = rows / n;
  if (gguf) {
    struct raw_tensor r;
    snprintf(name, sizeof name, "blk.%d.%s", l, spec->gguf);
    if (find_raw(p, name, &r) != 0)
      return ERR("%s: tensor '%s' is missing", p->where, name);
    if (r.dtype < 0)
      return ERR("%s: tensor '%s' has ggml type %u (%s), which pagoda cannot read", r.file, name,
                 r.gguf_type, ggml_type_name(r.gguf_type));
    if (r.num_dims != 3 || r.ne2 != n || r.rows != per || r.cols != cols)
      return ERR("%s: tensor '%s' has %d-D shape (%lld, %lld, %lld), expected (%d, %lld, %lld) from "
                 "the config (experts, rows, cols)", r.file, name, r.num_dims, (long long)r.ne2,
                 (long long)r.rows, (long long)r.cols, n, (long long)per, (long long)cols);
    *out = (struct host_tensor){r.data, (enum dtype)r.dtype, rows, cols};
    return 0;
  }
  char *buf = NULL;
  size_t row_b = 0;
  for (int e = 0; e < n; e++) {
    struct host_tensor t;
    snprintf(sub, sizeof sub, spec->hf, e);
    snprintf(name, sizeof name, "model.layers.%d.%s", l, sub);
    if (take(mf, &t, name, per, cols, 0, 0) != 0)
      goto fail;
    if (e == 0) {
      row_b = dtype_row_bytes(t.dtype, cols);
      out->dtype = t.dtype;
      if (!(buf = malloc(row_b * (size_t)rows))) {
        ERR("%s: out of memory stacking the experts of '%s'", p->where, name);
        goto fail;
      }
    } else if (t.dtype != out->dtype) {
      ERR("%s: tensor '%s' is %s, expert 0's is %s (the experts must share a dtype)", p->where, name,
          dtype_name(t.dtype), dtype_name(out->dtype));
      goto fail;
    }
    memcpy(buf + row_b * (size_t)per * e, t.data, row_b * (size_t)per);
  }
  if (model_file_own(mf, buf) != 0)
    goto fail;
  out->data = buf;
  out->rows = rows;
  out->cols = cols;
  return 0;
fail:
  free(buf);
  memset(out, 0, sizeof *out);
  return -1;
}

/* Gemma's RMSNorm scales by (1 + w) and HF stores w: T becomes an owned f32 copy of 1 + w. */
static int norm_plus_one(struct model_file *mf, struct host_tensor *t) {
  int64_t n = t->rows * t->cols;
  float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!v)
    return ERR("out of memory");
  dtype_to_f32(v, t->data, t->dtype, n);
  for (int64_t i = 0; i < n; i++)
    v[i] += 1.0f;
  if (model_file_own(mf, v) != 0) {
    free(v);
    return -1;
  }
  t->data = v;
  t->dtype = DTYPE_F32;
  return 0;
}

/* Top-level tensors by format, then every layer's through layer_specs. lm_head (HF:
 * transformers drops it from tied checkpoints and ties when asked to even if one was stored;
 * GGUF: absent output.weight) falls back to the embedding. */
static int load_tensors(struct model_file *mf, int gguf) {
  const struct model_config *c = &mf->config;
  int64_t dim = c->dim;
  if (gguf) {
    if (take(mf, &mf->tok_embd, "token_embd.weight", c->vocab_size, dim, 0, 0) ||
        take(mf, &mf->out_norm, "output_norm.weight", 1, dim, 1, 0) ||
        take(mf, &mf->lm_head, "output.weight", c->vocab_size, dim, 0, 1) ||
        take(mf, &mf->rope_freqs, "rope_freqs.weight", 1, c->head_dim / 2, 1, 1))
      return -1;
  } else {
    if (take(mf, &mf->tok_embd, "model.embed_tokens.weight", c->vocab_size, dim, 0, 0) ||
        take(mf, &mf->out_norm, "model.norm.weight", 1, dim, 1, 0))
      return -1;
    if (!mf->config.tie_embeddings && take(mf, &mf->lm_head, "lm_head.weight", c->vocab_size, dim, 0, 1))
      return -1;
  }
  if (!mf->lm_head.data) {
    mf->lm_head = mf->tok_embd;
    mf->config.tie_embeddings = 1;
  }
  char n[160];
  const struct arch *a = arch_by_name(c->arch);
  if (!a)
    return ERR("%s: architecture %s has no tensor table", p_where(mf), c->arch);
  for (int i = 0; i < c->n_layers; i++)
    for (int s = 0; s < a->num_tensors; s++) {
      const struct arch_tensor *sp = &a->tensors[s];
      if (sp->need == AN_QKV_BIAS && !c->qkv_bias)
        continue;
      if (gguf)
        snprintf(n, sizeof n, "blk.%d.%s", i, sp->gguf);
      else
        snprintf(n, sizeof n, "model.layers.%d.%s", i, sp->hf);
      struct host_tensor *t = (struct host_tensor *)((char *)&mf->layers[i] + sp->host_off);
      if (sp->need == AN_EXPERTS) {
        if (take_experts(mf, t, sp, i, gguf, c->n_experts, dim_of(c, sp->rows), dim_of(c, sp->cols)))
          return -1;
        continue;
      }
      if (take(mf, t, n, dim_of(c, sp->rows), dim_of(c, sp->cols), sp->rows == AD_ONE, 0))
        return -1;
      if (c->norm_plus_one && sp->rows == AD_ONE && strstr(sp->hf, "norm") && norm_plus_one(mf, t))
        return -1;
    }
  if (c->norm_plus_one && norm_plus_one(mf, &mf->out_norm))
    return -1;
  return 0;
}

/* The KV-cache scales an FP8-calibrated HF checkpoint carries (vLLM's names): per layer, a scalar
 * self_attn.k_scale and self_attn.v_scale (llm-compressor), or k_proj.output_scale and
 * v_proj.output_scale (AutoFP8), or one self_attn.kv_scale for both (older exports). The cache
 * then holds e4m3(x / scale) and attention reads e4m3 * scale (docs/kv-cache.md). A checkpoint
 * either has them on every layer or on none; each must be a finite positive scalar (0-D or one
 * element) of a float dtype. GGUF has no such tensors. */
static int scale_of(struct model_file *mf, int layer, const char *const *names, float *out) {
  struct model_file_priv *p = mf->priv;
  char n[160];
  for (int k = 0; names[k]; k++) {
    struct raw_tensor r;
    snprintf(n, sizeof n, "model.layers.%d.%s", layer, names[k]);
    if (find_raw(p, n, &r) != 0)
      continue;
    int64_t count = r.num_dims == 0 ? 1 : r.rows * r.cols;
    if (r.extra != 1 || count != 1 || r.num_dims > 1 ||
        (r.dtype != DTYPE_F32 && r.dtype != DTYPE_F16 && r.dtype != DTYPE_BF16))
      return ERR("%s: tensor '%s' must be one F32, F16 or BF16 value (a KV-cache scale)", r.file, n);
    uint32_t raw = 0; /* the mapping promises no alignment */
    memcpy(&raw, r.data, r.dtype == DTYPE_F32 ? 4 : 2);
    dtype_to_f32(out, &raw, (enum dtype)r.dtype, 1);
    if (!(*out > 0.0f) || !isfinite(*out))
      return ERR("%s: tensor '%s' is %g; a KV-cache scale must be finite and > 0", r.file, n, (double)*out);
    return 1;
  }
  return 0;
}

static int load_kv_scales(struct model_file *mf) {
  static const char *const k_names[] = {"self_attn.k_scale", "self_attn.k_proj.output_scale", "self_attn.kv_scale", NULL};
  static const char *const v_names[] = {"self_attn.v_scale", "self_attn.v_proj.output_scale", "self_attn.kv_scale", NULL};
  int L = mf->config.n_layers;
  float kv[2];
  int rk = scale_of(mf, 0, k_names, &kv[0]), rv = rk < 0 ? -1 : scale_of(mf, 0, v_names, &kv[1]);
  if (rk < 0 || rv < 0)
    return -1;
  if (!rk && !rv)
    return 0;
  if (!(mf->kv_scales = malloc(sizeof *mf->kv_scales * 2 * (size_t)L)))
    return ERR("%s: out of memory", p_where(mf));
  for (int l = 0; l < L; l++)
    for (int j = 0; j < 2; j++) {
      int r = scale_of(mf, l, j ? v_names : k_names, &mf->kv_scales[2 * l + j]);
      if (r < 0)
        return -1;
      if (r == 0)
        return ERR("%s: layer %d has no %s KV-cache scale (model.layers.%d.%s), though the checkpoint has "
                   "KV-cache scales: it must have K's and V's on every layer, or none", p_where(mf), l,
                   j ? "v" : "k", l, j ? v_names[0] : k_names[0]);
    }
  return 0;
}

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, "%s/%s", dir, name);
  return s;
}

static int open_hf(struct model_file *mf, const char *dir) {
  struct model_file_priv *p = mf->priv;
  char *cfg = path_join(dir, "config.json");
  if (!cfg)
    return ERR("out of memory");
  if (!file_exists(cfg)) {
    ERR("%s: no config.json in the model directory", dir);
    free(cfg);
    return -1;
  }
  int rc = config_from_hf_file(&mf->config, cfg);
  free(cfg);
  if (rc)
    return -1;
  if (!(p->st = safetensors_set_open(dir)))
    return -1;
  p->where = p->st->index_path ? strdup(p->st->index_path) : strdup(p->st->files[0]->name);
  if (!p->where)
    return ERR("out of memory");
  return 0;
}

static int open_gguf(struct model_file *mf, const char *path) {
  struct model_file_priv *p = mf->priv;
  if (!(p->gguf = gguf_open(path)))
    return -1;
  if (!(p->where = strdup(path)))
    return ERR("out of memory");
  return config_from_gguf(&mf->config, p->gguf, path);
}

struct model_file *model_file_open(const char *path) {
  struct model_file *mf = calloc(1, sizeof *mf);
  struct model_file_priv *p = calloc(1, sizeof *p);
  if (!mf || !p) {
    free(mf);
    free(p);
    ERR("out of memory");
    return NULL;
  }
  mf->priv = p;
  int rc;
  if (file_is_dir(path)) {
    rc = open_hf(mf, path);
  } else if (file_exists(path)) {
    rc = open_gguf(mf, path);
  } else {
    rc = ERR("%s: no such model file or directory", path);
  }
  if (rc == 0) {
    mf->layers = calloc((size_t)mf->config.n_layers, sizeof *mf->layers);
    if (!mf->layers)
      rc = ERR("%s: out of memory", path);
  }
  if (rc == 0)
    rc = load_tensors(mf, p->gguf != NULL);
  if (rc == 0 && !p->gguf)
    rc = load_kv_scales(mf);
  if (rc) {
    model_file_close(mf);
    return NULL;
  }
  mf->config.weight_dtype = mf->layers[0].wo.dtype;
  return mf;
}

int model_file_own(struct model_file *mf, void *buf) {
  struct model_file_priv *p = mf->priv;
  void **nc = realloc(p->copies, sizeof *nc * (size_t)(p->num_copies + 1));
  if (!nc)
    return ERR("out of memory");
  p->copies = nc;
  p->copies[p->num_copies++] = buf;
  return 0;
}

void model_file_close(struct model_file *mf) {
  if (!mf)
    return;
  struct model_file_priv *p = mf->priv;
  if (p) {
    gguf_close(p->gguf);
    safetensors_set_close(p->st);
    for (int i = 0; i < p->num_copies; i++)
      free(p->copies[i]);
    free(p->copies);
    free(p->where);
    free(p);
  }
  free(mf->layers);
  free(mf->kv_scales);
  free(mf);
}
