/* test_model_greedy.c - greedy continuations against transformers' (tests/fixtures/NAME/greedy.json,
 * made by tools/make_fixtures.py: the prompt in one step, then one token a step with the cache,
 * argmax, no stop token), on the CPU in f32.
 *
 * The prompts start inside and end beyond the sliding window (mistral_sw, window 5) and LongRoPE's
 * original length (phi3, 8): the window must hide old keys, LongRoPE must switch from the short to
 * the long factors when the sequence passes 8 tokens (keys already cached keep theirs). Block
 * tables come from the KV manager with the model's window set, as in the engine, so blocks that
 * fall out of the window go back to the pool and their table entries become the null block while
 * the sequence goes on: the test checks that this happened and that decoding stays equal. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/kv_manager.h"
#include "model/model.h"
#include "test_util.h"
#include "util/log.h"

#define BS 8
#define MAXB 16
#define MAXT (MAXB * BS)

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b])
      b = i;
  return b;
}

/* Reserves and computes TOKS[from, to) of sequence S, returning the argmax of the last logits. */
static int step(struct model *m, struct kv_manager *kv, struct kv_seq *s, const int32_t *toks,
                int from, int to, float *logits) {
  struct kv_copy cp;
  if (kv_manager_allocate(kv, s, to - from, &cp) != 0)
    return ERR("allocate %d..%d failed", from, to);
  int T = to - from;
  int32_t pos[MAXT], slots[MAXT], qs[2] = {0, T}, len = to, lidx = T - 1;
  for (int i = 0; i < T; i++) {
    pos[i] = from + i;
    slots[i] = s->blocks[(from + i) / BS] * BS + (from + i) % BS;
  }
  struct batch b = {T, 1, MAXB, len, T, toks + from, pos, slots, qs, &len, s->blocks, 1, &lidx};
  if (model_forward(m, &b, logits) != 0)
    return -1;
  return argmax(logits, model_get_config(m)->vocab_size);
}

static void check_fixture(struct backend *be, const char *dir, const char *name) {
  char p[600];
  snprintf(p, sizeof p, "%s/greedy.json", dir);
  size_t len;
  char *text = test_read_file(p, &len);
  if (!text)
    return; /* not a greedy fixture */
  cJSON *cases = cJSON_Parse(text);
  free(text);
  struct model *m = model_load(dir, be);
  CHECK(cJSON_IsArray(cases) && m, "%s: greedy.json / model: %s", name, err_last_where());
  if (!cJSON_IsArray(cases) || !m) {
    cJSON_Delete(cases);
    model_free(m);
    return;
  }
  const struct model_config *c = model_get_config(m);
  int window = model_kv_window(c);
  float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
  struct kv_manager kv;
  struct kv_manager_params kp = {MAXB + 1, BS, MAXB, 0, 0, 0};
  if (model_alloc_cache(m, MAXB + 1, BS, DTYPE_F32, MAXT, 1, MAXB) || kv_manager_init(&kv, &kp)) {
    CHECK(0, "%s: %s", name, err_last_where());
    goto done;
  }
  kv_manager_set_window(&kv, window);
  const cJSON *cs;
  int k = 0;
  cJSON_ArrayForEach(cs, cases) {
    const cJSON *prompt = cJSON_GetObjectItem(cs, "prompt"), *want = cJSON_GetObjectItem(cs, "output");
    int np = cJSON_GetArraySize(prompt), nw = cJSON_GetArraySize(want);
    int32_t toks[MAXT];
    if (np < 1 || nw < 1 || np + nw > MAXT) {
      CHECK(0, "%s case %d: %d + %d tokens", name, k, np, nw);
      break;
    }
    for (int i = 0; i < np; i++)
      toks[i] = (int32_t)cJSON_GetArrayItem(prompt, i)->valuedouble;
    struct kv_seq s;
    kv_seq_init(&s, &kv);
    int t = step(m, &kv, &s, toks, 0, np, logits), n = np, same = 0;
    for (int i = 0; i < nw && t >= 0; i++) {
      int w = (int)cJSON_GetArrayItem(want, i)->valuedouble;
      if (t != w) {
        CHECK(0, "%s case %d (prompt of %d): token %d is %d, transformers %d", name, k, np, i, t, w);
        break;
      }
      same++;
      toks[n] = t;
      if (i + 1 < nw)
        t = step(m, &kv, &s, toks, n, n + 1, logits);
      n++;
    }
    CHECK(t >= 0, "%s case %d: %s", name, k, err_last_where());
    printf("%s case %d: prompt %d tokens, %d/%d greedy tokens equal to transformers, %d blocks "
           "released by the window %d\n", name, k, np, same, nw, s.num_trimmed, window);
    if (window > 0)
      CHECK(s.num_trimmed > 0, "%s case %d: the window released no block", name, k);
    kv_manager_release(&kv, &s);
    kv_seq_free(&s);
    k++;
  }
  kv_manager_free(&kv);
done:
  free(logits);
  cJSON_Delete(cases);
  model_free(m);
}

int main(void) {
  log_set_level(LOG_LEVEL_ERROR);
  const char *names[] = {"mistral_sw", "phi3", "qwen3", "gemma2", "mixtral"};
  struct backend *be = backend_cpu_create(2);
  REQUIRE(be, "backend: %s", err_last());
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    check_fixture(be, test_fixture_path(names[i]), names[i]);
  be->ops->destroy(be);
  return test_finish("test_model_greedy");
}
