/* test_engine_requests.c - request options through the public API on stories260K: streamed text
 * equals llama.cpp's greedy continuation, logit_bias, stop token ids, min_tokens, max_tokens,
 * abort (blocks back at once, the other request unaffected), n samples, usage with cached prompt
 * tokens, and rejections (too long, bad ids, bad parameters) that leave the engine serving. */
#include <stdlib.h>
#include <string.h>

#include "pagoda.h"
#include "test_util.h"

struct out {
  int32_t tok[256];
  int n;
  char text[4096];
  size_t len;
  int finish;
  struct pagoda_usage usage;
};

static pagoda_engine_t *e;
static int callback_outputs, polled_outputs;

static void on_output(const struct pagoda_output *out, void *user) {
  (void)out;
  CHECK(user == &callback_outputs, "user pointer");
  callback_outputs++;
}

/* Runs until idle, collecting outputs of up to 4 requests x 4 samples. */
static int drain(const uint64_t *ids, int n_ids, struct out (*o)[4]) {
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int n;
    REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "step: %s", pagoda_last_error());
    polled_outputs += n;
    for (int i = 0; i < n; i++) {
      int r = 0;
      while (r < n_ids && ids[r] != outs[i].request_id)
        r++;
      REQUIRE(r < n_ids && outs[i].index < 4, "unknown output");
      struct out *x = &o[r][outs[i].index];
      for (int j = 0; j < outs[i].num_token_ids && x->n < 256; j++)
        x->tok[x->n++] = outs[i].token_ids[j];
      REQUIRE(x->len + outs[i].text_len < sizeof x->text, "text fits");
      memcpy(x->text + x->len, outs[i].text, outs[i].text_len);
      x->len += outs[i].text_len;
      x->text[x->len] = 0;
      x->finish = outs[i].finish_reason;
      x->usage = outs[i].usage;
    }
  }
  return 0;
}

static struct pagoda_sampling_params greedy(int max_tokens) {
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  return sp;
}

int main(void) {
  const char *model = test_shared_path("models/stories260K.gguf");
  if (!model)
    return test_skip("stories260K.gguf not found");
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = model;
  ep.device = "cpu";
  ep.threads = 1;
  ep.max_num_seqs = 8;
  ep.pa_memory_mb = 16;
  ep.on_output = on_output;
  ep.user = &callback_outputs;
  REQUIRE(pagoda_engine_create(&ep, &e) == PAGODA_OK, "create: %s", pagoda_last_error());
  struct pagoda_engine_stats st;
  static struct out o[4][4];
  uint64_t ids[4];

  /* Streamed text = llama.cpp's greedy continuation (first line of the shared jsonl). */
  const char *want = ", there was a little girl named Lily. She loved to play outside in the park. One day, "
                     "she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said";
  struct pagoda_sampling_params sp = greedy(64);
  REQUIRE(pagoda_add_request(e, "Once upon a time", &sp, &ids[0]) == PAGODA_OK, "add");
  drain(ids, 1, o);
  CHECK(!strcmp(o[0][0].text, want), "streamed text: '%s'", o[0][0].text);
  CHECK(callback_outputs == polled_outputs && polled_outputs == 64, "callback saw every output: %d of %d",
        callback_outputs, polled_outputs);
  CHECK(o[0][0].n == 64 && o[0][0].finish == PAGODA_FINISH_LENGTH, "64 tokens, length");
  CHECK(o[0][0].usage.prompt_tokens == 5 && o[0][0].usage.completion_tokens == 64, "usage %d %d",
        o[0][0].usage.prompt_tokens, o[0][0].usage.completion_tokens);
  struct out base = o[0][0];

  /* The same prompt again: its full blocks come from the prefix cache. */
  int32_t prompt[300];
  prompt[0] = 1;
  for (int i = 1; i < 300; i++)
    prompt[i] = base.tok[i % 64];
  memset(o, 0, sizeof o);
  sp = greedy(8);
  pagoda_add_request_tokens(e, prompt, 300, &sp, &ids[0]);
  drain(ids, 1, o);
  memset(o, 0, sizeof o);
  pagoda_add_request_tokens(e, prompt, 300, &sp, &ids[0]);
  drain(ids, 1, o);
  CHECK(o[0][0].usage.cached_prompt_tokens == 288, "cached prompt tokens %d (9 blocks of 32)",
        o[0][0].usage.cached_prompt_tokens);

  /* logit_bias: +100 on one token makes greedy pick it every time. */
  memset(o, 0, sizeof o);
  sp = greedy(10);
  int32_t bias_id = 300;
  float bias_v = 100;
  sp.logit_bias_ids = &bias_id;
  sp.logit_bias_values = &bias_v;
  sp.n_logit_bias = 1;
  pagoda_add_request(e, "Once upon a time", &sp, &ids[0]);
  drain(ids, 1, o);
  int all = o[0][0].n == 10;
  for (int i = 0; i < o[0][0].n; i++)
    all &= o[0][0].tok[i] == 300;
  CHECK(all, "logit_bias");

  /* stop_token_ids: ends at the first occurrence (the id reported, its text not); min_tokens
   * masks it until then. */
  int32_t stop = base.tok[4];
  int first = 0;
  while (base.tok[first] != stop)
    first++;
  memset(o, 0, sizeof o);
  sp = greedy(64);
  sp.stop_token_ids = &stop;
  sp.n_stop_token_ids = 1;
  pagoda_add_request(e, "Once upon a time", &sp, &ids[0]);
  sp.min_tokens = first + 3;
  pagoda_add_request(e, "Once upon a time", &sp, &ids[1]);
  drain(ids, 2, o);
  CHECK(o[0][0].n == first + 1 && o[0][0].tok[first] == stop && o[0][0].finish == PAGODA_FINISH_STOP,
        "stop id at %d: got %d tokens", first, o[0][0].n);
  CHECK(o[1][0].n >= first + 4 && !memcmp(o[1][0].tok, base.tok, (size_t)first * 4) && o[1][0].tok[first] != stop,
        "min_tokens %d: %d tokens", first + 3, o[1][0].n);
  for (int i = 0; i < first + 3 && i < o[1][0].n; i++)
    CHECK(o[1][0].tok[i] != stop, "stop id masked at %d", i);

  /* Abort: blocks return at once; the other request's output is unaffected. */
  memset(o, 0, sizeof o);
  sp = greedy(64);
  pagoda_add_request(e, "Once upon a time", &sp, &ids[0]);
  pagoda_add_request(e, "The little dog", &sp, &ids[1]);
  const struct pagoda_output *outs;
  int n;
  int seen = 0; /* tokens of request 0 reported by these calls (one fewer with asynchronous steps) */
  for (int k = 0; k < 3; k++) {
    pagoda_engine_step(e, &outs, &n);
    for (int i = 0; i < n; i++)
      seen += outs[i].request_id == ids[0] ? outs[i].num_token_ids : 0;
  }
  CHECK(seen == 2 || seen == 3, "3 steps report 2 (asynchronous) or 3 tokens: %d", seen);
  CHECK(pagoda_abort(e, ids[1]) == PAGODA_OK, "abort");
  pagoda_engine_stats(e, &st);
  CHECK(st.running == 1, "aborted sequence left the scheduler (%d running)", st.running);
  CHECK(pagoda_abort(e, 999999) == PAGODA_ERR_NOT_FOUND, "unknown id");
  drain(ids, 2, o);
  CHECK(o[1][0].finish == PAGODA_FINISH_ABORT, "reported as aborted");
  CHECK(o[0][0].n == 64 - seen && !memcmp(o[0][0].tok, base.tok + seen, (size_t)(64 - seen) * 4),
        "the other request unaffected (%d)", o[0][0].n);
  pagoda_engine_stats(e, &st);
  CHECK(st.free_blocks == st.num_blocks, "every block back");

  /* n = 3 seeded samples: distinct, reproducible. */
  struct out first_run[3];
  for (int rep = 0; rep < 2; rep++) {
    memset(o, 0, sizeof o);
    struct pagoda_sampling_params s3;
    pagoda_sampling_params_default(&s3);
    s3.n = 3;
    s3.seed = 5;
    s3.max_tokens = 20;
    s3.ignore_eos = 1;
    pagoda_add_request(e, "Once upon a time", &s3, &ids[0]);
    drain(ids, 1, o);
    for (int k = 0; k < 3; k++) {
      CHECK(o[0][k].n == 20, "sample %d: %d tokens", k, o[0][k].n);
      if (rep == 0)
        first_run[k] = o[0][k];
      else
        CHECK(!memcmp(first_run[k].tok, o[0][k].tok, 20 * 4), "sample %d reproducible", k);
    }
    CHECK(memcmp(o[0][0].tok, o[0][1].tok, 80) || memcmp(o[0][1].tok, o[0][2].tok, 80), "samples differ");
    CHECK(o[0][0].usage.completion_tokens == 60, "usage over samples %d", o[0][0].usage.completion_tokens);
  }

  /* Rejections leave the engine serving. */
  static int32_t longp[3000];
  for (int i = 0; i < 3000; i++)
    longp[i] = 5;
  sp = greedy(8);
  CHECK(pagoda_add_request_tokens(e, longp, 3000, &sp, &ids[0]) == PAGODA_ERR_TOO_LONG, "too long");
  CHECK(strstr(pagoda_last_error(), "exceeds"), "reason: %s", pagoda_last_error());
  sp = greedy(2000);
  CHECK(pagoda_add_request_tokens(e, longp, 100, &sp, &ids[0]) == PAGODA_ERR_TOO_LONG, "prompt + max_tokens");
  int32_t bad[2] = {1, 512};
  sp = greedy(8);
  CHECK(pagoda_add_request_tokens(e, bad, 2, &sp, &ids[0]) == PAGODA_ERR_INVALID_ARG, "id out of range");
  sp.top_p = 0;
  CHECK(pagoda_add_request_tokens(e, bad, 1, &sp, &ids[0]) == PAGODA_ERR_INVALID_ARG, "top_p 0");
  sp = greedy(64);
  memset(o, 0, sizeof o);
  REQUIRE(pagoda_add_request(e, "Once upon a time", &sp, &ids[0]) == PAGODA_OK, "still serving");
  drain(ids, 1, o);
  CHECK(!strcmp(o[0][0].text, want), "same output after the rejections");
  pagoda_engine_free(e);
  return test_finish("test_engine_requests");
}
