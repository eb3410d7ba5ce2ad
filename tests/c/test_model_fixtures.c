/* test_model_fixtures.c - pagoda's logits for every position against transformers' (tests/fixtures).
 *
 * Each fixture directory (tools/make_fixtures.py) holds a tiny random-weight model saved by
 * transformers, tokens.json and logits.bin (float32, (n_tokens, vocab)) computed by transformers in
 * float32. Tolerance: relative L2 < 1e-5, for the bf16 fixture too. Both sides compute in f32
 * from the same weights (for the bf16 fixture transformers' reference is the saved bf16 weights
 * upcast to f32, which is exactly what the CPU matmul does), so the gap is only f32 rounding in
 * different summation orders: measured 4e-7..7e-7 on every fixture, with the AVX2 kernels and with
 * the scalar fallback (sanitizer build). 1e-5 leaves >10x room for that, while errors in any op
 * are far above it (e.g. dropping llama3's smoothed band gives 4e-2, a wrong RoPE pairing ~1).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "test_util.h"
#include "util/file.h"
#include "util/log.h"

#define TOL 1e-5
#define MAXB 16

/* A + "/" + B, malloc'd. */
static char *join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *p = malloc(la + lb + 2);
  memcpy(p, a, la);
  p[la] = '/';
  memcpy(p + la + 1, b, lb + 1);
  return p;
}

/* Runs TOKENS (n) through the model in chunks of CHUNK tokens with block size BS; LOGITS gets
 * (n, vocab). */
static int run_chunks(struct model *m, const int32_t *tokens, int n, int bs, int chunk, float *logits) {
  int V = model_get_config(m)->vocab_size;
  int32_t table[MAXB], pos[256], slots[256], lidx[256], qs[2], len;
  for (int i = 0; i < MAXB; i++)
    table[i] = MAXB - i; /* physical blocks in reverse order */
  for (int t0 = 0; t0 < n; t0 += chunk) {
    int T = n - t0 < chunk ? n - t0 : chunk;
    for (int i = 0; i < T; i++) {
      int p = t0 + i;
      pos[i] = p;
      slots[i] = table[p / bs] * bs + p % bs;
      lidx[i] = i;
    }
    qs[0] = 0;
    qs[1] = T;
    len = t0 + T;
    struct batch b = {T, 1, MAXB, len, T, tokens + t0, pos, slots, qs, &len, table, T, lidx};
    if (model_forward(m, &b, logits + (size_t)t0 * V) != 0)
      return -1;
  }
  return 0;
}

/* MODEL_PATH: DIR itself (the safetensors) or DIR/model.gguf (the same weights converted). */
static int check_fixture(struct backend *be, const char *dir, const char *name, const char *model_path) {
  char *path = join(dir, "tokens.json");
  size_t len;
  char *json = test_read_file(path, &len);
  free(path);
  REQUIRE(json, "%s: cannot read tokens.json", name);
  cJSON *arr = cJSON_Parse(json);
  free(json);
  REQUIRE(cJSON_IsArray(arr), "%s: tokens.json is not a list", name);
  int n = cJSON_GetArraySize(arr);
  int32_t tokens[256];
  REQUIRE(n > 0 && n <= 256, "%s: %d tokens", name, n);
  for (int i = 0; i < n; i++)
    tokens[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
  cJSON_Delete(arr);

  struct model *m = model_load(model_path, be);
  REQUIRE(m, "%s: model_load: %s", name, err_last_where());
  const struct model_config *c = model_get_config(m);
  int V = c->vocab_size;
  path = join(dir, "logits.bin");
  float *want = (float *)test_read_file(path, &len);
  free(path);
  CHECK(want && len == (size_t)n * V * sizeof(float), "%s: logits.bin has %zu bytes, want %d x %d floats",
        name, want ? len : 0, n, V);
  float *got = malloc(sizeof(float) * (size_t)n * V);
  if (want && len == (size_t)n * V * sizeof(float)) {
    /* one prefill (block size 16), then chunks of 5 over the cached prefix (block size 8), then
     * one token at a time (block size 32): all three must match transformers. Fixtures with
     * logits_step.bin hold transformers' one-token-at-a-time logits for the last: they differ
     * from logits.bin under LongRoPE, whose factors follow the sequence's length at each step
     * (short while it is at most original_max_position_embeddings); chunks of 5 then match
     * neither, and are skipped for longrope models whose tokens cross that length. */
    const int bss[3] = {16, 8, 32}, chunks[3] = {256, 5, 1};
    path = join(dir, "logits_step.bin");
    size_t step_len = 0;
    float *want_step = (float *)test_read_file(path, &step_len);
    free(path);
    CHECK(!want_step || step_len == (size_t)n * V * sizeof(float), "%s: logits_step.bin has %zu bytes",
          name, step_len);
    int crosses = c->rope_scaling == ROPE_SCALING_LONGROPE && n > c->rope_orig_max_pos;
    for (int k = 0; k < 3; k++) {
      const float *ref = k == 2 && want_step && step_len == len ? want_step : want;
      if (crosses && k == 1)
        continue;
      if (model_alloc_cache(m, MAXB + 1, bss[k], DTYPE_F32, 256, 1, MAXB) != 0 ||
          run_chunks(m, tokens, n, bss[k], chunks[k], got) != 0) {
        CHECK(0, "%s: %s", name, err_last_where());
        break;
      }
      double e = test_rel_l2(got, ref, (size_t)n * V);
      CHECK(e < TOL, "%s (%s, %s weights), block size %d, chunks of %d: rel L2 %g", name, c->arch,
            dtype_name(c->weight_dtype), bss[k], chunks[k], e);
      if (crosses && k == 2) /* the two references differ: the wrong one must fail */
        CHECK(test_rel_l2(got, want, (size_t)n * V) > 100 * TOL,
              "%s: one token at a time should not match the one-prompt logits", name);
      if (k == 0)
        printf("%s: %s, %s weights, %d tokens: rel L2 vs transformers %.3g\n", name, c->arch,
               dtype_name(c->weight_dtype), n, e);
    }
    free(want_step);
  }
  free(got);
  free(want);
  model_free(m);
  return 0;
}

int main(void) {
  const char *root = test_fixture_path("");
  DIR *d = opendir(root);
  if (!d)
    return test_skip("no tests/fixtures directory");
  struct backend *be = backend_cpu_create(2);
  REQUIRE(be, "backend: %s", err_last());
  int found = 0;
  struct dirent *e;
  char names[64][256];
  int n_names = 0;
  while ((e = readdir(d)) && n_names < 64)
    if (e->d_name[0] != '.')
      snprintf(names[n_names++], sizeof names[0], "%s", e->d_name);
  closedir(d);
  for (int i = 0; i < n_names; i++) {
    char *dir = join(root, names[i]), *probe = join(dir, "logits.bin");
    FILE *f = fopen(probe, "rb");
    if (f) {
      fclose(f);
      found++;
      check_fixture(be, dir, names[i], dir);
      char *gguf = join(dir, "model.gguf");
      FILE *g = fopen(gguf, "rb");
      if (g) { /* its GGUF conversion (tools/make_fixtures.py) must give the same logits */
        fclose(g);
        char label[300];
        snprintf(label, sizeof label, "%s (gguf)", names[i]);
        check_fixture(be, dir, label, gguf);
      }
      free(gguf);
    }
    free(dir);
    free(probe);
  }
  be->ops->destroy(be);
  if (!found)
    return test_skip("tests/fixtures holds no fixture (a directory with logits.bin)");
  return test_finish("test_model_fixtures");
}
