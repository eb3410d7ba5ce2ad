/* test_model_archops.c - Gemma 2 and Mixtral against transformers beyond the logits of
 * test_model_fixtures.c (which covers their HF directories):
 * - the GGUF conversions (tests/fixtures/NAME.gguf, written by tools/make_fixtures.py with
 *   gguf-py in llama.cpp's layout: Gemma 2's norms stored as 1 + w, Mixtral as GGUF "llama" with
 *   permuted Q/K and stacked ffn_*_exps) give transformers' logits, rel L2 < 1e-5;
 * - greedy decoding, one token per step through the paged cache, equals transformers' greedy
 *   continuation (greedy.json: 12 prompt tokens, 28 new ones: positions up to 39, five times
 *   Gemma 2's window of 8), from both the HF directory and the GGUF file.
 * Tolerance as in test_model_fixtures.c: both sides compute in f32 from the same weights. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "test_util.h"
#include "util/log.h"

#define TOL 1e-5
#define MAXB 16
#define BS 8

static int read_ids(const cJSON *arr, int32_t *out, int cap) {
  int n = cJSON_GetArraySize(arr);
  if (!cJSON_IsArray(arr) || n > cap)
    return -1;
  for (int i = 0; i < n; i++)
    out[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
  return n;
}

/* Runs tokens[t0, t0 + T) of one sequence (positions t0..), the cache holding tokens[0, t0);
 * LOGITS gets (T, vocab). */
static int step(struct model *m, const int32_t *tokens, int t0, int T, float *logits) {
  int32_t table[MAXB], pos[128], slots[128], lidx[128], qs[2] = {0, T}, len = t0 + T;
  for (int i = 0; i < MAXB; i++)
    table[i] = MAXB - i; /* physical blocks in reverse order */
  for (int i = 0; i < T; i++) {
    pos[i] = t0 + i;
    slots[i] = table[(t0 + i) / BS] * BS + (t0 + i) % BS;
    lidx[i] = i;
  }
  struct batch b = {T, 1, MAXB, len, T, tokens + t0, pos, slots, qs, &len, table, T, lidx};
  return model_forward(m, &b, logits);
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}

static void check_model(struct backend *be, const char *name, const char *path, const int32_t *tokens, int n,
                        const float *want, const int32_t *prompt, int n_prompt, const int32_t *greedy,
                        int n_greedy) {
  struct model *m = model_load(path, be);
  if (!m) {
    CHECK(0, "%s: model_load: %s", path, err_last_where());
    return;
  }
  int V = model_get_config(m)->vocab_size;
  float *got = malloc(sizeof(float) * (size_t)n * V);
  if (!want) { /* the HF directory: every tensor counted once (f32 on the CPU, as stored) */
    char st[600];
    snprintf(st, sizeof st, "%s/model.safetensors", path);
    size_t flen = 0;
    unsigned char *file = (unsigned char *)test_read_file(st, &flen);
    uint64_t hlen = 0;
    for (int i = 7; file && flen >= 8 && i >= 0; i--)
      hlen = hlen << 8 | file[i];
    CHECK(file && model_weight_bytes(m) == flen - 8 - hlen, "%s: model_weight_bytes %zu, tensors %zu bytes",
          path, model_weight_bytes(m), file ? (size_t)(flen - 8 - hlen) : 0);
    free(file);
  }
  if (model_alloc_cache(m, MAXB + 1, BS, DTYPE_F32, 128, 1, MAXB) != 0) {
    CHECK(0, "%s: %s", path, err_last_where());
    goto out;
  }
  if (want) {
    CHECK(step(m, tokens, 0, n, got) == 0, "%s: forward: %s", path, err_last_where());
    double e = test_rel_l2(got, want, (size_t)n * V);
    CHECK(e < TOL, "%s: rel L2 vs transformers %g", path, e);
    printf("%s (%s): %d tokens, rel L2 vs transformers %.3g\n", name, path, n, e);
  }
  /* greedy: prefill the prompt, then one token per step */
  int32_t seq[128];
  memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
  int len = n_prompt, same = 0;
  if (step(m, seq, 0, n_prompt, got) != 0) {
    CHECK(0, "%s: prefill: %s", path, err_last_where());
    goto out;
  }
  seq[len] = argmax(got + (size_t)(n_prompt - 1) * V, V);
  for (int i = 0; i < n_greedy; i++) {
    same += seq[len] == greedy[i];
    CHECK(seq[len] == greedy[i], "%s: greedy token %d (position %d) is %d, transformers %d", path, i, len,
          seq[len], greedy[i]);
    if (seq[len] != greedy[i] || i + 1 == n_greedy)
      break;
    len++;
    if (step(m, seq, len - 1, 1, got) != 0) {
      CHECK(0, "%s: decode: %s", path, err_last_where());
      break;
    }
    seq[len] = argmax(got, V);
  }
  printf("%s (%s): greedy %d/%d tokens equal to transformers'\n", name, path, same, n_greedy);
out:
  free(got);
  model_free(m);
}

/* --isq q8_0 (experts and projections quantized at load, the stacked experts as one matrix):
 * logits within 2e-2 rel L2 of transformers' f32 ones per 2 layers (test_isq.c's bound for q8_0
 * on 2-layer models; the rounding errors of more layers add up: gemma2 has 4, measured 2.2e-2,
 * mixtral 2, 1.7e-2). A MoE
 * near-tie may route differently, so Mixtral is compared before its first router gap < 0.05
 * (router_gaps.json: position 10). */
static void check_isq(struct backend *be, const char *name, const char *path, const int32_t *toks, int n,
                      const float *want, int n_cmp) {
  struct model *m = model_load_isq(path, be, "q8_0");
  if (!m) {
    CHECK(0, "%s --isq q8_0: %s", path, err_last_where());
    return;
  }
  int V = model_get_config(m)->vocab_size;
  float *got = malloc(sizeof(float) * (size_t)n * V);
  if (model_alloc_cache(m, MAXB + 1, BS, DTYPE_F32, 128, 1, MAXB) != 0 || step(m, toks, 0, n, got) != 0) {
    CHECK(0, "%s --isq q8_0: %s", path, err_last_where());
  } else {
    /* 3e-2 per 2 layers: q8_0 weights times 8-bit activations, as llama.cpp and test_isq */
    double e = test_rel_l2(got, want, (size_t)n_cmp * V), tol = 3e-2 * model_get_config(m)->n_layers / 2;
    CHECK(e < tol && e > 1e-5, "%s --isq q8_0: rel L2 %g over %d positions (tol %g)", path, e, n_cmp, tol);
    printf("%s --isq q8_0: rel L2 vs transformers %.3g over positions 0..%d\n", name, e, n_cmp - 1);
  }
  free(got);
  model_free(m);
}

static char *fixture_file(const char *name, const char *file) {
  char rel[256];
  snprintf(rel, sizeof rel, "%s%s", name, file);
  return strdup(test_fixture_path(rel));
}

static void check_fixture(struct backend *be, const char *name) {
  char *dir = fixture_file(name, ""), *gguf = fixture_file(name, ".gguf");
  char *tok_p = fixture_file(name, "/tokens.json"), *log_p = fixture_file(name, "/logits.bin"),
       *gr_p = fixture_file(name, "/greedy.json");
  size_t len = 0, llen = 0;
  char *tj = test_read_file(tok_p, &len), *gj = test_read_file(gr_p, &len);
  float *want = (float *)test_read_file(log_p, &llen);
  cJSON *tokens = tj ? cJSON_Parse(tj) : NULL, *greedy = gj ? cJSON_Parse(gj) : NULL;
  int32_t toks[128], prompt[128], gr[128];
  int n = tokens ? read_ids(tokens, toks, 128) : -1;
  int np = greedy ? read_ids(cJSON_GetObjectItem(cJSON_GetArrayItem(greedy, 0), "prompt"), prompt, 64) : -1;
  int ng = greedy ? read_ids(cJSON_GetObjectItem(cJSON_GetArrayItem(greedy, 0), "output"), gr, 64) : -1;
  CHECK(n > 0 && np > 0 && ng > 0 && want && llen == (size_t)n * 256 * sizeof(float),
        "%s: fixture files (tokens %d, prompt %d, greedy %d, logits %zu bytes)", name, n, np, ng, llen);
  if (n > 0 && np > 0 && ng > 0 && want) {
    check_model(be, name, dir, toks, n, NULL, prompt, np, gr, ng); /* its logits: test_model_fixtures */
    check_model(be, name, gguf, toks, n, want, prompt, np, gr, ng);
    check_isq(be, name, dir, toks, n, want, strcmp(name, "mixtral") ? n : 10);
  }
  cJSON_Delete(tokens);
  cJSON_Delete(greedy);
  free(tj), free(gj), free(want), free(dir), free(gguf), free(tok_p), free(log_p), free(gr_p);
}

/* The fixture's config.json with KEY set to the JSON VALUE; 0 or -1 from config_from_hf_json. */
static int parse_with(struct model_config *c, const char *name, const char *key, const char *value) {
  char *path = fixture_file(name, "/config.json");
  size_t len = 0;
  char *text = test_read_file(path, &len);
  free(path);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  free(text);
  if (!j)
    return -2;
  if (key) {
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddItemToObject(j, key, cJSON_Parse(value));
  }
  char *s = cJSON_PrintUnformatted(j);
  int rc = config_from_hf_json(c, s, strlen(s), "edited/config.json");
  free(s);
  cJSON_Delete(j);
  return rc;
}

/* What the configs say, and clear errors for what the forward passes cannot run. */
static void test_configs(void) {
  struct model_config c;
  CHECK(parse_with(&c, "gemma2", NULL, NULL) == 0, "gemma2 config: %s", err_last());
  CHECK(!strcmp(c.arch, "gemma2") && c.head_dim == 32 && c.query_pre_attn_scalar == 24.0f &&
            c.attn_softcap == 3.0f && c.final_softcap == 4.0f && c.local_window == 8 && c.sliding_window == 0 &&
            c.norm_plus_one == 1 && c.tie_embeddings == 1,
        "gemma2 fields");
  CHECK(parse_with(&c, "gemma2", "final_logit_softcapping", "null") == 0 && c.final_softcap == 0.0f,
        "null softcap is off");
  CHECK(parse_with(&c, "gemma2", "hidden_act", "\"gelu_pytorch_tanh\"") == 0, "HF's hidden_act key is accepted");
  CHECK(parse_with(&c, "gemma2", "hidden_activation", "\"gelu\"") != 0 &&
            strstr(err_last(), "edited/config.json: hidden_activation must be"),
        "exact gelu refused: %s", err_last());
  CHECK(parse_with(&c, "gemma2", "layer_types", "[\"full_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"]") != 0 &&
            strstr(err_last(), "layer_types[0] must be \"sliding_attention\""),
        "other layer patterns refused: %s", err_last());
  CHECK(parse_with(&c, "mixtral", NULL, NULL) == 0 && !strcmp(c.arch, "mixtral") && c.n_experts == 8 &&
            c.n_experts_used == 2 && c.sliding_window == 0,
        "mixtral fields: %s", err_last());
  CHECK(parse_with(&c, "mixtral", "num_experts_per_tok", "9") != 0 &&
            strstr(err_last(), "9 experts per token of 8"),
        "top 9 of 8 refused: %s", err_last());
  CHECK(parse_with(&c, "mixtral", "num_local_experts", "null") != 0 && strstr(err_last(), "num_local_experts"),
        "experts required: %s", err_last());
}

int main(void) {
  test_configs();
  struct backend *be = backend_cpu_create(2);
  if (!be)
    return 1;
  check_fixture(be, "gemma2");
  check_fixture(be, "mixtral");
  be->ops->destroy(be);
  return test_finish("test_model_archops");
}
