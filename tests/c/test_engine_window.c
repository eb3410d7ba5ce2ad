/* test_engine_window.c - a sliding-window model through the public engine API (CPU), on the
 * mistral_sw fixture (window 5, tests/fixtures/README.md), block size 8:
 * - greedy continuations equal transformers' (greedy.json; prompts inside and past the window);
 * - a sequence of 20x the window holds at most window / block_size + 2 KV blocks at every step
 *   (the engine hands the window to the KV manager), while the same request on the windowless
 *   phi3 fixture holds one block per 8 tokens;
 * - prefix caching stays correct: a 40-token prompt whose early blocks left the window (and so
 *   went back to the pool) gives the same continuation when run again, with or without hits. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "pagoda.h"
#include "test_util.h"

#define BS 8
#define WINDOW 5
#define MAXOUT 128

static pagoda_engine_t *e;
static int max_used;

/* Runs request ID to the end; its tokens into OUT (up to MAXOUT), *N their count. Tracks the
 * most KV blocks referenced after any step. */
static int run(const int32_t *prompt, int n_prompt, int max_tokens, int32_t *out, int *n) {
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = 1;
  uint64_t id;
  REQUIRE(pagoda_add_request_tokens(e, prompt, n_prompt, &sp, &id) == PAGODA_OK, "add: %s",
          pagoda_last_error());
  *n = 0;
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int k;
    REQUIRE(pagoda_engine_step(e, &outs, &k) == PAGODA_OK, "step: %s", pagoda_last_error());
    for (int i = 0; i < k; i++)
      for (int j = 0; j < outs[i].num_token_ids && *n < MAXOUT; j++)
        out[(*n)++] = outs[i].token_ids[j];
    struct pagoda_engine_stats st;
    pagoda_engine_stats(e, &st);
    if (st.num_blocks - st.free_blocks > max_used)
      max_used = st.num_blocks - st.free_blocks;
  }
  return 0;
}

static pagoda_engine_t *open_engine(const char *dir) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = dir;
  ep.device = "cpu";
  ep.threads = 1;
  ep.max_num_seqs = 4;
  ep.block_size = BS;
  ep.pa_memory_mb = 1;
  pagoda_engine_t *eng = NULL;
  CHECK(pagoda_engine_create(&ep, &eng) == PAGODA_OK, "create %s: %s", dir, pagoda_last_error());
  return eng;
}

int main(void) {
  const char *dir = test_fixture_path("mistral_sw");
  char p[600];
  snprintf(p, sizeof p, "%s/greedy.json", dir);
  size_t len;
  char *text = test_read_file(p, &len);
  if (!text)
    return test_skip("tests/fixtures/mistral_sw not found");
  cJSON *cases = cJSON_Parse(text);
  free(text);
  REQUIRE(cJSON_IsArray(cases), "greedy.json");
  if (!(e = open_engine(dir)))
    return test_finish("test_engine_window");

  /* greedy continuations = transformers' */
  const cJSON *cs;
  int k = 0;
  cJSON_ArrayForEach(cs, cases) {
    const cJSON *pr = cJSON_GetObjectItem(cs, "prompt"), *want = cJSON_GetObjectItem(cs, "output");
    int np = cJSON_GetArraySize(pr), nw = cJSON_GetArraySize(want), n;
    int32_t prompt[64], out[MAXOUT];
    for (int i = 0; i < np && i < 64; i++)
      prompt[i] = (int32_t)cJSON_GetArrayItem(pr, i)->valuedouble;
    run(prompt, np, nw, out, &n);
    int same = n == nw;
    for (int i = 0; same && i < nw; i++)
      same = out[i] == (int32_t)cJSON_GetArrayItem(want, i)->valuedouble;
    CHECK(same, "case %d (prompt of %d): the engine's greedy tokens differ from transformers'", k, np);
    k++;
  }
  cJSON_Delete(cases);

  /* 20x the window: the blocks held stay bounded */
  int32_t prompt[3] = {1, 17, 200}, out1[MAXOUT], out2[MAXOUT], out3[MAXOUT];
  int n1, n2, n3;
  max_used = 0;
  run(prompt, 3, 20 * WINDOW, out1, &n1);
  CHECK(n1 == 20 * WINDOW, "%d tokens generated", n1);
  CHECK(max_used <= WINDOW / BS + 2, "a %d-token sequence held up to %d blocks (bound %d)", 3 + n1,
        max_used, WINDOW / BS + 2);
  printf("mistral_sw (window %d, block size %d): %d tokens, at most %d KV blocks held\n", WINDOW, BS,
         3 + n1, max_used);

  /* prefix caching: 40 tokens of that output as a prompt, twice */
  int32_t long_prompt[40];
  memcpy(long_prompt, out1, sizeof long_prompt);
  run(long_prompt, 40, 24, out2, &n2);
  run(long_prompt, 40, 24, out3, &n3);
  CHECK(n2 == 24 && n3 == 24 && !memcmp(out2, out3, sizeof(int32_t) * 24),
        "the same 40-token prompt gave different continuations with the prefix cache");
  pagoda_engine_free(e);

  /* the windowless fixture keeps every block */
  if ((e = open_engine(test_fixture_path("phi3")))) {
    max_used = 0; /* phi3's context is 64 tokens */
    run(prompt, 3, 50, out1, &n1);
    CHECK(n1 == 50 && max_used >= (3 + n1) / BS, "without a window %d blocks for %d tokens", max_used, 3 + n1);
    printf("phi3 (no window): %d tokens, %d KV blocks held\n", 3 + n1, max_used);
    pagoda_engine_free(e);
  }
  return test_finish("test_engine_window");
}
