/* test_cuda_sampling.c - sampling on the GPU against the host sampler (sampling/sampler.c, the
 * reference), for every request kind.
 *
 * 1. Op level: the same random logits and parameters go through sampler_apply_processors +
 *    sampler_pick on the host, and through sampler_proc_entries -> ops->process -> ops->sample
 *    on the device, with the uniform draw u taken from identically seeded generators. The
 *    processed logits must be bitwise equal and the tokens equal (except a draw within 1e-5
 *    of an edge of the kept mass, which f32 summation order decides: counted and printed, as
 *    test_cuda_ops.c does), for greedy, temperature,
 *    top-k, top-p, min-p, their combinations, logit_bias (repeated ids included), repetition,
 *    presence and frequency penalties and suppression (min_tokens), over vocabularies of 1000,
 *    32000 and 128256.
 * 2. Engine level: the same requests (greedy, seeded temperature / top-k / top-p / min-p,
 *    penalties, logit_bias, min_tokens, logprobs + top logprobs, prompt logprobs, n = 3, beam
 *    search; different lengths, so sequences finish mid-run and the batch shrinks) run through
 *    an engine on the CUDA backend with device sampling and with PAGODA_DEVICE_SAMPLING=0 (host
 *    sampling of downloaded logits from the same forward passes), and with CUDA graphs on and
 *    off (PAGODA_CUDA_GRAPHS=0) at 32 and 6 sequences per step (at 6, the prompt-logprob rows are
 *    scored on the device in chunks): identical token ids, logprobs within 1e-4. Also
 *    ops->logprob_rows against sampler_logprob. Asynchronous steps (the step N + 1 launched
 *    before step N's ids are read) against PAGODA_ASYNC_STEPS=0 on the kinds that run them,
 *    at 32 and 6 sequences per step, and against host sampling.
 * 3. The ops that put every kind on the device: ops->sample_rows with several entries per row
 *    (the first step of n > 1: each sample its own seed) against sampler_pick per entry;
 *    ops->topk_rows (top logprobs, beam candidates: k = 0, 1, 5, 20, 2 x 64) against
 *    beam_candidates / sampler_logprob on rows with many ties (equal ids, values within 1e-4),
 *    straight and from the stash (ops->stash_rows before ops->process changes the rows). With
 *    these the engine-level runs above take logprobs, n = 3 and beams on the device too.
 * 4. ops->sample_async into both slots against sample_rows, and ops->resolve_ids. */
#include <math.h>

#include "gpu_pair.h"
#include "pagoda.h"
#include "core/beam.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

#define ROWS 24

static int failures;

struct kind {
  const char *name;
  float temperature, top_p, min_p, rep, presence, frequency;
  int top_k, num_bias, num_suppress;
};

static const struct kind kinds[] = {
    {"greedy", 0, 1, 0, 1, 0, 0, 0, 0, 0},
    {"temperature 1", 1, 1, 0, 1, 0, 0, 0, 0, 0},
    {"temperature 0.7", 0.7f, 1, 0, 1, 0, 0, 0, 0, 0},
    {"top_k 1", 1, 1, 0, 1, 0, 0, 1, 0, 0},
    {"top_k 40", 0.8f, 1, 0, 1, 0, 0, 40, 0, 0},
    {"top_p 0.9", 1, 0.9f, 0, 1, 0, 0, 0, 0, 0},
    {"top_p 0.5", 1.3f, 0.5f, 0, 1, 0, 0, 0, 0, 0},
    {"min_p 0.05", 1, 1, 0.05f, 1, 0, 0, 0, 0, 0},
    {"top_k 50 top_p 0.95 min_p 0.02", 0.9f, 0.95f, 0.02f, 1, 0, 0, 50, 0, 0},
    {"logit_bias", 1, 1, 0, 1, 0, 0, 0, 12, 0},
    {"logit_bias greedy", 0, 1, 0, 1, 0, 0, 0, 12, 0},
    {"repetition 1.3", 1, 1, 0, 1.3f, 0, 0, 0, 0, 0},
    {"repetition 0.8 greedy", 0, 1, 0, 0.8f, 0, 0, 0, 0, 0},
    {"presence 0.6 frequency 0.4", 1, 0.9f, 0, 1, 0.6f, 0.4f, 0, 0, 0},
    {"negative frequency", 0, 1, 0, 1, 0, -0.7f, 0, 0, 0},
    {"suppress (min_tokens)", 1, 1, 0, 1, 0, 0, 0, 0, 3},
    {"everything", 0.8f, 0.9f, 0.01f, 1.2f, 0.3f, 0.2f, 64, 8, 2},
};

/* One row's random history and parameters. */
struct row {
  int32_t *prompt, *output;
  int n_prompt, num_output;
  int32_t bias_ids[16], suppress[4];
  float bias_values[16];
  struct sampler_params sp;
  uint64_t seed;
};

static void make_row(struct row *r, const struct kind *k, int vocab) {
  r->n_prompt = pair_int(1, 300);
  r->num_output = pair_int(0, 200);
  r->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
  r->output = malloc(sizeof(int32_t) * (size_t)(r->num_output + 1));
  int pool = pair_int(5, 200); /* a small pool of ids, so tokens repeat */
  for (int i = 0; i < r->n_prompt; i++)
    r->prompt[i] = pair_int(0, pool < vocab ? pool : vocab - 1);
  for (int i = 0; i < r->num_output; i++)
    r->output[i] = pair_int(0, pool < vocab ? pool : vocab - 1);
  for (int i = 0; i < k->num_bias; i++) {
    r->bias_ids[i] = i % 3 == 2 ? r->bias_ids[i - 1] : pair_int(0, vocab - 1); /* repeated ids too */
    r->bias_values[i] = pair_rnd(i % 2 ? 100.0f : 5.0f);
  }
  for (int i = 0; i < k->num_suppress; i++)
    r->suppress[i] = pair_int(0, pool < vocab ? pool : vocab - 1);
  r->sp = (struct sampler_params){.temperature = k->temperature, .top_k = k->top_k, .top_p = k->top_p,
                                  .min_p = k->min_p, .repetition_penalty = k->rep,
                                  .presence_penalty = k->presence, .frequency_penalty = k->frequency,
                                  .bias_ids = r->bias_ids, .bias_values = r->bias_values, .num_bias = k->num_bias,
                                  .suppress_ids = r->suppress, .num_suppress = k->num_suppress};
  r->seed = test_rand(&pair_rng);
}

/* 1 when the draw U lies within EPS_MASS of an edge of the host token's interval of the kept
 * mass (kept ids in id order, as both samplers walk them) and the GPU picked a kept neighbour:
 * the GPU sums in f32 (relative error ~1e-6 of the total, see test_cuda_ops.c), the host in
 * double, so which side of such an edge the draw falls on is not defined by the rule. */
#define EPS_MASS 1e-5
static int draw_at_boundary(struct sampler *smp, const struct sampler_params *sp, const float *row, int host_tok,
                            int dev_tok, float u) {
  const int32_t *ids;
  const float *probs;
  int n = sampler_candidates(smp, sp, row, &ids, &probs);
  double lo = 0, p_host = -1, p_dev = -1;
  for (int i = 0; i < n; i++) {
    if (ids[i] < host_tok)
      lo += probs[ids[i]];
    if (ids[i] == host_tok)
      p_host = probs[ids[i]];
    if (ids[i] == dev_tok)
      p_dev = probs[ids[i]];
  }
  if (p_host < 0 || p_dev < 0)
    return 0;
  double hi = lo + p_host;
  return fabs((double)u - lo) < EPS_MASS || fabs((double)u - hi) < EPS_MASS;
}

static void test_kind(const struct kind *k, int vocab) {
  struct backend *g = pair_be[1];
  struct sampler smp;
  if (sampler_init(&smp, vocab))
    pair_die("sampler_init");
  size_t n = (size_t)ROWS * vocab;
  float *logits = malloc(n * sizeof(float)), *host = malloc(n * sizeof(float)), *dev = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) /* a peaked distribution: some logits far above the rest */
    logits[i] = test_randf(&pair_rng) * 4.0f + (test_rand(&pair_rng) % 97 == 0 ? 8.0f : 0.0f);
  memcpy(host, logits, n * sizeof(float));
  struct row rows[ROWS];
  int32_t host_tok[ROWS], dev_tok[ROWS];
  size_t cap = 0;
  for (int r = 0; r < ROWS; r++) {
    make_row(&rows[r], k, vocab);
    cap += (size_t)(k->num_bias + rows[r].n_prompt + rows[r].num_output + k->num_suppress);
  }
  struct backend_proc_entry *ent = malloc(sizeof *ent * (cap + 1));
  float *bias = malloc(sizeof(float) * (ROWS * 16 + 1));
  struct backend_sample_params params[ROWS];
  int ne = 0, nb = 0;
  for (int r = 0; r < ROWS; r++) {
    struct row *w = &rows[r];
    float *row = host + (size_t)r * vocab;
    sampler_apply_processors(&smp, &w->sp, row, w->prompt, w->n_prompt, w->output, w->num_output);
    struct rng rh, rd;
    rng_seed(&rh, w->seed);
    rng_seed(&rd, w->seed);
    host_tok[r] = sampler_pick(&smp, &w->sp, row, &rh);
    ne += sampler_proc_entries(&smp, &w->sp, w->prompt, w->n_prompt, w->output, w->num_output, r, ent + ne, bias, nb);
    nb += w->sp.num_bias;
    int greedy = w->sp.temperature <= 0 || w->sp.top_k == 1; /* as the engine maps them */
    params[r] = (struct backend_sample_params){greedy ? 0.0f : w->sp.temperature, w->sp.top_k, w->sp.top_p,
                                               w->sp.min_p, greedy ? 0.0f : (float)rng_uniform(&rd)};
  }
  float *d = g->ops->alloc(g, n * sizeof(float));
  if (!d || g->ops->upload(g, d, logits, n * sizeof(float)))
    pair_die("logits upload");
  if (ne && g->ops->process(g, d, vocab, ent, ne, bias, nb))
    pair_die("process");
  if (g->ops->download(g, dev, d, n * sizeof(float)))
    pair_die("download");
  int bad_logits = 0;
  for (size_t i = 0; i < n; i++)
    if (memcmp(&dev[i], &host[i], sizeof(float)) != 0 && !(isnan(dev[i]) && isnan(host[i])))
      bad_logits++;
  if (g->ops->sample(g, dev_tok, d, ROWS, vocab, params))
    pair_die("sample");
  int bad_tok = 0, near = 0;
  for (int r = 0; r < ROWS; r++) {
    if (dev_tok[r] == host_tok[r])
      continue;
    if (params[r].temperature > 0 && draw_at_boundary(&smp, &rows[r].sp, host + (size_t)r * vocab, host_tok[r],
                                                      dev_tok[r], params[r].u)) {
      near++; /* f32 summation order on the GPU may decide it: not compared */
      continue;
    }
    if (!bad_tok)
      printf("  row %d: host %d, cuda %d\n", r, host_tok[r], dev_tok[r]);
    bad_tok++;
  }
  printf("%-34s vocab %6d: %d entries, processed logits %s, tokens %d/%d equal%s\n", k->name, vocab, ne,
         bad_logits ? "DIFFER" : "bitwise equal", ROWS - bad_tok - near, ROWS,
         near ? " (the others: draw within 1e-5 of a boundary)" : "");
  if (bad_logits || bad_tok) {
    failures++;
    printf("FAIL %s vocab %d: %d logits differ, %d tokens differ\n", k->name, vocab, bad_logits, bad_tok);
  }
  g->ops->free(g, d);
  for (int r = 0; r < ROWS; r++) {
    free(rows[r].prompt);
    free(rows[r].output);
  }
  free(ent);
  free(bias);
  free(logits);
  free(host);
  free(dev);
  sampler_free(&smp);
}

/* ops->logprob_rows against sampler_logprob (the host's log softmax) on random rows. */
static void test_logprob_rows(int vocab, int n) {
  struct backend *g = pair_be[1];
  size_t sz = (size_t)n * vocab;
  float *x = malloc(sz * sizeof(float)), got[64];
  int32_t tg[64];
  for (size_t i = 0; i < sz; i++)
    x[i] = (test_randf(&pair_rng) - 0.5f) * 30.0f;
  for (int r = 0; r < n; r++)
    tg[r] = pair_int(0, vocab - 1);
  float *d = g->ops->alloc(g, sz * sizeof(float));
  if (!d || g->ops->upload(g, d, x, sz * sizeof(float)) || g->ops->logprob_rows(g, got, d, n, vocab, tg))
    pair_die("logprob_rows");
  int bad = 0;
  for (int r = 0; r < n; r++) {
    float want = sampler_logprob(x + (size_t)r * vocab, vocab, tg[r]);
    if (!(fabsf(got[r] - want) <= 1e-4f)) {
      if (!bad)
        printf("  row %d: cuda %.7g, host %.7g\n", r, got[r], want);
      bad++;
    }
  }
  printf("logprob_rows vocab %6d: %d/%d rows within 1e-4 of the host\n", vocab, n - bad, n);
  failures += bad != 0;
  g->ops->free(g, d);
  free(x);
}

/* ops->sample_rows: ENT entries over ROWS rows (entry i reads row i % rows, so rows repeat), each
 * with its own generator, against the host sampler on the processed row. */
static void test_sample_rows(int vocab, int rows, int ent) {
  struct backend *g = pair_be[1];
  struct sampler smp;
  if (sampler_init(&smp, vocab))
    pair_die("sampler_init");
  size_t sz = (size_t)rows * vocab;
  float *x = malloc(sz * sizeof(float));
  for (size_t i = 0; i < sz; i++)
    x[i] = test_randf(&pair_rng) * 4.0f + (test_rand(&pair_rng) % 97 == 0 ? 8.0f : 0.0f);
  int32_t *rmap = malloc(sizeof(int32_t) * ent), *tok = malloc(sizeof(int32_t) * ent);
  struct backend_sample_params *params = malloc(sizeof *params * ent);
  int32_t *want = malloc(sizeof(int32_t) * ent);
  for (int i = 0; i < ent; i++) {
    const struct kind *k = &kinds[i % (sizeof kinds / sizeof kinds[0])];
    struct sampler_params sp = {.temperature = k->temperature, .top_k = k->top_k, .top_p = k->top_p,
                                .min_p = k->min_p, .repetition_penalty = 1};
    struct rng rh, rd;
    uint64_t seed = test_rand(&pair_rng);
    rng_seed(&rh, seed);
    rng_seed(&rd, seed);
    rmap[i] = i % rows;
    want[i] = sampler_pick(&smp, &sp, x + (size_t)rmap[i] * vocab, &rh);
    int greedy = sp.temperature <= 0 || sp.top_k == 1;
    params[i] = (struct backend_sample_params){greedy ? 0.0f : sp.temperature, sp.top_k, sp.top_p, sp.min_p,
                                               greedy ? 0.0f : (float)rng_uniform(&rd)};
  }
  float *d = g->ops->alloc(g, sz * sizeof(float));
  if (!d || g->ops->upload(g, d, x, sz * sizeof(float)) || g->ops->sample_rows(g, tok, d, rmap, ent, vocab, params))
    pair_die("sample_rows");
  int bad = 0, near = 0;
  for (int i = 0; i < ent; i++) {
    if (tok[i] == want[i])
      continue;
    const struct kind *k = &kinds[i % (sizeof kinds / sizeof kinds[0])];
    struct sampler_params sp = {.temperature = k->temperature, .top_k = k->top_k, .top_p = k->top_p,
                                .min_p = k->min_p, .repetition_penalty = 1};
    if (params[i].temperature > 0 &&
        draw_at_boundary(&smp, &sp, x + (size_t)rmap[i] * vocab, want[i], tok[i], params[i].u)) {
      near++;
      continue;
    }
    if (!bad)
      printf("  entry %d (row %d, %s): host %d, cuda %d\n", i, rmap[i], k->name, want[i], tok[i]);
    bad++;
  }
  printf("sample_rows vocab %6d: %d entries over %d rows, %d equal%s\n", vocab, ent, rows, ent - bad - near,
         near ? " (the others: draw within 1e-5 of a boundary)" : "");
  failures += bad != 0;
  g->ops->free(g, d);
  free(x);
  free(rmap);
  free(tok);
  free(params);
  free(want);
  sampler_free(&smp);
}

/* ops->topk_rows against beam_candidates (top-k) and sampler_logprob (targets), on rows whose
 * values repeat (multiples of 1/8, so ties at the k-th value are common); STASH: the rows go
 * through ops->stash_rows, then ops->process sets some of them to -inf, and the top-k is taken
 * from the stash (the raw rows). */
static void test_topk_rows(int vocab, int n, int k, int stash) {
  struct backend *g = pair_be[1];
  int rows = n > 3 ? n - 2 : n;
  size_t sz = (size_t)rows * vocab;
  float *x = malloc(sz * sizeof(float));
  for (size_t i = 0; i < sz; i++)
    x[i] = (float)pair_int(-80, 40) / 8.0f;
  int32_t *rmap = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
  int32_t *ids = malloc(sizeof(int32_t) * ((size_t)n * k + 1)), *want_ids = malloc(sizeof(int32_t) * (k + 1));
  float *lps = malloc(sizeof(float) * ((size_t)n * k + 1)), *want_lps = malloc(sizeof(float) * (k + 1));
  float *tlp = malloc(sizeof(float) * n);
  for (int i = 0; i < n; i++) {
    rmap[i] = i % rows; /* rows repeat when n > rows */
    tg[i] = pair_int(0, vocab - 1);
  }
  float *d = g->ops->alloc(g, sz * sizeof(float));
  if (!d || g->ops->upload(g, d, x, sz * sizeof(float)))
    pair_die("topk upload");
  const float *src = d;
  if (stash) {
    struct backend_proc_entry ent[8];
    int32_t all[64];
    for (int i = 0; i < rows && i < 64; i++)
      all[i] = i;
    if (g->ops->stash_rows(g, d, vocab, all, rows))
      pair_die("stash_rows");
    for (int i = 0; i < 8; i++) /* -inf over some of the largest candidates */
      ent[i] = (struct backend_proc_entry){.row = i % rows, .id = (i * 7919) % vocab, .rep = 1.0f, .suppress = 1};
    if (g->ops->process(g, d, vocab, ent, 8, NULL, 0))
      pair_die("process");
    src = NULL;
  }
  if (g->ops->topk_rows(g, ids, lps, tlp, src, vocab, rmap, tg, n, k))
    pair_die("topk_rows");
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const float *row = x + (size_t)rmap[i] * vocab;
    if (k)
      beam_candidates(row, vocab, k, want_ids, want_lps);
    float want_t = sampler_logprob(row, vocab, tg[i]);
    int ok = fabsf(tlp[i] - want_t) <= 1e-4f;
    for (int j = 0; j < k; j++)
      ok &= ids[(size_t)i * k + j] == want_ids[j] && fabsf(lps[(size_t)i * k + j] - want_lps[j]) <= 1e-4f;
    if (!ok && !bad) {
      printf("  entry %d (row %d): target %.7g vs host %.7g", i, rmap[i], tlp[i], want_t);
      for (int j = 0; j < k && j < 4; j++)
        printf("; #%d cuda %d %.6g host %d %.6g", j, ids[(size_t)i * k + j], lps[(size_t)i * k + j], want_ids[j],
               want_lps[j]);
      printf("\n");
    }
    bad += !ok;
  }
  printf("topk_rows vocab %6d k %3d%s: %d/%d entries equal (ids, values within 1e-4)\n", vocab, k,
         stash ? " from the stash" : "", n - bad, n);
  failures += bad != 0;
  g->ops->free(g, d);
  free(x);
  free(rmap);
  free(tg);
  free(ids);
  free(want_ids);
  free(lps);
  free(want_lps);
  free(tlp);
}

/* ---- engine level ---- */

#define MAX_REQ 16
struct result {
  int n;                 /* outputs collected (one per sequence) */
  int32_t ids[MAX_REQ * 3 + 8][64];
  int n_ids[MAX_REQ * 3 + 8];
  float lp[MAX_REQ * 3 + 8][64];
  float top_lp[MAX_REQ * 3 + 8][64 * 4];
  float prompt_lp[MAX_REQ * 3 + 8][64];
  int n_prompt_lp[MAX_REQ * 3 + 8];
};

/* ASYNC_MIX: only the kinds that run asynchronous steps (no penalties, logprobs, n > 1, beams or
 * prompt logprobs), lengths from 3 to 32, so sequences finish at many different steps while the
 * next one is already launched. EOS is ignored: a sequence that stops on a token stays in the
 * next (already launched) step, which changes that batch's padded size and with it the bf16
 * rounding of the other rows, as any other change of batch composition would; the CPU test
 * (test_engine_async) covers those finishes. */
static int async_mix;

static void request_params(int i, struct pagoda_sampling_params *sp) {
  pagoda_sampling_params_default(sp);
  if (async_mix) {
    static const int32_t ab_ids[2] = {10, 20};
    static const float ab_values[2] = {2.5f, -100.0f};
    static const float temps[6] = {0, 1, 0.7f, 1, 1, 0.8f};
    sp->seed = 2000 + i;
    sp->max_tokens = 3 + (i * 7) % 30;
    sp->ignore_eos = 1;
    sp->temperature = temps[i % 6];
    sp->top_k = i % 6 == 2 ? 20 : 0;
    sp->top_p = i % 6 == 3 ? 0.85f : 1;
    sp->min_p = i % 6 == 4 ? 0.1f : 0;
    if (i % 6 == 5) {
      sp->logit_bias_ids = ab_ids;
      sp->logit_bias_values = ab_values;
      sp->n_logit_bias = 2;
    }
    sp->min_tokens = i % 4 == 1 ? 2 : 0;
    return;
  }
  static const int32_t bias_ids[3] = {10, 20, 10};
  static const float bias_values[3] = {2.5f, -100.0f, 1.0f};
  sp->max_tokens = 24 + i % 5;
  sp->seed = 1000 + i;
  sp->ignore_eos = 1;
  switch (i % 11) {
  case 0: sp->temperature = 0; break;
  case 1: break; /* temperature 1 */
  case 2: sp->temperature = 0.7f; sp->top_k = 20; break;
  case 3: sp->top_p = 0.85f; break;
  case 4: sp->min_p = 0.1f; break;
  case 5: sp->repetition_penalty = 1.4f; sp->presence_penalty = 0.5f; sp->frequency_penalty = 0.3f; break;
  case 6: sp->logit_bias_ids = bias_ids; sp->logit_bias_values = bias_values; sp->n_logit_bias = 3; break;
  case 7: sp->logprobs = 1; sp->top_logprobs = 4; sp->temperature = 0.9f; break;
  case 8: sp->prompt_logprobs = 1; sp->temperature = 0; break;
  case 9: sp->n = 3; sp->temperature = 1.1f; break;
  case 10: sp->beam_width = 3; sp->temperature = 0; sp->max_tokens = 12; break;
  }
  sp->min_tokens = i % 4 == 1 ? 5 : 0;
}

static int run_engine(const char *model, int device_sampling, int graphs, int max_seqs, struct result *res) {
  setenv("PAGODA_DEVICE_SAMPLING", device_sampling ? "1" : "0", 1);
  setenv("PAGODA_CUDA_GRAPHS", graphs ? "1" : "0", 1);
  if (!getenv("PAGODA_ASYNC_STEPS"))
    setenv("PAGODA_ASYNC_STEPS", "1", 1);
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  ep.model = model;
  ep.device = "cuda";
  ep.block_size = 16;
  ep.max_num_seqs = max_seqs;
  ep.max_num_batched_tokens = 512;
  ep.pa_memory_mb = 64;
  pagoda_engine_t *e;
  if (pagoda_engine_create(&ep, &e) != PAGODA_OK) {
    fprintf(stderr, "engine: %s\n", pagoda_last_error());
    return -1;
  }
  memset(res, 0, sizeof *res);
  uint64_t ids[MAX_REQ];
  for (int i = 0; i < MAX_REQ; i++) {
    int32_t prompt[24];
    int np = 4 + i % 17;
    for (int t = 0; t < np; t++)
      prompt[t] = 1 + (i * 37 + t * 11) % 400;
    struct pagoda_sampling_params sp;
    request_params(i, &sp);
    if (pagoda_add_request_tokens(e, prompt, np, &sp, &ids[i]) != PAGODA_OK) {
      fprintf(stderr, "add request %d: %s\n", i, pagoda_last_error());
      return -1;
    }
  }
  while (pagoda_engine_has_work(e)) {
    const struct pagoda_output *outs;
    int n;
    if (pagoda_engine_step(e, &outs, &n) != PAGODA_OK) {
      fprintf(stderr, "step: %s\n", pagoda_last_error());
      return -1;
    }
    for (int k = 0; k < n; k++) {
      const struct pagoda_output *o = &outs[k];
      int slot = (int)(o->request_id - ids[0]) * 3 + o->index;
      for (int j = 0; j < o->num_token_ids && res->n_ids[slot] < 64; j++) {
        int at = res->n_ids[slot]++;
        res->ids[slot][at] = o->token_ids[j];
        if (o->logprobs) {
          res->lp[slot][at] = o->logprobs[j];
          for (int t = 0; t < o->num_top_logprobs && t < 4; t++)
            res->top_lp[slot][at * 4 + t] = o->top_logprobs[(size_t)j * o->num_top_logprobs + t];
        }
      }
      for (int j = 0; j < o->num_prompt_logprobs && j < 64; j++)
        res->prompt_lp[slot][j] = o->prompt_logprobs[j];
      if (o->num_prompt_logprobs)
        res->n_prompt_lp[slot] = o->num_prompt_logprobs < 64 ? o->num_prompt_logprobs : 64;
    }
  }
  pagoda_engine_free(e);
  return 0;
}

static int close_lp(const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++)
    if (!(fabsf(a[i] - b[i]) <= 1e-4f) && !(isinf(a[i]) && a[i] == b[i]))
      return 0;
  return 1;
}

/* Compares two runs sequence by sequence; returns the number that differ. */
static int compare(const char *what, const struct result *a, const struct result *b) {
  int seqs = 0, bad = 0;
  for (int s = 0; s < MAX_REQ * 3; s++) {
    if (!a->n_ids[s] && !b->n_ids[s])
      continue;
    seqs++;
    int ok = a->n_ids[s] == b->n_ids[s] && !memcmp(a->ids[s], b->ids[s], sizeof(int32_t) * a->n_ids[s]) &&
             close_lp(a->lp[s], b->lp[s], a->n_ids[s]) && close_lp(a->top_lp[s], b->top_lp[s], a->n_ids[s] * 4) &&
             a->n_prompt_lp[s] == b->n_prompt_lp[s] && close_lp(a->prompt_lp[s], b->prompt_lp[s], a->n_prompt_lp[s]);
    if (!ok) {
      bad++;
      printf("FAIL %s: request %d sample %d (kind %d) differs: %d vs %d tokens\n", what, s / 3, s % 3,
             (s / 3) % 11, a->n_ids[s], b->n_ids[s]);
    }
  }
  printf("%s: %d sequences, %d equal\n", what, seqs, seqs - bad);
  return bad || seqs < MAX_REQ ? 1 : 0;
}

static void test_engine(void) {
  const char *td = getenv("PAGODA_TESTDATA");
  char model[1024];
  snprintf(model, sizeof model, "%s/models/stories260K.gguf", td ? td : "../shared/testdata");
  if (access(model, R_OK) != 0) {
    printf("engine level: %s missing: FAIL\n", model);
    failures++;
    return;
  }
  static struct result dev, host, nograph, dev6, nograph6, host6;
  if (run_engine(model, 1, 1, 32, &dev) || run_engine(model, 0, 1, 32, &host) ||
      run_engine(model, 1, 0, 32, &nograph) || run_engine(model, 1, 1, 6, &dev6) ||
      run_engine(model, 1, 0, 6, &nograph6) || run_engine(model, 0, 1, 6, &host6)) {
    failures++;
    return;
  }
  failures += compare("device vs host sampling (graphs on)", &dev, &host);
  failures += compare("device vs host sampling, 6 sequences (prompt logprobs in chunks)", &dev6, &host6);
  failures += compare("graphs on vs off (32 sequences)", &dev, &nograph);
  failures += compare("graphs on vs off (6 sequences, the rest waiting)", &dev6, &nograph6);

  /* Asynchronous steps against synchronous ones (PAGODA_ASYNC_STEPS=0) on the kinds that run
   * them, device sampling and graphs on, at 32 sequences per step and at 6 (requests admitted
   * as others finish); and the full mix above with them on (its synchronous requests make
   * those steps synchronous until they leave) against host sampling. */
  static struct result as, sy, as6, sy6;
  async_mix = 1;
  setenv("PAGODA_ASYNC_STEPS", "1", 1);
  int bad = run_engine(model, 1, 1, 32, &as) || run_engine(model, 1, 1, 6, &as6);
  setenv("PAGODA_ASYNC_STEPS", "0", 1);
  bad = bad || run_engine(model, 1, 1, 32, &sy) || run_engine(model, 1, 1, 6, &sy6) ||
        run_engine(model, 0, 1, 32, &host);
  setenv("PAGODA_ASYNC_STEPS", "1", 1);
  async_mix = 0;
  if (bad) {
    failures++;
    return;
  }
  failures += compare("asynchronous vs synchronous steps (32 sequences)", &as, &sy);
  failures += compare("asynchronous vs synchronous steps (6 sequences)", &as6, &sy6);
  failures += compare("asynchronous steps vs host sampling", &as, &host);
}

/* ops->sample_async into both slots (read back in the other order) against sample_rows, and
 * ops->resolve_ids: ids < 0 become the ids each slot sampled. */
static void test_async_ops(int vocab) {
  struct backend *g = pair_be[1];
  if (!g->ops->sample_async || !g->ops->sample_wait || !g->ops->resolve_ids || !g->caps.async_steps) {
    printf("FAIL: the cuda backend does not declare asynchronous steps\n");
    failures++;
    return;
  }
  enum { N = 12, STRIDE = 32, T = 40 };
  if (g->ops->reserve(g, 64, STRIDE, 8))
    pair_die("reserve");
  size_t sz = (size_t)N * vocab;
  float *x = malloc(sz * sizeof(float));
  for (size_t i = 0; i < sz; i++)
    x[i] = test_randf(&pair_rng) * 4.0f;
  int32_t rows[2][N], want[2][N], got[2][N], ids[T], res[T], expect[T];
  struct backend_sample_params params[2][N];
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < N; i++) {
      rows[k][i] = k ? N - 1 - i : i;
      params[k][i] = (struct backend_sample_params){i % 3 ? 0.8f : 0.0f, i % 4 == 1 ? 20 : 0, 1.0f, 0.0f,
                                                   (float)(test_rand(&pair_rng) % 1000) / 1000.0f};
    }
  float *d = g->ops->alloc(g, sz * sizeof(float));
  int32_t *dids = g->ops->alloc(g, sizeof ids);
  if (!d || !dids || g->ops->upload(g, d, x, sz * sizeof(float)))
    pair_die("alloc");
  for (int k = 0; k < 2; k++)
    if (g->ops->sample_rows(g, want[k], d, rows[k], N, vocab, params[k]))
      pair_die("sample_rows");
  if (g->ops->sample_async(g, 0, d, rows[0], N, vocab, params[0]) ||
      g->ops->sample_async(g, 1, d, rows[1], N, vocab, params[1]) || g->ops->sample_wait(g, 1, got[1], N) ||
      g->ops->sample_wait(g, 0, got[0], N))
    pair_die("sample_async");
  int bad = memcmp(want, got, sizeof want) != 0;
  for (int t = 0; t < T; t++) {
    int kind = t % 3, i = (t * 5) % N;
    ids[t] = kind == 0 ? t * 3 : kind == 1 ? -1 - i : -1 - (STRIDE + i);
    expect[t] = kind == 0 ? t * 3 : got[kind - 1][i];
  }
  if (g->ops->upload(g, dids, ids, sizeof ids) || g->ops->resolve_ids(g, dids, T, STRIDE) ||
      g->ops->download(g, res, dids, sizeof res))
    pair_die("resolve_ids");
  int bad_ids = memcmp(res, expect, sizeof res) != 0;
  printf("sample_async vocab %6d: %d entries in each slot %s sample_rows; resolve_ids %s\n", vocab, N,
         bad ? "DIFFER from" : "equal to", bad_ids ? "WRONG" : "right");
  failures += bad + bad_ids;
  g->ops->free(g, d);
  g->ops->free(g, dids);
  free(x);
}

int main(void) {
  pair_seed();
  if (!pair_open())
    return 77;
  if (!pair_be[1]->ops->sample || !pair_be[1]->ops->process || !pair_be[1]->caps.device_sampling) {
    printf("FAIL: the cuda backend does not declare device sampling\n");
    return 1;
  }
  static const int vocabs[] = {1000, 32000, 128256};
  for (size_t v = 0; v < 3; v++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
      test_kind(&kinds[k], vocabs[v]);
  test_logprob_rows(1000, 40);
  test_logprob_rows(128256, 40);
  if (!pair_be[1]->ops->sample_rows || !pair_be[1]->ops->topk_rows || !pair_be[1]->ops->stash_rows) {
    printf("FAIL: the cuda backend lacks sample_rows / topk_rows / stash_rows\n");
    failures++;
  } else {
    test_sample_rows(32000, 5, 40);
    test_sample_rows(128256, 3, 300); /* more entries than one launch holds before reserve */
    static const int ks[] = {0, 1, 5, 20, 128};
    for (size_t i = 0; i < 5; i++) {
      test_topk_rows(1000, 12, ks[i], 0);
      test_topk_rows(128256, 12, ks[i], 0);
    }
    test_topk_rows(32000, 9, 20, 1);
    test_topk_rows(128256, 40, 4, 1);
  }
  test_async_ops(1000);
  test_async_ops(128256);
  test_engine();
  pair_close();
  printf(failures ? "FAILED: %d\n" : "all passed\n", failures);
  return failures ? 1 : 0;
}
