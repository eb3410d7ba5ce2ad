/* tp_common.h - the tensor-parallel check shared by tests/c/test_tp_cpu.c (cpu: ranks are threads of
 * the CPU backend, whose all_reduce_sum is the reference) and tests/gpu/test_tp_cuda.c (cuda + NCCL):
 * a fixture's prompt through the model split over WORLD ranks, then greedy decode steps, against
 * the same model unsplit (world 1). */
#ifndef PAGODA_TP_COMMON_H
#define PAGODA_TP_COMMON_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dist/tp.h"
#include "model/model.h"
#include "test_util.h"
#include "util/log.h"

#define TPC_MAXB 16
#define TPC_STEPS 8

struct tpc_run {
  int n, vocab;
  int vocab_split;           /* model_tp_vocab_split */
  float *logits;             /* (n, vocab) the prompt's logits */
  int32_t greedy[TPC_STEPS]; /* tokens of greedy decoding after it */
  float *step_logits;        /* (TPC_STEPS, vocab) the decode steps' logits */
};

static int tpc_make_be(int r, void *ctx) {
  struct backend **bes = ((struct backend ***)ctx)[0];
  const char *dev = ((const char **)ctx)[1];
  struct backend_params bp = {dev, 1, r};
  if (!(bes[r] = backend_create(&bp)))
    return -1;
  return 0;
}

static int tpc_free_be(int r, void *ctx) {
  struct backend **bes = ctx;
  if (bes[r])
    bes[r]->ops->destroy(bes[r]);
  return 0;
}

static int tpc_argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b])
      b = i;
  return b;
}

/* Runs PATH over WORLD ranks of DEVICE; 0 or -1 with the reason printed. FORCED (TPC_STEPS ids)
 * or NULL: the decode steps' inputs instead of the run's own greedy picks (so that two runs whose
 * picks differ on a near-tie still score the same inputs). */
static int tpc_run_forced(const char *device, const char *path, int world, const int32_t *tokens, int n,
                          const int32_t *forced, struct tpc_run *out) {
  struct backend *bes[TP_MAX_WORLD] = {0};
  struct tp_group *g = tp_group_create(world);
  if (!g) {
    fprintf(stderr, "tp_group_create: %s\n", err_last_where());
    return -1;
  }
  void *ctx[2] = {bes, (void *)device};
  int rc = -1;
  struct model *m = NULL;
  if (tp_group_run(g, tpc_make_be, ctx)) {
    fprintf(stderr, "backends: %s\n", err_last_where());
    goto done;
  }
  if (!(m = model_load_tp(path, bes, g, NULL))) {
    fprintf(stderr, "model_load_tp(%s, %d): %s\n", path, world, err_last_where());
    goto done;
  }
  int V = model_get_config(m)->vocab_size, bs = 16;
  out->n = n;
  out->vocab = V;
  out->vocab_split = model_tp_vocab_split(m);
  out->logits = malloc(sizeof(float) * (size_t)n * V);
  out->step_logits = malloc(sizeof(float) * (size_t)TPC_STEPS * V);
  if (model_alloc_cache(m, TPC_MAXB + 1, bs, bes[0]->caps.kv_auto, 256, 1, TPC_MAXB)) {
    fprintf(stderr, "model_alloc_cache: %s\n", err_last_where());
    goto done;
  }
  int32_t table[TPC_MAXB], pos[256], slots[256], lidx[256], qs[2] = {0, n}, len = n, ids[1];
  for (int i = 0; i < TPC_MAXB; i++)
    table[i] = TPC_MAXB - i;
  for (int i = 0; i < n; i++) {
    pos[i] = i;
    slots[i] = table[i / bs] * bs + i % bs;
    lidx[i] = i;
  }
  struct batch b = {n, 1, TPC_MAXB, len, n, tokens, pos, slots, qs, &len, table, n, lidx};
  if (model_forward(m, &b, out->logits)) {
    fprintf(stderr, "prefill: %s\n", err_last_where());
    goto done;
  }
  ids[0] = tpc_argmax(out->logits + (size_t)(n - 1) * V, V);
  for (int s = 0; s < TPC_STEPS; s++) {
    int p = n + s;
    out->greedy[s] = ids[0];
    if (forced)
      ids[0] = forced[s];
    pos[0] = p;
    slots[0] = table[p / bs] * bs + p % bs;
    lidx[0] = 0;
    qs[1] = 1;
    len = p + 1;
    struct batch d = {1, 1, TPC_MAXB, len, 1, ids, pos, slots, qs, &len, table, 1, lidx};
    /* a padded decode batch (one token per sequence, the model's block bound): on cuda the graph
     * of B = 1 runs directly, is captured (every rank its own, all-reduces inside), then replayed */
    if (model_forward_graph(m, &d, out->step_logits + (size_t)s * V)) {
      fprintf(stderr, "decode step %d: %s\n", s, err_last_where());
      goto done;
    }
    ids[0] = tpc_argmax(out->step_logits + (size_t)s * V, V);
  }
  rc = 0;
done:
  model_free(m);
  tp_group_run(g, tpc_free_be, bes);
  tp_group_destroy(g);
  return rc;
}

static int tpc_run(const char *device, const char *path, int world, const int32_t *tokens, int n,
                   struct tpc_run *out) {
  return tpc_run_forced(device, path, world, tokens, n, NULL, out);
}

static void tpc_free(struct tpc_run *r) {
  free(r->logits);
  free(r->step_logits);
  memset(r, 0, sizeof *r);
}

/* tokens.json of fixture DIR into TOKENS (at most 256); the count, or -1. */
static int tpc_tokens(const char *dir, int32_t *tokens) {
  char path[1100];
  snprintf(path, sizeof path, "%.1024s/tokens.json", dir);
  size_t len;
  char *json = test_read_file(path, &len);
  if (!json)
    return -1;
  cJSON *arr = cJSON_Parse(json);
  free(json);
  int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
  if (n > 256)
    n = -1;
  for (int i = 0; i < n; i++)
    tokens[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
  cJSON_Delete(arr);
  return n;
}

/* The model at PATH (a fixture directory or file), fed the tokens.json of fixture directory
 * TOKENS_DIR (its first MAX_N tokens when MAX_N > 0), at WORLD ranks against world 1: logits
 * within TOL (rel L2), greedy tokens equal. LABEL names it in messages. CHECKs; returns 0. */
static int tpc_check_model(const char *device, const char *label, const char *path, const char *tokens_dir,
                           int world, double tol, int max_n) {
  int32_t tokens[256];
  int n = tpc_tokens(tokens_dir, tokens);
  REQUIRE(n > 0, "%s: no tokens.json in %s", label, tokens_dir);
  if (max_n > 0 && n > max_n)
    n = max_n;
  struct tpc_run one = {0}, many = {0};
  int ok1 = tpc_run(device, path, 1, tokens, n, &one) == 0;
  int okn = ok1 && tpc_run(device, path, world, tokens, n, &many) == 0;
  CHECK(ok1 && okn, "%s: tp 1 ran %d, tp %d ran %d", label, ok1, world, okn);
  if (ok1 && okn) {
    double e = test_rel_l2(many.logits, one.logits, (size_t)n * one.vocab);
    double es = test_rel_l2(many.step_logits, one.step_logits, (size_t)TPC_STEPS * one.vocab);
    CHECK(e < tol && es < tol, "%s: tp %d vs tp 1 on %s: prompt rel L2 %g, decode rel L2 %g (tol %g)", label,
          world, device, e, es, tol);
    CHECK(!memcmp(many.greedy, one.greedy, sizeof one.greedy), "%s: tp %d greedy tokens differ from tp 1", label,
          world);
    /* the output head is split by vocabulary rows whenever world divides the vocabulary */
    int split = one.vocab % world ? 0 : one.vocab / world;
    CHECK(one.vocab_split == 0 && many.vocab_split == split, "%s: tp %d: %d vocabulary rows per rank, expected %d",
          label, world, many.vocab_split, split);
    printf("%s: tp %d vs tp 1 on %s (%s output head): prompt rel L2 %.3g, decode rel L2 %.3g, %d greedy tokens "
           "equal\n", label, world, device, split ? "vocabulary-parallel" : "rank 0's whole", e, es, TPC_STEPS);
  }
  tpc_free(&one);
  tpc_free(&many);
  return 0;
}

/* Every fixture model, HF directories and GGUF files (llama.cpp's layouts), with the directory
 * whose tokens.json feeds it: the list test_tp_cpu and test_tp_cuda both run. */
static const struct {
  const char *name, *tokens; /* tests/fixtures/NAME; tokens.json of tests/fixtures/TOKENS */
} tpc_models[] = {
    {"llama", "llama"},           {"llama3", "llama3"},           {"llama_hd", "llama_hd"},
    {"llama_bf16", "llama_bf16"}, {"llama_sharded", "llama_sharded"}, {"mistral", "mistral"},
    {"mistral_sw", "mistral_sw"}, {"qwen2", "qwen2"},             {"qwen3", "qwen3"},
    {"qwen3/model.gguf", "qwen3"}, {"phi3", "phi3"},               {"phi3/model.gguf", "phi3"},
    {"gemma2", "gemma2"},         {"gemma2.gguf", "gemma2"},      {"mixtral", "mixtral"},
    {"mixtral.gguf", "mixtral"},
};
#define TPC_N_MODELS ((int)(sizeof tpc_models / sizeof tpc_models[0]))

/* tpc_models[i] at WORLD ranks against world 1 (the first MAX_N prompt tokens when > 0). */
static int tpc_check_listed(const char *device, int i, int world, double tol, int max_n) {
  char path[1024], tdir[1024];
  const char *p = test_fixture_path(tpc_models[i].name); /* a static buffer: copied before the next */
  REQUIRE(p, "fixture %s not found", tpc_models[i].name);
  snprintf(path, sizeof path, "%s", p);
  const char *t = test_fixture_path(tpc_models[i].tokens);
  REQUIRE(t, "fixture %s not found", tpc_models[i].tokens);
  snprintf(tdir, sizeof tdir, "%s", t);
  return tpc_check_model(device, tpc_models[i].name, path, tdir, world, tol, max_n);
}

#endif
