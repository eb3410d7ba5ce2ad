/* test_tp_cpu.c - tensor parallelism on the CPU backend (ranks are threads; cpu_comm.c's
 * all_reduce_sum sums in rank order, gather_cols copies): every fixture model of tp_common.h's
 * list (llama family, mistral_sw, qwen3, phi3, gemma2, mixtral; HF directories and GGUF files)
 * split 2 and 4 ways against the unsplit model. All have 4 query heads (mistral 8) and 2 KV heads
 * (llama 4), ffn widths divisible by 4 and vocabulary 256, so 4 ranks take one query head each
 * and replicate the KV heads (two ranks per KV head, as vLLM), and the output head is
 * vocabulary-parallel (128 or 64 rows per rank, gathered to rank 0). f32 throughout, so only
 * the summation order of the all-reduces differs: rel L2 < 1e-5 (as test_model_fixtures;
 * measured 2e-7..4e-7, printed) and greedy tokens equal.
 * Also: llama (untied head) and llama3 (tied) cut to a vocabulary of 251, which 2 and 4 do not
 * divide, take the other path (rank 0 holds the whole head) with the same result; shapes that
 * do not divide are refused with a message naming --tp. Also: asynchronous steps are allowed on
 * a model that is not split, and not on rank 0 of a multi-process group (model_set_mirror). */
#include <unistd.h>

#include "c/tp_common.h"

#define TOL 1e-5
#define CUT_VOCAB 251

static int write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, n, f) == n;
  if (f && fclose(f))
    ok = 0;
  return ok ? 0 : -1;
}

/* Writes fixture NAME (config.json, model.safetensors, tokens.json) into DIR with the vocabulary
 * cut to V: the first V rows of embed_tokens and lm_head, vocab_size V, the tokens mod V. */
static int cut_vocab(const char *name, const char *dir, int V) {
  char src[1024], path[1200];
  snprintf(src, sizeof src, "%s", test_fixture_path(name));
  size_t n;
  snprintf(path, sizeof path, "%s/model.safetensors", src);
  unsigned char *st = (unsigned char *)test_read_file(path, &n);
  REQUIRE(st && n > 8, "read %s", path);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--)
    hl = hl << 8 | st[i];
  REQUIRE(8 + hl <= n, "%s: header length", path);
  char *hj = malloc(hl + 1);
  memcpy(hj, st + 8, hl);
  hj[hl] = 0;
  cJSON *h = cJSON_Parse(hj);
  free(hj);
  REQUIRE(h, "%s: header JSON", path);
  unsigned char *data = malloc(n), *base = st + 8 + hl;
  size_t at = 0;
  for (cJSON *t = h->child; t; t = t->next) {
    if (!strcmp(t->string, "__metadata__"))
      continue;
    cJSON *shape = cJSON_GetObjectItem(t, "shape"), *off = cJSON_GetObjectItem(t, "data_offsets");
    size_t b = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, e = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    size_t len = e - b;
    if (strstr(t->string, "embed_tokens") || strstr(t->string, "lm_head")) {
      size_t rows = (size_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
      len = len / rows * (size_t)V;
      cJSON_ReplaceItemInArray(shape, 0, cJSON_CreateNumber(V));
    }
    memcpy(data + at, base + b, len);
    cJSON_ReplaceItemInArray(off, 0, cJSON_CreateNumber((double)at));
    cJSON_ReplaceItemInArray(off, 1, cJSON_CreateNumber((double)(at + len)));
    at += len;
  }
  char *nh = cJSON_PrintUnformatted(h);
  size_t nl = strlen(nh), padded = (nl + 7) / 8 * 8;
  unsigned char *out = malloc(8 + padded + at);
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  memcpy(out + 8, nh, nl);
  memset(out + 8 + nl, ' ', padded - nl);
  memcpy(out + 8 + padded, data, at);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  int rc = write_file(path, out, 8 + padded + at);
  free(out);
  free(nh);
  free(data);
  free(st);
  cJSON_Delete(h);
  REQUIRE(rc == 0, "write %s", path);

  snprintf(path, sizeof path, "%s/config.json", src);
  char *cj = test_read_file(path, &n);
  cJSON *c = cj ? cJSON_Parse(cj) : NULL;
  free(cj);
  REQUIRE(c, "read %s", path);
  cJSON_ReplaceItemInObject(c, "vocab_size", cJSON_CreateNumber(V));
  char *ct = cJSON_Print(c);
  snprintf(path, sizeof path, "%s/config.json", dir);
  rc = write_file(path, ct, strlen(ct));
  free(ct);
  cJSON_Delete(c);
  REQUIRE(rc == 0, "write %s", path);

  int32_t tokens[256];
  int nt = tpc_tokens(src, tokens);
  REQUIRE(nt > 0, "%s: tokens.json", src);
  char tj[256 * 8] = "[", *p = tj + 1;
  for (int i = 0; i < nt; i++)
    p += sprintf(p, "%s%d", i ? "," : "", tokens[i] % V);
  strcpy(p, "]");
  snprintf(path, sizeof path, "%s/tokens.json", dir);
  REQUIRE(write_file(path, tj, strlen(tj)) == 0, "write %s", path);
  return 0;
}

static void rm_dir(const char *dir) {
  static const char *const files[] = {"model.safetensors", "config.json", "tokens.json"};
  char path[1200];
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
}

static int no_mirror(struct model *m, const struct step_msg *call, float *logits, void *user) {
  (void)m, (void)call, (void)logits, (void)user;
  return -1;
}

/* model_tp_async_ok: 1 for an unsplit model, 0 once it mirrors its calls to workers (rank 0 of a
 * multi-process group, whose workers take each step's ids from its message), 1 again after. */
static void test_async_ok(void) {
  struct backend *be = backend_cpu_create(1);
  struct model *m = be ? model_load(test_fixture_path("llama"), be) : NULL;
  CHECK(m != NULL, "load llama: %s", err_last());
  if (m) {
    CHECK(model_tp_async_ok(m) == 1, "an unsplit model refuses asynchronous steps");
    model_set_mirror(m, no_mirror, NULL);
    CHECK(model_tp_async_ok(m) == 0, "rank 0 of a multi-process group allows asynchronous steps");
    model_set_mirror(m, NULL, NULL);
    CHECK(model_tp_async_ok(m) == 1, "asynchronous steps stay refused after the mirror is gone");
    model_free(m);
  }
  if (be)
    be->ops->destroy(be);
}

int main(void) {
  if (!test_fixture_path("llama"))
    return test_skip("no tests/fixtures");
  static const int worlds[] = {2, 4};
  for (int i = 0; i < TPC_N_MODELS; i++)
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
      tpc_check_listed("cpu", i, worlds[w], TOL, 0);

  /* a vocabulary the ranks do not divide: rank 0 computes every logit */
  static const char *const cut[] = {"llama", "llama3"};
  for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) {
    char dir[] = "/tmp/pagoda_tp_vocabXXXXXX", label[64];
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(label, sizeof label, "%s cut to vocab %d", cut[i], CUT_VOCAB);
    if (cut_vocab(cut[i], dir, CUT_VOCAB) == 0)
      for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
        tpc_check_model("cpu", label, dir, dir, worlds[w], TOL, 0);
    rm_dir(dir);
  }

  /* refused: 3 does not divide 4 heads */
  struct tpc_run r = {0};
  int32_t tokens[256];
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", test_fixture_path("llama"));
  int n = tpc_tokens(dir, tokens);
  CHECK(tpc_run("cpu", dir, 3, tokens, n, &r) != 0 && strstr(err_last(), "--tp 3"),
        "llama at --tp 3 should be refused naming --tp 3: %s", err_last());
  tpc_free(&r);
  test_async_ok();
  return test_finish("test_tp_cpu");
}
