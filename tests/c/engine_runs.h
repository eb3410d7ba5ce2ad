/* engine_runs.h - the request mix and driver shared by the engine tests that compare whole runs
 * (test_engine_invariance: batching, chunking, block sizes, preemption; test_engine_tp: --tp N
 * against --tp 1): NREQ requests with greedy and seeded sampling, top-k / top-p, n = 2 for
 * request 4, some stopping at EOS, the even ones sharing a 70-token prefix; run() drives an
 * engine to completion and checks that every block came back, compare() requires the same
 * tokens and finish reasons. Header-only: each test includes it once. */
#ifndef PAGODA_TEST_ENGINE_RUNS_H
#define PAGODA_TEST_ENGINE_RUNS_H

#include <stdlib.h>
#include <string.h>

#include "pagoda.h"
#include "test_util.h"

#define NREQ 10
#define MAXOUT 40

struct result {
  int32_t tokens[NREQ][2][MAXOUT];
  int n[NREQ][2];
  int finish[NREQ][2];
};

static int32_t prompts[NREQ][400];
static int prompt_len[NREQ];

static void make_prompts(void) {
  uint64_t rng = 99;
  for (int r = 0; r < NREQ; r++) {
    prompt_len[r] = 5 + (int)(test_rand(&rng) % 300);
    prompts[r][0] = 1; /* BOS */
    for (int i = 1; i < prompt_len[r]; i++) /* the first 70 tokens shared by the even requests */
      prompts[r][i] = (r % 2 == 0 && i < 70) ? 3 + (i * 37) % 500 : 3 + (int)(test_rand(&rng) % 509);
  }
}

static void sampling(int r, struct pagoda_sampling_params *sp) {
  pagoda_sampling_params_default(sp);
  sp->max_tokens = MAXOUT;
  sp->temperature = r % 3 == 0 ? 0 : 0.8f;
  sp->seed = 1000 + r;
  sp->ignore_eos = r % 4 != 1; /* some may stop at EOS: that must not depend on batching either */
  sp->n = r == 4 ? 2 : 1;
  sp->top_k = r == 5 ? 20 : 0;
  sp->top_p = r == 7 ? 0.9f : 1;
}

/* Runs all requests; ONE_AT_A_TIME waits for each before adding the next. Returns 0 or 1. */
static int run(const struct pagoda_engine_params *ep, int one_at_a_time, struct result *res,
               struct pagoda_engine_stats *st) {
  pagoda_engine_t *e;
  memset(res, 0, sizeof *res);
  REQUIRE(pagoda_engine_create(ep, &e) == PAGODA_OK, "create: %s", pagoda_last_error());
  uint64_t ids[NREQ];
  int added = 0;
  for (;;) {
    while (added < NREQ && (!one_at_a_time || !pagoda_engine_has_work(e))) {
      struct pagoda_sampling_params sp;
      sampling(added, &sp);
      REQUIRE(pagoda_add_request_tokens(e, prompts[added], prompt_len[added], &sp, &ids[added]) == PAGODA_OK,
              "add: %s", pagoda_last_error());
      added++;
    }
    if (!pagoda_engine_has_work(e))
      break;
    const struct pagoda_output *outs;
    int n;
    REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "step: %s", pagoda_last_error());
    for (int i = 0; i < n; i++) {
      int r = 0;
      while (r < added && ids[r] != outs[i].request_id)
        r++;
      REQUIRE(r < added && outs[i].index < 2, "unknown output");
      int k = outs[i].index;
      for (int j = 0; j < outs[i].num_token_ids && res->n[r][k] < MAXOUT; j++)
        res->tokens[r][k][res->n[r][k]++] = outs[i].token_ids[j];
      if (outs[i].finish_reason)
        res->finish[r][k] = outs[i].finish_reason;
    }
  }
  pagoda_engine_stats(e, st);
  CHECK(st->free_blocks == st->num_blocks, "all blocks returned: %d of %d", st->free_blocks, st->num_blocks);
  pagoda_engine_free(e);
  return 0;
}

static void compare(const char *what, const struct result *a, const struct result *b) {
  for (int r = 0; r < NREQ; r++)
    for (int k = 0; k < (r == 4 ? 2 : 1); k++) {
      int same = a->n[r][k] == b->n[r][k] && a->finish[r][k] == b->finish[r][k] &&
                 !memcmp(a->tokens[r][k], b->tokens[r][k], (size_t)a->n[r][k] * 4);
      CHECK(same, "%s: request %d sample %d differs (%d vs %d tokens)", what, r, k, a->n[r][k], b->n[r][k]);
    }
}

#endif
