/* test_engine_prompt_logprobs.c - sampling param prompt_logprobs on stories260K: the engine's
 * log P(prompt[i+1] | prompt[..i]) equal a log-softmax (double) of the logits of one plain
 * prefill through model_forward, for every position, whether the prompt runs alone, in prefill
 * chunks beside other requests, or after a request that put its prefix in the prefix cache
 * (which a prompt_logprobs request must not use); reported once, on sample 0; refused with beam
 * search. The perplexity command is built on this. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "pagoda.h"
#include "test_util.h"
#include "util/log.h"

enum { N = 150, V = 512, BS = 32, MAXB = 8 };

static int32_t prompt[N], other[N];
static double ref[N - 1];

/* Reference: one prefill of PROMPT alone, logits of every position, log-softmax in double. */
static int reference(const char *path) {
  struct backend *be = backend_cpu_create(2);
  REQUIRE(be, "backend: %s", err_last());
  struct model *m = model_load(path, be);
  REQUIRE(m, "model_load: %s", err_last_where());
  REQUIRE(model_get_config(m)->vocab_size == V, "stories260K vocab");
  REQUIRE(model_alloc_cache(m, MAXB + 1, BS, DTYPE_F32, N, 1, MAXB) == 0, "alloc: %s", err_last());
  int32_t pos[N], slots[N], lidx[N], qs[2] = {0, N}, lens[1] = {N}, table[MAXB];
  for (int b = 0; b < MAXB; b++)
    table[b] = b + 1;
  for (int i = 0; i < N; i++) {
    pos[i] = i;
    slots[i] = table[i / BS] * BS + i % BS;
    lidx[i] = i;
  }
  struct batch b = {.num_tokens = N, .num_seqs = 1, .max_blocks_per_seq = MAXB, .max_seq_len = N,
                    .max_query_len = N, .input_ids = prompt, .positions = pos, .slot_mapping = slots,
                    .query_start = qs, .seq_lens = lens, .block_tables = table, .num_logits = N,
                    .logits_idx = lidx};
  float *lg = malloc(sizeof(float) * N * V);
  REQUIRE(lg && model_forward(m, &b, lg) == 0, "forward: %s", err_last_where());
  for (int i = 0; i < N - 1; i++) {
    const float *r = lg + (size_t)i * V;
    double mx = r[0], s = 0;
    for (int v = 1; v < V; v++)
      mx = r[v] > mx ? r[v] : mx;
    for (int v = 0; v < V; v++)
      s += exp(r[v] - mx);
    ref[i] = r[prompt[i + 1]] - mx - log(s);
  }
  free(lg);
  model_free(m);
  be->ops->destroy(be);
  return 0;
}

/* Runs requests for PROMPT (with prompt_logprobs) and, when WITH_OTHER, OTHER (without) together
 * until idle; checks the logprobs against the reference, reported exactly once. */
static int run(const char *path, int chunk, int prefix_cache, int with_other, const char *what) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = path;
  ep.device = "cpu";
  ep.threads = 2;
  ep.cache_type = PAGODA_CACHE_TYPE_F32;
  ep.max_num_seqs = 4;
  ep.max_model_len = N + 8;
  ep.pa_context_len = N + 8;
  ep.prefill_chunk_size = chunk;
  ep.max_num_batched_tokens = chunk < 64 ? 2 * chunk : 512;
  ep.prefix_cache_n = prefix_cache;
  pagoda_engine_t *e;
  REQUIRE(pagoda_engine_create(&ep, &e) == PAGODA_OK, "%s: create: %s", what, pagoda_last_error());
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = 3;
  uint64_t id, oid = 0;
  if (prefix_cache) { /* puts PROMPT's first blocks into the prefix cache first */
    REQUIRE(pagoda_add_request_tokens(e, prompt, 100, &sp, &oid) == PAGODA_OK, "add: %s", pagoda_last_error());
    while (pagoda_engine_has_work(e)) {
      const struct pagoda_output *outs;
      int n;
      REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "step");
      for (int i = 0; i < n; i++)
        CHECK(!outs[i].prompt_logprobs && !outs[i].num_prompt_logprobs, "%s: none unasked", what);
    }
  }
  if (with_other)
    REQUIRE(pagoda_add_request_tokens(e, other, N, &sp, &oid) == PAGODA_OK, "add: %s", pagoda_last_error());
  struct pagoda_sampling_params lp = sp;
  lp.prompt_logprobs = 1;
  lp.n = 2;
  lp.temperature = 1;
  lp.seed = 5;
  REQUIRE(pagoda_add_request_tokens(e, prompt, N, &lp, &id) == PAGODA_OK, "add: %s", pagoda_last_error());
  int reports = 0;
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int n;
    REQUIRE(pagoda_engine_step(e, &outs, &n) == PAGODA_OK, "%s: step: %s", what, pagoda_last_error());
    for (int i = 0; i < n; i++) {
      const struct pagoda_output *o = &outs[i];
      if (!o->prompt_logprobs)
        continue;
      reports++;
      CHECK(o->request_id == id && o->index == 0, "%s: reported on sample 0 of the asking request", what);
      REQUIRE(o->num_prompt_logprobs == N - 1, "%s: %d logprobs", what, o->num_prompt_logprobs);
      double worst = 0;
      for (int k = 0; k < N - 1; k++)
        worst = fmax(worst, fabs(o->prompt_logprobs[k] - ref[k]));
      CHECK(worst < 2e-4, "%s: max |logprob - reference| = %g", what, worst);
    }
  }
  CHECK(reports == 1, "%s: reported %d times", what, reports);
  if (prefix_cache) {
    struct pagoda_engine_stats st;
    pagoda_engine_stats(e, &st);
    CHECK(st.prompt_tokens_computed >= 100 + N, "%s: the logprobs prompt was computed in full (%lld)", what,
          (long long)st.prompt_tokens_computed);
  }
  pagoda_engine_free(e);
  return 0;
}

int main(void) {
  const char *path = test_shared_path("models/stories260K.gguf");
  if (!path)
    return test_skip("stories260K.gguf not found (set PAGODA_TESTDATA)");
  uint64_t st = 42;
  prompt[0] = other[0] = 1; /* BOS */
  for (int i = 1; i < N; i++) {
    prompt[i] = 3 + (int)(test_rand(&st) % (V - 3));
    other[i] = 3 + (int)(test_rand(&st) % (V - 3));
  }
  if (reference(path))
    return test_finish("test_engine_prompt_logprobs");
  run(path, 4096, 0, 0, "alone");
  run(path, 7, 0, 1, "chunks of 7 beside another request");
  run(path, 4096, 16, 0, "after its prefix was cached");

  /* refused with beam search; the engine keeps serving */
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = path;
  ep.device = "cpu";
  ep.threads = 2;
  ep.max_num_seqs = 8;
  pagoda_engine_t *e;
  REQUIRE(pagoda_engine_create(&ep, &e) == PAGODA_OK, "create");
  struct pagoda_sampling_params sp;
  pagoda_sampling_params_default(&sp);
  sp.prompt_logprobs = 1;
  sp.beam_width = 2;
  sp.max_tokens = 2;
  uint64_t id;
  CHECK(pagoda_add_request_tokens(e, prompt, 20, &sp, &id) == PAGODA_ERR_INVALID_ARG &&
            strstr(pagoda_last_error(), "beam"),
        "beam + prompt_logprobs refused: %s", pagoda_last_error());
  pagoda_engine_free(e);
  return test_finish("test_engine_prompt_logprobs");
}
