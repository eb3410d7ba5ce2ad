/* test_engine_beam.c - beam search in the engine (beams share blocks, fork, free the losers)
 * against a from-scratch beam search that recomputes every hypothesis with a fresh forward pass
 * over its whole token list (no cache sharing at all), on stories260K. The selection rule is the
 * one documented in docs/kv-cache.md (HF's: 2W candidates per round, EOS hypotheses only from
 * the first W ranks, sum_logprob / length^length_penalty). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "pagoda.h"
#include "test_util.h"

#define W 3
#define MAXOUT 20
#define EOS 2

static int32_t stop_id; /* "." : hypotheses of many lengths, so the length penalty matters */

static struct model *m;
static int vocab;
static float *logits;

/* log_softmax of the model's next-token logits after TOKENS (n). */
static void next_logprobs(const int32_t *tokens, int n, float *lp) {
  static int32_t pos[512], slots[512], table[16];
  int32_t qs[2] = {0, n}, lens[1] = {n}, idx[1] = {n - 1};
  for (int i = 0; i < n; i++) {
    pos[i] = i;
    slots[i] = 32 + i; /* blocks 1.. of 32 tokens */
  }
  for (int b = 0; b < 16; b++)
    table[b] = 1 + b;
  struct batch bt = {n, 1, 16, n, n, tokens, pos, slots, qs, lens, table, 1, idx};
  if (model_forward(m, &bt, logits))
    abort();
  double mx = -INFINITY, sum = 0;
  for (int v = 0; v < vocab; v++)
    mx = fmax(mx, logits[v]);
  for (int v = 0; v < vocab; v++)
    sum += exp(logits[v] - mx);
  for (int v = 0; v < vocab; v++)
    lp[v] = (float)(logits[v] - mx - log(sum));
}

struct hyp {
  int32_t tok[512];
  int n;      /* prompt + output */
  float sum;  /* cumulative logprob */
  float score;
};

struct cand {
  float s;
  int beam, tok;
};

static int cmp_cand(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  if (x->s != y->s)
    return x->s > y->s ? -1 : 1;
  return x->beam != y->beam ? x->beam - y->beam : x->tok - y->tok;
}

/* Reference beam search; OUT gets up to W finished hypotheses, best first. */
static int reference(const int32_t *prompt, int np, float lpen, struct hyp *out) {
  static struct hyp beams[W], next[W], fin[W];
  static float lp[W][512];
  int nb = 1, nf = 0;
  memcpy(beams[0].tok, prompt, (size_t)np * 4);
  beams[0].n = np;
  beams[0].sum = 0;
  for (int step = 0;; step++) {
    static struct cand c[W * 512];
    int nc = 0;
    for (int b = 0; b < nb; b++) {
      next_logprobs(beams[b].tok, beams[b].n, lp[b]);
      for (int v = 0; v < vocab; v++)
        c[nc++] = (struct cand){beams[b].sum + lp[b][v], b, v};
    }
    qsort(c, (size_t)nc, sizeof *c, cmp_cand);
    int nn = 0;
    for (int k = 0; k < 2 * W && nn < W; k++) {
      struct hyp *h = &beams[c[k].beam];
      int outlen = h->n - np + 1;
      if (c[k].tok == EOS || c[k].tok == stop_id) {
        if (k >= W)
          continue;
        struct hyp f = *h;
        f.tok[f.n++] = c[k].tok;
        f.sum = c[k].s;
        f.score = c[k].s / powf((float)outlen, lpen);
        int slot = nf < W ? nf++ : -1;
        if (slot < 0) {
          slot = 0;
          for (int i = 1; i < W; i++)
            if (fin[i].score < fin[slot].score)
              slot = i;
          if (fin[slot].score >= f.score)
            continue;
        }
        fin[slot] = f;
        continue;
      }
      next[nn] = *h;
      next[nn].tok[next[nn].n++] = c[k].tok;
      next[nn].sum = c[k].s;
      next[nn].score = c[k].s / powf((float)outlen, lpen);
      nn++;
    }
    memcpy(beams, next, sizeof next);
    nb = nn;
    float best = -INFINITY, worst = INFINITY;
    for (int b = 0; b < nb; b++)
      best = fmaxf(best, beams[b].score);
    for (int i = 0; i < nf; i++)
      worst = fminf(worst, fin[i].score);
    int length_done = nb && beams[0].n - np >= MAXOUT;
    if (length_done || nb == 0) {
      for (int b = 0; b < nb; b++) { /* all live beams become hypotheses */
        int slot = nf < W ? nf++ : -1;
        if (slot < 0) {
          slot = 0;
          for (int i = 1; i < W; i++)
            if (fin[i].score < fin[slot].score)
              slot = i;
          if (fin[slot].score >= beams[b].score)
            continue;
        }
        fin[slot] = beams[b];
      }
      break;
    }
    if (nf == W && best <= worst)
      break;
  }
  for (int i = 0; i < nf; i++) /* best first */
    for (int j = i + 1; j < nf; j++)
      if (fin[j].score > fin[i].score) {
        struct hyp t = fin[i];
        fin[i] = fin[j];
        fin[j] = t;
      }
  memcpy(out, fin, (size_t)nf * sizeof *fin);
  return nf;
}

int main(void) {
  const char *path = test_shared_path("models/stories260K.gguf");
  if (!path)
    return test_skip("stories260K.gguf not found");
  struct backend *be = backend_cpu_create(1);
  REQUIRE(be && (m = model_load(path, be)), "load");
  vocab = model_get_config(m)->vocab_size;
  REQUIRE(vocab <= 512 && model_alloc_cache(m, 18, 32, DTYPE_F32, 512, 1, 16) == 0, "cache");
  logits = malloc((size_t)vocab * sizeof *logits);

  const char *texts[3] = {"Once upon a time", "The little dog", "Lily and Tom went to the park"};
  const float lpens[3] = {1.0f, 0.0f, 2.0f};
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = path;
  ep.device = "cpu";
  ep.threads = 1;
  ep.max_num_seqs = 16;
  ep.max_model_len = 512;
  ep.pa_memory_mb = 8;
  int n_stopped = 0;
  for (int cfg = 0; cfg < 2; cfg++) {
    if (cfg == 1) { /* small steps: beams of different requests interleave with prompt chunks */
      ep.prefill_chunk_size = 3;
      ep.max_num_batched_tokens = 8;
    }
    pagoda_engine_t *e;
    REQUIRE(pagoda_engine_create(&ep, &e) == PAGODA_OK, "engine: %s", pagoda_last_error());
    int32_t dot[8];
    int nd = pagoda_tokenize(e, "a.", 2, 0, 0, dot, 8);
    REQUIRE(nd >= 1, "tokenize");
    stop_id = dot[nd - 1];
    uint64_t ids[3];
    int32_t prompts[3][64];
    int np[3];
    for (int r = 0; r < 3; r++) {
      np[r] = pagoda_tokenize(e, texts[r], strlen(texts[r]), 1, 0, prompts[r], 64);
      struct pagoda_sampling_params sp;
      pagoda_sampling_params_default(&sp);
      sp.beam_width = W;
      sp.length_penalty = lpens[r];
      sp.max_tokens = MAXOUT;
      sp.stop_token_ids = &stop_id;
      sp.n_stop_token_ids = 1;
      REQUIRE(pagoda_add_request_tokens(e, prompts[r], np[r], &sp, &ids[r]) == 0, "add: %s", pagoda_last_error());
    }
    int32_t got[3][W][MAXOUT + 1];
    int got_n[3][W], finished[3][W];
    memset(got_n, 0, sizeof got_n);
    memset(finished, 0, sizeof finished);
    while (pagoda_engine_has_work(e)) {
      const struct pagoda_output *outs;
      int n;
      REQUIRE(pagoda_engine_step(e, &outs, &n) == 0, "step");
      for (int i = 0; i < n; i++) {
        int r = (int)(outs[i].request_id - ids[0]);
        REQUIRE(r >= 0 && r < 3 && outs[i].index < W, "output");
        CHECK(outs[i].finish_reason != 0, "beams report only at the end");
        int k = outs[i].index;
        for (int j = 0; j < outs[i].num_token_ids && got_n[r][k] <= MAXOUT; j++)
          got[r][k][got_n[r][k]++] = outs[i].token_ids[j];
        finished[r][k] = outs[i].finish_reason;
      }
    }
    struct pagoda_engine_stats st;
    pagoda_engine_stats(e, &st);
    CHECK(st.free_blocks == st.num_blocks, "every beam's blocks returned");
    pagoda_engine_free(e);
    for (int r = 0; r < 3; r++) {
      struct hyp ref[W];
      int nref = reference(prompts[r], np[r], lpens[r], ref);
      CHECK(nref == W, "reference found %d hypotheses", nref);
      for (int k = 0; k < nref; k++)
        n_stopped += ref[k].tok[ref[k].n - 1] == stop_id;
      for (int k = 0; k < nref; k++) {
        int n = ref[k].n - np[r];
        CHECK(finished[r][k] && got_n[r][k] == n && !memcmp(got[r][k], ref[k].tok + np[r], (size_t)n * 4),
              "config %d request %d beam %d: %d tokens vs reference %d", cfg, r, k, got_n[r][k], n);
      }
    }
  }
  CHECK(n_stopped >= 4, "hypotheses that end at the stop token: %d", n_stopped);
  free(logits);
  model_free(m);
  be->ops->destroy(be);
  return test_finish("test_engine_beam");
}
