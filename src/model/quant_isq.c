/* quant_isq.c - in-situ quantization of a model's float weight matrices at load. */
#include "model/quant_isq.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "model/arch.h"
#include "util/log.h"
#include "util/quant.h"

int isq_parse(const char *s) {
  if (!s)
    return ERR("--isq: missing value");
  if (!strcasecmp(s, "4"))
    return DTYPE_Q4_K;
  if (!strcasecmp(s, "8"))
    return DTYPE_Q8_0;
  int t = dtype_from_name(s);
  if (t == DTYPE_Q4_0 || t == DTYPE_Q4_K || t == DTYPE_Q5_K || t == DTYPE_Q6_K || t == DTYPE_Q8_0)
    return t;
  return ERR("--isq must be q4_0, q4_k, q5_k, q6_k, q8_0, 4 (q4_k) or 8 (q8_0), got '%s'", s);
}

int isq_tensor_type(enum dtype t, int64_t cols, int output) {
  if (output && t != DTYPE_Q8_0)
    t = DTYPE_Q6_K;
  if (cols % dtype_block_size(t) != 0) {
    switch (t) {
    case DTYPE_Q4_K:
      t = DTYPE_Q5_0;
      break;
    case DTYPE_Q5_K:
      t = DTYPE_Q5_1;
      break;
    case DTYPE_Q6_K:
      t = DTYPE_Q8_0;
      break;
    default:
      break;
    }
  }
  return cols % dtype_block_size(t) == 0 ? (int)t : -1;
}

struct progress {
  size_t done, total; /* source bytes */
  int tty, last_pct;
  enum dtype t;
};

static void report(struct progress *pr) {
  int pct = pr->total ? (int)(100.0 * (double)pr->done / (double)pr->total) : 100;
  if (pr->tty) {
    fprintf(stderr, "\risq %s: %3d%%", dtype_name(pr->t), pct);
  } else if (pct / 25 > pr->last_pct / 25 || pct == 100) {
    fprintf(stderr, "isq %s: %d%%\n", dtype_name(pr->t), pct);
  }
  pr->last_pct = pct;
}

static int quantize(struct model_file *f, struct host_tensor *h, int qt, int num_threads,
                    struct progress *pr, size_t *out_bytes) {
  size_t src_bytes = dtype_row_bytes(h->dtype, h->cols) * (size_t)h->rows;
  if (qt < 0) { /* no block fits the rows: stays as it is */
    *out_bytes += src_bytes;
    pr->done += src_bytes;
    report(pr);
    return 0;
  }
  size_t rb = dtype_row_bytes((enum dtype)qt, h->cols), bytes = rb * (size_t)h->rows;
  char *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!buf || model_file_own(f, buf)) {
    free(buf);
    return ERR("isq: out of memory for %zu bytes", bytes);
  }
  const char *src = h->data;
  size_t sb = dtype_row_bytes(h->dtype, h->cols);
  int failed = 0;
#pragma omp parallel num_threads(num_threads > 0 ? num_threads : omp_get_max_threads())
  {
    float *row = malloc(sizeof(float) * (size_t)h->cols);
    if (!row) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < h->rows; r++)
      if (row) {
        dtype_to_f32(row, src + (size_t)r * sb, h->dtype, h->cols);
        quant_quantize_row(qt, row, buf + (size_t)r * rb, h->cols);
      }
    free(row);
  }
  if (failed)
    return ERR("isq: out of memory");
  h->data = buf;
  h->dtype = (enum dtype)qt;
  *out_bytes += bytes;
  pr->done += src_bytes;
  report(pr);
  return 0;
}

static int is_float_matrix(const struct host_tensor *h) {
  return h->data && h->rows > 1 && !dtype_is_quant(h->dtype);
}

int model_file_isq(struct model_file *f, enum dtype t, int num_threads) {
  struct progress pr = {0, 0, isatty(2), -1, t};
  const struct model_config *c = &f->config;
  int tied = f->lm_head.data == f->tok_embd.data;
  /* Everything that will be quantized, for the progress total. */
  const struct arch *a = arch_by_name(c->arch);
  if (!a)
    return ERR("isq: architecture %s has no tensor table", c->arch);
  struct host_tensor **all = malloc(sizeof *all * (2 + (size_t)a->num_tensors * c->n_layers));
  if (!all)
    return ERR("isq: out of memory");
  int n = 0;
  all[n++] = &f->tok_embd;
  if (!tied)
    all[n++] = &f->lm_head;
  for (int l = 0; l < c->n_layers; l++)
    for (int i = 0; i < a->num_tensors; i++)
      if (a->tensors[i].isq)
        all[n++] = (struct host_tensor *)((char *)&f->layers[l] + a->tensors[i].host_off);
  for (int i = 0; i < n; i++)
    if (is_float_matrix(all[i]))
      pr.total += dtype_row_bytes(all[i]->dtype, all[i]->cols) * (size_t)all[i]->rows;
  size_t out_bytes = 0;
  for (int i = 0; i < n; i++) {
    struct host_tensor *h = all[i];
    if (!is_float_matrix(h))
      continue;
    /* llama.cpp: the output head (the embeddings when tied) Q6_K; untied embeddings the type. */
    int output = h == &f->lm_head || (h == &f->tok_embd && tied);
    if (quantize(f, h, isq_tensor_type(t, h->cols, output), num_threads, &pr, &out_bytes)) {
      free(all);
      return -1;
    }
  }
  free(all);
  if (tied)
    f->lm_head = f->tok_embd;
  if (pr.tty)
    fputc('\n', stderr);
  f->config.weight_dtype = f->layers[0].wo.dtype;
  log_info("isq %s: %.1f MiB of float weights -> %.1f MiB", dtype_name(t),
           (double)pr.total / (1 << 20), (double)out_bytes / (1 << 20));
  return 0;
}
