/* test_engine_stress.c - random request mixes through the public API on stories260K with a tiny
 * pool: n samples, beams, stop strings and ids, penalties, min_tokens, aborts at random steps,
 * chunked prefill, prefix cache on/off, paged and contiguous. Every request ends exactly once,
 * with at most max_tokens tokens per sequence, every block returns to the pool, and every request
 * not aborted gives the same tokens when replayed alone on a roomy pool.
 * STRESS_RUNS=N runs N seeds (default 4, 2 under ASan; 60 passed when this was written). */
#include <stdlib.h>
#include <string.h>

#include "pagoda.h"
#include "test_util.h"

#define NREQ 48
#define MAXT 60

/* What each request asked and got, to replay it alone afterwards. */
struct rec {
  int32_t prompt[200];
  int n_prompt;
  struct pagoda_sampling_params sp;
  int32_t out[4][MAXT];
};
static struct rec recs[NREQ];

/* Runs request R alone on a roomy engine with the same block size; 0 when every sequence's tokens
 * equal what the stressed run produced. */
static int replay(const struct pagoda_engine_params *base, const struct rec *r, const int *ntok, int nseq) {
  struct pagoda_engine_params ep = *base;
  ep.pa_memory_mb = 16;
  ep.max_num_seqs = 16;
  pagoda_engine_t *e;
  if (pagoda_engine_create(&ep, &e))
    return -1;
  uint64_t id;
  int got[4] = {0}, same = 1;
  if (pagoda_add_request_tokens(e, r->prompt, r->n_prompt, &r->sp, &id)) {
    pagoda_engine_free(e);
    return -1;
  }
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int n;
    if (pagoda_engine_step(e, &outs, &n))
      break;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < outs[i].num_token_ids; j++) {
        int k = outs[i].index;
        same &= got[k] < MAXT && r->out[k][got[k]] == outs[i].token_ids[j];
        got[k]++;
      }
  }
  for (int k = 0; k < nseq; k++)
    same &= got[k] == ntok[k];
  pagoda_engine_free(e);
  return same ? 0 : 1;
}

static int run(uint64_t seed, int paged, int prefix, int chunk, int bs, int max_seqs) {
  const char *model = test_shared_path("models/stories260K.gguf");
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = model;
  ep.device = "cpu";
  ep.threads = 1;
  ep.max_num_seqs = max_seqs;
  ep.max_model_len = 256;
  ep.block_size = bs;
  ep.pa_memory_mb = paged ? 0.5 : 1; /* bs 16: 25 blocks (contiguous: 3 regions of 16 blocks) */
  ep.prefix_cache_n = prefix;
  ep.paged_attn = paged ? PAGODA_PAGED_ATTN_ON : PAGODA_PAGED_ATTN_OFF;
  ep.prefill_chunk_size = chunk;
  ep.max_num_batched_tokens = 2 * chunk + 8;
  pagoda_engine_t *e;
  REQUIRE(pagoda_engine_create(&ep, &e) == PAGODA_OK, "create: %s", pagoda_last_error());
  uint64_t ids[NREQ];
  int max_tok[NREQ], nseq[NREQ], finished[NREQ][4], ntok[NREQ][4], added = 0, aborted = 0;
  memset(finished, 0, sizeof finished);
  memset(ntok, 0, sizeof ntok);
  uint64_t rng = seed;
  const char *stops[2] = {"Lily", "."};
  int32_t stop_ids[1] = {2};
  for (int step = 0; step < 20000; step++) {
    if (added < NREQ && test_rand(&rng) % 3 == 0) {
      int32_t prompt[200];
      int n = 1 + (int)(test_rand(&rng) % 150);
      prompt[0] = 1;
      for (int i = 1; i < n; i++)
        prompt[i] = (test_rand(&rng) % 2) ? 3 + i % 50 : 3 + (int)(test_rand(&rng) % 500);
      struct pagoda_sampling_params sp;
      pagoda_sampling_params_default(&sp);
      sp.max_tokens = 1 + (int)(test_rand(&rng) % 60);
      sp.temperature = (test_rand(&rng) % 3) ? 0.9f : 0;
      sp.seed = (int64_t)(test_rand(&rng) % 1000);
      sp.n = 1 + (int)(test_rand(&rng) % 3);
      if (paged && test_rand(&rng) % 6 == 0) {
        sp.beam_width = 2 + (int)(test_rand(&rng) % 2);
        sp.n = 1;
      }
      sp.top_k = (int)(test_rand(&rng) % 3) * 10;
      sp.top_p = test_rand(&rng) % 2 ? 0.9f : 1;
      sp.min_tokens = (int)(test_rand(&rng) % 4);
      sp.repetition_penalty = test_rand(&rng) % 2 ? 1.2f : 1;
      sp.presence_penalty = 0.3f;
      sp.n_stop = (int)(test_rand(&rng) % 3);
      sp.stop = stops;
      sp.stop_token_ids = stop_ids;
      sp.n_stop_token_ids = (int)(test_rand(&rng) % 2);
      int rc = pagoda_add_request_tokens(e, prompt, n, &sp, &ids[added]);
      memcpy(recs[added].prompt, prompt, (size_t)n * sizeof *prompt);
      recs[added].n_prompt = n;
      recs[added].sp = sp;
      REQUIRE(rc == PAGODA_OK || rc == PAGODA_ERR_TOO_LONG, "add: %s", pagoda_last_error());
      if (rc == PAGODA_OK) {
        max_tok[added] = sp.max_tokens;
        nseq[added] = sp.beam_width > 1 ? sp.beam_width : sp.n;
        added++;
      }
    }
    if (added && test_rand(&rng) % 25 == 0) {
      int r = (int)(test_rand(&rng) % (uint64_t)added);
      if (pagoda_abort(e, ids[r]) == PAGODA_OK)
        aborted++;
    }
    if (!pagoda_engine_has_work(e)) {
      if (added == NREQ)
        break;
      continue;
    }
    const struct pagoda_output *outs;
    int n;
    REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "step %d: %s", step, pagoda_last_error());
    for (int i = 0; i < n; i++) {
      int r = 0;
      while (r < added && ids[r] != outs[i].request_id)
        r++;
      REQUIRE(r < added && outs[i].index < nseq[r], "output of an unknown request/sequence");
      int k = outs[i].index;
      CHECK(!finished[r][k], "request %d seq %d reported after it finished", r, k);
      for (int j = 0; j < outs[i].num_token_ids && ntok[r][k] + j < MAXT; j++)
        recs[r].out[k][ntok[r][k] + j] = outs[i].token_ids[j];
      ntok[r][k] += outs[i].num_token_ids;
      if (outs[i].finish_reason)
        finished[r][k] = outs[i].finish_reason;
    }
  }
  for (int r = 0; r < added; r++)
    for (int k = 0; k < nseq[r]; k++) {
      CHECK(finished[r][k], "request %d seq %d never finished", r, k);
      CHECK(ntok[r][k] <= max_tok[r], "request %d seq %d: %d tokens > max %d", r, k, ntok[r][k], max_tok[r]);
    }
  /* Requests that were not aborted give the same tokens when run alone on a roomy pool: batching,
   * chunking, preemption, forks and beams changed nothing. */
  int replayed = 0;
  for (int r = 0; r < added; r++) {
    int was_aborted = 0;
    for (int k = 0; k < nseq[r]; k++)
      was_aborted |= finished[r][k] == PAGODA_FINISH_ABORT;
    if (was_aborted)
      continue;
    CHECK(replay(&ep, &recs[r], ntok[r], nseq[r]) == 0, "seed %llu request %d differs when run alone",
          (unsigned long long)seed, r);
    replayed++;
  }
  struct pagoda_engine_stats st;
  pagoda_engine_stats(e, &st);
  CHECK(st.free_blocks == st.num_blocks && st.running == 0 && st.waiting == 0, "all blocks back (%d of %d)",
        st.free_blocks, st.num_blocks);
  printf("seed %llu paged %d prefix %d chunk %d bs %d seqs %d: %d requests (%d replayed alone), %d aborts, %lld preemptions, %lld steps\n",
         (unsigned long long)seed, paged, prefix, chunk, bs, max_seqs, added, replayed, aborted, (long long)st.preemptions,
         (long long)st.steps);
  pagoda_engine_free(e);
  return 0;
}

#ifdef __SANITIZE_ADDRESS__
#define DEFAULT_RUNS 2 /* the sanitizer build is ~20x slower */
#else
#define DEFAULT_RUNS 4
#endif

int main(void) {
  if (!test_shared_path("models/stories260K.gguf"))
    return test_skip("stories260K.gguf not found");
  for (int s = 0; s < (getenv("STRESS_RUNS") ? atoi(getenv("STRESS_RUNS")) : DEFAULT_RUNS) && test_failures == 0; s++)
    run(100 + (uint64_t)s, s % 3 != 2, s % 2 ? 16 : 0, (s / 3) % 2 ? 64 : 16, 8 << (s % 3), s % 4 == 3 ? 2 : 12);
  return test_finish("test_engine_stress");
}
