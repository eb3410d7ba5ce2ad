/* test_async_engine.c - the thread-safe async engine on stories260K: requests from 6 threads at
 * once give the same greedy tokens and text as one at a time; raw logprobs (the sampled token's
 * equals the log softmax of the logits, top list sorted, greedy token first); abort from another
 * thread returns every KV block; a full waiting queue answers PAGODA_ERR_BUSY; shutdown aborts
 * what runs and refuses new requests with PAGODA_ERR_CLOSED. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pagoda.h"
#include "test_util.h"

#define N_PROMPTS 6
#define N_TOK 24

static const char *prompts[N_PROMPTS] = {
    "Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a bird",
    "The sun was shining and", "Sam had a red ball"};

struct result {
  int32_t tok[N_TOK + 8];
  int n;
  char text[1024];
  size_t len;
  int finish, events;
  float lp[N_TOK + 8];
};

static pagoda_async_t *A;

/* Reads a stream to its end. Returns 0, or 1 on a protocol error. */
static int collect(pagoda_stream_t *s, struct result *r) {
  memset(r, 0, sizeof *r);
  struct pagoda_event ev;
  int st;
  while ((st = pagoda_stream_next(s, &ev, 10000)) == PAGODA_OK) {
    r->events++;
    for (int i = 0; i < ev.num_token_ids && r->n < N_TOK + 8; i++) {
      if (ev.logprobs)
        r->lp[r->n] = ev.logprobs[i];
      r->tok[r->n++] = ev.token_ids[i];
    }
    REQUIRE(r->len + ev.text_len < sizeof r->text, "text fits");
    REQUIRE(strlen(ev.text) == ev.text_len, "event text is NUL-terminated");
    memcpy(r->text + r->len, ev.text, ev.text_len);
    r->len += ev.text_len;
    if (ev.finish_reason)
      r->finish = ev.finish_reason;
  }
  REQUIRE(st == PAGODA_ERR_NOT_FOUND, "stream ended with %d", st);
  return 0;
}

static struct pagoda_sampling_params greedy(int max_tokens) {
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = 1;
  return sp;
}

static struct result ref[N_PROMPTS], got[N_PROMPTS][2];

static void *submitter(void *arg) {
  int k = (int)(intptr_t)arg;
  struct pagoda_sampling_params sp = greedy(N_TOK);
  for (int round = 0; round < 2; round++) {
    pagoda_stream_t *s;
    int st = pagoda_async_submit(A, prompts[k], NULL, 0, &sp, &s);
    CHECK(st == PAGODA_OK, "submit %d: %s", k, pagoda_last_error());
    if (st == PAGODA_OK) {
      collect(s, &got[k][round]);
      pagoda_stream_free(s);
    }
  }
  return NULL;
}

struct abort_arg {
  pagoda_stream_t *s;
};

static void *aborter(void *arg) {
  pagoda_stream_abort(((struct abort_arg *)arg)->s);
  return NULL;
}

static int make(int max_seqs, int max_waiting, const char *model) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = model;
  ep.device = "cpu";
  ep.threads = 1;
  ep.max_num_seqs = max_seqs;
  ep.pa_memory_mb = 16;
  struct pagoda_async_params ap;
  pagoda_async_params_default(&ap);
  ap.max_waiting = max_waiting;
  REQUIRE(pagoda_async_create(&ep, &ap, &A) == PAGODA_OK, "create: %s", pagoda_last_error());
  return 0;
}

static int check_blocks_free(const char *when) {
  struct pagoda_async_stats st;
  pagoda_async_stats(A, &st);
  CHECK(st.engine.free_blocks == st.engine.num_blocks && st.engine.running == 0 && st.active == 0,
        "%s: %d of %d blocks free, %d running, %d active", when, st.engine.free_blocks,
        st.engine.num_blocks, st.engine.running, st.active);
  return 0;
}

int main(void) {
  const char *model = test_shared_path("models/stories260K.gguf");
  if (!model)
    return test_skip("stories260K.gguf not found");
  if (make(8, 64, model))
    return test_finish("test_async_engine");

  /* One at a time. */
  struct pagoda_sampling_params sp = greedy(N_TOK);
  for (int k = 0; k < N_PROMPTS; k++) {
    pagoda_stream_t *s;
    REQUIRE(pagoda_async_submit(A, prompts[k], NULL, 0, &sp, &s) == PAGODA_OK, "submit: %s", pagoda_last_error());
    collect(s, &ref[k]);
    CHECK(ref[k].n == N_TOK && ref[k].finish == PAGODA_FINISH_LENGTH, "prompt %d: %d tokens, finish %d", k,
          ref[k].n, ref[k].finish);
    pagoda_stream_free(s);
  }
  CHECK(!strncmp(ref[0].text, ", there was a little girl named Lily.", 37), "llama.cpp's continuation: '%s'",
        ref[0].text);

  /* Six threads at once, twice each: the same tokens and text. */
  pthread_t th[N_PROMPTS];
  for (int k = 0; k < N_PROMPTS; k++)
    pthread_create(&th[k], NULL, submitter, (void *)(intptr_t)k);
  for (int k = 0; k < N_PROMPTS; k++)
    pthread_join(th[k], NULL);
  for (int k = 0; k < N_PROMPTS; k++)
    for (int r = 0; r < 2; r++) {
      CHECK(got[k][r].n == N_TOK && !memcmp(got[k][r].tok, ref[k].tok, sizeof(int32_t) * N_TOK),
            "prompt %d round %d: concurrent tokens differ from sequential", k, r);
      CHECK(!strcmp(got[k][r].text, ref[k].text), "prompt %d round %d text '%s' vs '%s'", k, r,
            got[k][r].text, ref[k].text);
    }
  check_blocks_free("after the concurrent rounds");
  struct pagoda_async_stats st;
  pagoda_async_stats(A, &st);
  CHECK(st.submitted == 3 * N_PROMPTS && st.finished == 3 * N_PROMPTS, "counters %lld %lld",
        (long long)st.submitted, (long long)st.finished);
  CHECK(st.engine.generated_tokens == 3 * N_PROMPTS * N_TOK, "generated %lld", (long long)st.engine.generated_tokens);

  /* Logprobs of the raw distribution: greedy picks the most likely token, so its logprob is the
   * first of the top list; the list is sorted, and a logit_bias (a processor) does not change
   * them. */
  struct pagoda_sampling_params lsp = greedy(N_TOK);
  lsp.logprobs = 1;
  lsp.top_logprobs = 5;
  pagoda_stream_t *s;
  REQUIRE(pagoda_async_submit(A, prompts[0], NULL, 0, &lsp, &s) == PAGODA_OK, "submit: %s", pagoda_last_error());
  struct pagoda_event ev;
  int n_checked = 0;
  float lp_first[N_TOK];
  while (pagoda_stream_next(s, &ev, 10000) == PAGODA_OK) {
    CHECK(ev.logprobs && ev.num_top_logprobs == 5, "logprobs present");
    for (int i = 0; ev.logprobs && i < ev.num_token_ids; i++) {
      const float *top = ev.top_logprobs + i * 5;
      const int32_t *ids = ev.top_logprob_ids + i * 5;
      CHECK(ids[0] == ev.token_ids[i] && fabsf(top[0] - ev.logprobs[i]) < 1e-6f, "greedy token is the top one");
      CHECK(ev.logprobs[i] <= 0 && ev.logprobs[i] > -30, "logprob %g", ev.logprobs[i]);
      double mass = 0;
      for (int j = 0; j < 5; j++) {
        mass += exp(top[j]);
        if (j)
          CHECK(top[j] <= top[j - 1] && ids[j] != ids[j - 1], "sorted top list");
      }
      CHECK(mass <= 1.0 + 1e-5, "top mass %g", mass);
      if (n_checked < N_TOK)
        lp_first[n_checked] = ev.logprobs[i];
      n_checked++;
    }
    CHECK(ev.num_token_ids != 1 || ev.token_ids[0] == ref[0].tok[n_checked - 1], "logprobs do not change the tokens");
  }
  pagoda_stream_free(s);
  CHECK(n_checked == N_TOK, "%d logprobs", n_checked);
  /* A logit_bias against a token the text does not use: the same tokens, the same raw logprobs. */
  int32_t bias_id = 5;
  float bias_v = -5;
  lsp.logit_bias_ids = &bias_id;
  lsp.logit_bias_values = &bias_v;
  lsp.n_logit_bias = 1;
  lsp.top_logprobs = 0;
  REQUIRE(pagoda_async_submit(A, prompts[0], NULL, 0, &lsp, &s) == PAGODA_OK, "submit: %s", pagoda_last_error());
  struct result rb;
  collect(s, &rb);
  pagoda_stream_free(s);
  for (int i = 0; i < N_TOK && rb.n == N_TOK; i++)
    CHECK(rb.tok[i] == ref[0].tok[i] && fabsf(rb.lp[i] - lp_first[i]) < 1e-5f,
          "token %d: logprob %g vs %g (raw, before logit_bias)", i, rb.lp[i], lp_first[i]);
  lsp.top_logprobs = 21;
  CHECK(pagoda_async_submit(A, prompts[0], NULL, 0, &lsp, &s) == PAGODA_ERR_INVALID_ARG &&
            strstr(pagoda_last_error(), "top_logprobs"),
        "top_logprobs 21 refused: %s", pagoda_last_error());

  /* Abort from another thread mid-stream: every block back, finish = abort. */
  sp = greedy(400);
  REQUIRE(pagoda_async_submit(A, prompts[2], NULL, 0, &sp, &s) == PAGODA_OK, "submit: %s", pagoda_last_error());
  REQUIRE(pagoda_stream_next(s, &ev, 10000) == PAGODA_OK, "first event");
  pagoda_async_stats(A, &st);
  CHECK(st.engine.free_blocks < st.engine.num_blocks, "a running request holds blocks");
  struct abort_arg aa = {s};
  pthread_t ta;
  pthread_create(&ta, NULL, aborter, &aa);
  pthread_join(ta, NULL);
  struct result ra;
  collect(s, &ra);
  CHECK(ra.finish == PAGODA_FINISH_ABORT && ra.n < 399, "aborted after %d more tokens (finish %d)", ra.n, ra.finish);
  check_blocks_free("after the abort");
  pagoda_stream_free(s);
  /* Free without reading: the request is aborted and its blocks come back. */
  REQUIRE(pagoda_async_submit(A, prompts[3], NULL, 0, &sp, &s) == PAGODA_OK, "submit: %s", pagoda_last_error());
  pagoda_stream_free(s);
  int ok = 0;
  for (int i = 0; i < 200 && !ok; i++) {
    pagoda_async_stats(A, &st);
    ok = st.active == 0 && st.engine.free_blocks == st.engine.num_blocks;
    if (!ok)
      nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
  CHECK(ok, "a freed stream's request ends and returns its blocks");

  /* Bad requests are refused with the engine's status; the engine keeps serving. */
  int32_t bad = 1 << 30;
  CHECK(pagoda_async_submit(A, NULL, &bad, 1, NULL, &s) == PAGODA_ERR_INVALID_ARG, "bad id refused");
  pagoda_async_free(A);

  /* A full waiting queue: one sequence per step; A runs, B and C wait, D is refused. */
  if (make(1, 2, model))
    return test_finish("test_async_engine");
  pagoda_stream_t *sa, *sb, *sc, *sd;
  sp = greedy(-1);
  REQUIRE(pagoda_async_submit(A, prompts[0], NULL, 0, &sp, &sa) == PAGODA_OK, "submit A");
  REQUIRE(pagoda_stream_next(sa, &ev, 10000) == PAGODA_OK, "A started");
  sp = greedy(8);
  CHECK(pagoda_async_submit(A, prompts[1], NULL, 0, &sp, &sb) == PAGODA_OK, "B queued");
  CHECK(pagoda_async_submit(A, prompts[2], NULL, 0, &sp, &sc) == PAGODA_OK, "C queued");
  CHECK(pagoda_async_submit(A, prompts[3], NULL, 0, &sp, &sd) == PAGODA_ERR_BUSY && strstr(pagoda_last_error(), "full"),
        "D refused: queue full: %s", pagoda_last_error());
  pagoda_async_stats(A, &st);
  CHECK(st.rejected_busy == 1 && st.queued == 2, "busy %lld queued %d", (long long)st.rejected_busy, st.queued);
  pagoda_stream_abort(sa);
  struct result r1;
  collect(sb, &r1);
  CHECK(r1.n == 8 && !memcmp(r1.tok, ref[1].tok, 8 * sizeof(int32_t)), "B ran after A's abort");
  collect(sc, &r1);
  CHECK(r1.n == 8, "C ran");
  pagoda_stream_free(sa);
  pagoda_stream_free(sb);
  pagoda_stream_free(sc);

  /* Shutdown with a request running: it is aborted (grace 0); new requests are refused. */
  sp = greedy(-1);
  REQUIRE(pagoda_async_submit(A, prompts[4], NULL, 0, &sp, &s) == PAGODA_OK, "submit");
  REQUIRE(pagoda_stream_next(s, &ev, 10000) == PAGODA_OK, "started");
  pagoda_async_shutdown(A, 0);
  collect(s, &r1);
  CHECK(r1.finish == PAGODA_FINISH_ABORT, "shutdown aborts running requests (finish %d)", r1.finish);
  CHECK(pagoda_async_submit(A, prompts[0], NULL, 0, NULL, &sd) == PAGODA_ERR_CLOSED, "closed after shutdown");
  check_blocks_free("after shutdown");
  pagoda_stream_free(s);
  pagoda_async_free(A);
  return test_finish("test_async_engine");
}
