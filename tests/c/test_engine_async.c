/* test_engine_async.c - asynchronous steps (the engine launches step N + 1 before it reads step
 * N's ids) give exactly the tokens, text, finish reasons and usage of synchronous steps
 * (PAGODA_ASYNC_STEPS=0), on the CPU backend, which runs the same bookkeeping with its host
 * sampler picking at launch. The mix: greedy and seeded sampling (top-k, top-p, min-p,
 * logit_bias, min_tokens), stop token ids, stop strings, EOS and max_tokens finishing mid-run
 * (max_tokens 1 and 2 among them), requests arriving while steps are in flight, aborts, a pool
 * small enough to preempt, and requests that need the synchronous step (penalties, logprobs,
 * n = 2) arriving mid-run and leaving again. Streaming: per sequence nothing arrives after its
 * finish, the token count matches usage, and every block comes back. Real model:
 * ../shared/testdata/models/stories260K.gguf. */
#include <stdlib.h>
#include <string.h>

#include "pagoda.h"
#include "test_util.h"

#define NREQ 14
#define MAXOUT 48

struct seq_out {
  int32_t tok[MAXOUT + 8];
  int n;
  char text[2048];
  size_t len;
  int finish, after_finish, usage;
};

struct run_result {
  struct seq_out s[NREQ][2];
  long long preemptions;
  int first_call_outputs; /* outputs of the very first step call (one request queued) */
};

static int32_t prompts[NREQ][200];
static int prompt_len[NREQ];
static int32_t stop_id; /* a token greedy request 6 produces mid-run (found by a first run) */

static void make_prompts(void) {
  uint64_t rng = 7;
  for (int r = 0; r < NREQ; r++) {
    prompt_len[r] = 4 + (int)(test_rand(&rng) % 150);
    prompts[r][0] = 1;
    for (int i = 1; i < prompt_len[r]; i++)
      prompts[r][i] = 3 + (int)(test_rand(&rng) % 509);
  }
}

/* Request R's parameters; SYNC_MIX adds the kinds that need synchronous steps. */
static void params(int r, int sync_mix, struct pagoda_sampling_params *sp) {
  static int32_t bias_id = 77;
  static float bias_v = 4.0f;
  static const char *stops[1] = {"."};
  pagoda_sampling_params_default(sp);
  sp->max_tokens = MAXOUT;
  sp->seed = 500 + r;
  sp->temperature = r % 3 == 0 ? 0 : 0.9f;
  sp->ignore_eos = r % 5 != 2; /* some stop at EOS */
  switch (r) {
  case 1: sp->top_k = 12; break;
  case 2: sp->top_p = 0.8f; break;
  case 3: sp->max_tokens = 1; break;
  case 4: sp->min_p = 0.1f; sp->logit_bias_ids = &bias_id; sp->logit_bias_values = &bias_v; sp->n_logit_bias = 1; break;
  case 5: sp->max_tokens = 2; break;
  case 6: sp->stop_token_ids = &stop_id; sp->n_stop_token_ids = 1; sp->temperature = 0; break;
  case 7: sp->stop = stops; sp->n_stop = 1; break;
  case 8: sp->min_tokens = 6; sp->stop_token_ids = &stop_id; sp->n_stop_token_ids = 1; break;
  case 9: sp->max_tokens = 7; break;
  default: break;
  }
  if (sync_mix && r == 10)
    sp->repetition_penalty = 1.3f;
  if (sync_mix && r == 11) {
    sp->logprobs = 1;
    sp->top_logprobs = 2;
  }
  if (sync_mix && r == 12)
    sp->n = 2;
  if (sync_mix && r == 13)
    sp->presence_penalty = 0.5f;
}

/* Runs the mix with PAGODA_ASYNC_STEPS=ASYNC: requests 0..5 at once, the others one every third
 * step call; request 9 aborted once 4 of its tokens were reported. Returns 0 or 1. */
static int run(const struct pagoda_engine_params *ep, int async, int sync_mix, struct run_result *res) {
  setenv("PAGODA_ASYNC_STEPS", async ? "1" : "0", 1);
  memset(res, 0, sizeof *res);
  pagoda_engine_t *e;
  REQUIRE(pagoda_engine_create(ep, &e) == PAGODA_OK, "create: %s", pagoda_last_error());
  uint64_t ids[NREQ];
  int added = 0, calls = 0, aborted = 0;
  struct pagoda_sampling_params sp;
  params(0, sync_mix, &sp);
  REQUIRE(pagoda_add_request_tokens(e, prompts[0], prompt_len[0], &sp, &ids[added++]) == PAGODA_OK, "add: %s",
          pagoda_last_error());
  for (;;) {
    while (added < NREQ && calls > 0 && (added < 6 || calls % 3 == 0)) {
      params(added, sync_mix, &sp);
      REQUIRE(pagoda_add_request_tokens(e, prompts[added], prompt_len[added], &sp, &ids[added]) == PAGODA_OK,
              "add: %s", pagoda_last_error());
      added++;
      if (added >= 6)
        break;
    }
    if (!pagoda_engine_has_work(e) && added == NREQ)
      break;
    const struct pagoda_output *outs;
    int n;
    REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "step: %s", pagoda_last_error());
    if (calls++ == 0)
      res->first_call_outputs = n;
    for (int i = 0; i < n; i++) {
      int r = 0;
      while (r < added && ids[r] != outs[i].request_id)
        r++;
      REQUIRE(r < added && outs[i].index < 2, "unknown output");
      struct seq_out *x = &res->s[r][outs[i].index];
      if (x->finish)
        x->after_finish++; /* nothing may reach the user after its finish */
      for (int j = 0; j < outs[i].num_token_ids && x->n < MAXOUT + 8; j++)
        x->tok[x->n++] = outs[i].token_ids[j];
      if (x->len + outs[i].text_len < sizeof x->text) {
        memcpy(x->text + x->len, outs[i].text, outs[i].text_len);
        x->len += outs[i].text_len;
      }
      x->finish = outs[i].finish_reason;
      x->usage = outs[i].usage.completion_tokens;
    }
    if (!aborted && added > 9 && res->s[9][0].n >= 4 && !res->s[9][0].finish) {
      REQUIRE(pagoda_abort(e, ids[9]) == PAGODA_OK, "abort: %s", pagoda_last_error());
      aborted = 1;
    }
  }
  struct pagoda_engine_stats st;
  pagoda_engine_stats(e, &st);
  CHECK(st.free_blocks == st.num_blocks, "async %d: all blocks returned (%d of %d)", async, st.free_blocks,
        st.num_blocks);
  res->preemptions = st.preemptions;
  pagoda_engine_free(e);
  return 0;
}

static void compare(const char *what, int sync_mix, const struct run_result *a, const struct run_result *b) {
  for (int r = 0; r < NREQ; r++)
    for (int k = 0; k < (sync_mix && r == 12 ? 2 : 1); k++) {
      const struct seq_out *x = &a->s[r][k], *y = &b->s[r][k];
      int same = x->n == y->n && x->finish == y->finish && !memcmp(x->tok, y->tok, (size_t)x->n * 4) &&
                 x->len == y->len && !memcmp(x->text, y->text, x->len);
      CHECK(same, "%s: request %d sample %d differs (%d vs %d tokens, finish %d vs %d)", what, r, k, x->n, y->n,
            x->finish, y->finish);
      CHECK(x->finish != 0 && y->finish != 0, "%s: request %d sample %d finished", what, r, k);
      CHECK(!x->after_finish && !y->after_finish, "%s: request %d: output after its finish", what, r);
      CHECK(y->usage == y->n || (sync_mix && r == 12), "%s: request %d: %d tokens streamed, usage says %d", what,
            r, y->n, y->usage);
    }
}

int main(void) {
  struct pagoda_engine_params base;
  if (test_stories_params(&base, 8, 256))
    return test_skip("stories260K.gguf not found");
  make_prompts();
  static struct run_result ref, got;

  /* A stop id that greedy request 6 meets mid-run (its first occurrence ends it there). */
  stop_id = 0;
  if (run(&base, 0, 0, &ref))
    return test_finish("test_engine_async");
  stop_id = ref.s[6][0].tok[ref.s[6][0].n > 10 ? 9 : ref.s[6][0].n / 2];

  if (run(&base, 0, 0, &ref) || run(&base, 1, 0, &got))
    return test_finish("test_engine_async");
  compare("async", 0, &ref, &got);
  CHECK(ref.first_call_outputs == 1 && got.first_call_outputs == 0,
        "a step's tokens come with the next call when asynchronous (first call: %d sync, %d async)",
        ref.first_call_outputs, got.first_call_outputs);
  CHECK(ref.s[3][0].n == 1 && ref.s[5][0].n == 2 && ref.s[9][0].finish == PAGODA_FINISH_ABORT,
        "max_tokens 1 and 2, the abort (%d, %d, %d)", ref.s[3][0].n, ref.s[5][0].n, ref.s[9][0].finish);
  CHECK(ref.s[6][0].finish == PAGODA_FINISH_STOP && ref.s[6][0].tok[ref.s[6][0].n - 1] == stop_id,
        "the stop id ends request 6 mid-run (%d tokens)", ref.s[6][0].n);
  CHECK(ref.s[7][0].finish == PAGODA_FINISH_STOP, "the stop string ends request 7 (%d tokens)", ref.s[7][0].n);

  /* Chunked prefill beside decodes, block size 8. */
  struct pagoda_engine_params p = base;
  p.prefill_chunk_size = 16;
  p.max_num_batched_tokens = 40;
  p.block_size = 8;
  if (run(&p, 0, 0, &ref) || run(&p, 1, 0, &got))
    return test_finish("test_engine_async");
  compare("async, chunked prefill", 0, &ref, &got);

  /* A pool of 1 MiB (25 blocks of 32 f32 tokens): preemption. */
  p = base;
  p.pa_memory_mb = 1;
  p.max_num_seqs = 12;
  if (run(&p, 0, 0, &ref) || run(&p, 1, 0, &got))
    return test_finish("test_engine_async");
  compare("async, preempting", 0, &ref, &got);
  CHECK(got.preemptions > 0 && ref.preemptions > 0, "the small pool preempts (%lld, %lld)", ref.preemptions,
        got.preemptions);

  /* Requests that need the synchronous step come and go while the others run asynchronously. */
  if (run(&base, 0, 1, &ref) || run(&base, 1, 1, &got))
    return test_finish("test_engine_async");
  compare("async with synchronous requests", 1, &ref, &got);
  return test_finish("test_engine_async");
}
