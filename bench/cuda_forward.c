/* cuda_forward.c - throughput of the forward pass on CUDA for the end-to-end workload
 * (N prompts of I tokens, O output tokens each), driven straight through model_forward with the
 * batches a vLLM-style scheduler would form: prompt chunks up to a token budget, then all
 * sequences decoding together. It times what the model does per step (batch upload, forward,
 * logits download); sampling is left out (random weights: the token values do not matter).
 *
 * Afterwards a few more decode steps run with every op synchronised and timed, which prints
 * where a decode step's time goes (the synchronisation adds a little to each op).
 *
 * Usage: cuda_forward MODEL_DIR [num_prompts 256] [input_len 512] [output_len 256]
 *                     [block_size 32] [max_num_batched_tokens 8192]
 * Make MODEL_DIR with tools/make_dummy_model.py on the GPU machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "backend/backend.h"
#include "model/model.h"
#include "util/log.h"

/* ---- per-op timing: the backend's ops table wrapped, each call between two syncs ---- */
enum { P_EMBED, P_RMSNORM, P_MATMUL, P_LOGITS, P_ROPE, P_SILU, P_KV_WRITE, P_ATTN, P_GATHER, P_UPLOAD,
       P_DOWNLOAD, P_COUNT };
static const char *p_name[P_COUNT] = {"embed", "rmsnorm", "matmul (layers)", "matmul (lm_head)", "rope",
                                      "silu_mul", "kv_write", "attention", "gather_rows", "upload", "download"};
static const struct backend_ops *p_real;
static double p_time[P_COUNT];

#define P_BEGIN(be) double t0_ = (p_real->sync(be), bench_now())
#define P_END(be, k, rc)      \
  do {                        \
    p_real->sync(be);         \
    p_time[k] += bench_now() - t0_; \
    return rc;                \
  } while (0)

static int p_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T) {
  P_BEGIN(be);
  int rc = p_real->embed(be, out, emb, ids, T);
  P_END(be, P_EMBED, rc);
}
static int p_rmsnorm(struct backend *be, void *out, void *res, const void *x, const struct weight *w, int T,
                     int dim, float eps) {
  P_BEGIN(be);
  int rc = p_real->rmsnorm(be, out, res, x, w, T, dim, eps);
  P_END(be, P_RMSNORM, rc);
}
static int p_matmul(struct backend *be, void *out, const void *x, const struct weight *w, const struct weight *b,
                    int T, int f32) {
  P_BEGIN(be);
  int rc = p_real->matmul(be, out, x, w, b, T, f32);
  P_END(be, f32 ? P_LOGITS : P_MATMUL, rc);
}
static int p_rope(struct backend *be, void *q, void *k, const int32_t *pos, int T, int nh, int nkv, int hd,
                  const struct rope_params *rp) {
  P_BEGIN(be);
  int rc = p_real->rope(be, q, k, pos, T, nh, nkv, hd, rp);
  P_END(be, P_ROPE, rc);
}
static int p_silu(struct backend *be, void *out, const void *g, const void *u, int T, int F) {
  P_BEGIN(be);
  int rc = p_real->silu_mul(be, out, g, u, T, F);
  P_END(be, P_SILU, rc);
}
static int p_kv_write(struct backend *be, const struct kv_layer *kv, const void *k, const void *v,
                      const struct batch *b) {
  P_BEGIN(be);
  int rc = p_real->kv_write(be, kv, k, v, b);
  P_END(be, P_KV_WRITE, rc);
}
static int p_attn(struct backend *be, void *out, const void *q, const struct kv_layer *kv, const struct batch *b,
                  const struct attn_params *ap) {
  P_BEGIN(be);
  int rc = p_real->attention(be, out, q, kv, b, ap);
  P_END(be, P_ATTN, rc);
}
static int p_gather(struct backend *be, void *out, const void *x, const int32_t *idx, int n, int dim) {
  P_BEGIN(be);
  int rc = p_real->gather_rows(be, out, x, idx, n, dim);
  P_END(be, P_GATHER, rc);
}
static int p_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
  P_BEGIN(be);
  int rc = p_real->upload(be, dst, src, bytes);
  P_END(be, P_UPLOAD, rc);
}
static int p_download(struct backend *be, void *dst, const void *src, size_t bytes) {
  P_BEGIN(be);
  int rc = p_real->download(be, dst, src, bytes);
  P_END(be, P_DOWNLOAD, rc);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cuda_forward MODEL_DIR [num_prompts] [input_len] [output_len] [block_size] "
                    "[max_num_batched_tokens]\n");
    return 2;
  }
  const char *dir = argv[1];
  int N = argc > 2 ? atoi(argv[2]) : 256, I = argc > 3 ? atoi(argv[3]) : 512, O = argc > 4 ? atoi(argv[4]) : 256;
  int bs = argc > 5 ? atoi(argv[5]) : 32, budget = argc > 6 ? atoi(argv[6]) : 8192;
  if (N < 1 || I < 1 || O < 1 || budget < I) {
    fprintf(stderr, "cuda_forward: bad sizes (need budget >= input_len)\n");
    return 2;
  }
  struct backend_params bp = {.device = "cuda"};
  struct backend *be = backend_create(&bp);
  double t_load = bench_now();
  struct model *m = be ? model_load(dir, be) : NULL;
  if (!m) {
    fprintf(stderr, "%s\n", err_last_where());
    return 1;
  }
  t_load = bench_now() - t_load;
  const struct model_config *c = model_get_config(m);
  int max_blocks = (I + O + bs - 1) / bs;
  int num_blocks = 1 + N * max_blocks;
  size_t kv_bytes = (size_t)num_blocks * model_kv_block_bytes(c, bs, DTYPE_BF16);
  if (model_alloc_cache(m, num_blocks, bs, DTYPE_BF16, budget, N, max_blocks) != 0) {
    fprintf(stderr, "%s\n", err_last_where());
    return 1;
  }
  int max_t = budget > N ? budget : N;
  int32_t *ids = malloc(sizeof(int32_t) * max_t), *pos = malloc(sizeof(int32_t) * max_t),
          *slots = malloc(sizeof(int32_t) * max_t), *qs = malloc(sizeof(int32_t) * (N + 1)),
          *lens = malloc(sizeof(int32_t) * N), *lidx = malloc(sizeof(int32_t) * N),
          *tables = malloc(sizeof(int32_t) * (size_t)N * max_blocks);
  float *logits = malloc(sizeof(float) * (size_t)N * c->vocab_size);
  for (int s = 0; s < N; s++)
    for (int j = 0; j < max_blocks; j++)
      tables[(size_t)s * max_blocks + j] = 1 + s * max_blocks + j;
  uint64_t r = 88172645463325252ull;
  /* prefill: whole prompts packed into steps of at most `budget` tokens */
  int steps_p = 0;
  double t0 = bench_now();
  for (int s0 = 0; s0 < N;) {
    int B = 0, T = 0;
    while (s0 + B < N && T + I <= budget) {
      int s = s0 + B;
      qs[B] = T;
      for (int i = 0; i < I; i++, T++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        ids[T] = (int32_t)(r % (uint64_t)c->vocab_size);
        pos[T] = i;
        slots[T] = tables[(size_t)s * max_blocks + i / bs] * bs + i % bs;
      }
      lens[B] = I;
      lidx[B] = T - 1;
      B++;
    }
    qs[B] = T;
    struct batch b = {T, B, max_blocks, I, I, ids, pos, slots, qs, lens, tables + (size_t)s0 * max_blocks, B, lidx};
    if (model_forward(m, &b, logits) != 0) {
      fprintf(stderr, "prefill: %s\n", err_last_where());
      return 1;
    }
    s0 += B;
    steps_p++;
  }
  double t_prefill = bench_now() - t0;
  /* decode: every sequence one token per step (the first output token came from the prefill) */
  t0 = bench_now();
  for (int g = 1; g < O; g++) {
    int p = I + g - 1;
    for (int s = 0; s < N; s++) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      ids[s] = (int32_t)(r % (uint64_t)c->vocab_size);
      pos[s] = p;
      slots[s] = tables[(size_t)s * max_blocks + p / bs] * bs + p % bs;
      qs[s] = s;
      lens[s] = p + 1;
      lidx[s] = s;
    }
    qs[N] = N;
    struct batch b = {N, N, max_blocks, p + 1, 1, ids, pos, slots, qs, lens, tables, N, lidx};
    if (model_forward(m, &b, logits) != 0) {
      fprintf(stderr, "decode: %s\n", err_last_where());
      return 1;
    }
  }
  double t_decode = bench_now() - t0;
  /* where a decode step's time goes: a few more steps with every op timed on its own */
  static struct backend_ops timed;
  p_real = be->ops;
  timed = *be->ops;
  timed.embed = p_embed, timed.rmsnorm = p_rmsnorm, timed.matmul = p_matmul, timed.rope = p_rope;
  timed.silu_mul = p_silu, timed.kv_write = p_kv_write, timed.attention = p_attn, timed.gather_rows = p_gather;
  timed.upload = p_upload, timed.download = p_download;
  be->ops = &timed;
  int prof_steps = 8, p = I + O - 1 - prof_steps; /* rewrite the last positions: same context lengths */
  double t_prof = bench_now();
  for (int g = 0; g < prof_steps; g++, p++) {
    for (int s = 0; s < N; s++) {
      ids[s] = (int32_t)(s % c->vocab_size);
      pos[s] = p;
      slots[s] = tables[(size_t)s * max_blocks + p / bs] * bs + p % bs;
      qs[s] = s;
      lens[s] = p + 1;
      lidx[s] = s;
    }
    qs[N] = N;
    struct batch b = {N, N, max_blocks, p + 1, 1, ids, pos, slots, qs, lens, tables, N, lidx};
    if (model_forward(m, &b, logits) != 0) {
      fprintf(stderr, "profile: %s\n", err_last_where());
      return 1;
    }
  }
  t_prof = bench_now() - t_prof;
  be->ops = p_real;
  int bad = 0;
  for (size_t i = 0; i < (size_t)N * c->vocab_size; i++)
    bad += logits[i] != logits[i];
  double total = t_prefill + t_decode;
  printf("cuda_forward: %s, %d layers, dim %d, vocab %d; %d prompts x %d input + %d output tokens, "
         "block size %d, %d-token steps; weights loaded in %.1f s; KV pool %.2f GiB\n",
         dir, c->n_layers, c->dim, c->vocab_size, N, I, O, bs, budget, t_load, kv_bytes / 1073741824.0);
  printf("prefill: %d steps, %.3f s, %.0f input tokens/s\n", steps_p, t_prefill, (double)N * I / t_prefill);
  printf("decode: %d steps of %d sequences, %.3f s, %.2f ms/step, %.0f output tokens/s\n", O - 1, N, t_decode,
         t_decode / (O - 1) * 1e3, (double)N * (O - 1) / t_decode);
  printf("total: %.3f s, %.2f requests/s, %.0f output tokens/s (incl. prefill), NaN logits in last step: %d\n",
         total, N / total, (double)N * O / total, bad);
  printf("decode step, each op synchronised (%d steps of %d sequences at context ~%d, %.2f ms/step):\n",
         prof_steps, N, I + O, t_prof / prof_steps * 1e3);
  double tot_ops = 0;
  for (int k = 0; k < P_COUNT; k++)
    tot_ops += p_time[k];
  for (int k = 0; k < P_COUNT; k++)
    printf("  %-18s %8.3f ms/step  %5.1f%%\n", p_name[k], p_time[k] / prof_steps * 1e3, 100 * p_time[k] / tot_ops);
  model_free(m);
  be->ops->destroy(be);
  free(ids);
  free(pos);
  free(slots);
  free(qs);
  free(lens);
  free(lidx);
  free(tables);
  free(logits);
  return bad ? 1 : 0;
}
