/* test_sampler.c - greedy ties, top-k/top-p/min-p masks on crafted logits and against HF's
 * definitions on random logits, seeded determinism, sampling frequencies, and penalties against
 * hand-computed values per the OpenAI (presence/frequency) and HF/CTRL (repetition) definitions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling/sampler.h"
#include "test_util.h"

#define V 64

static struct sampler s;

/* The kept set as a 0/1 mask. */
static void mask_of(const struct sampler_params *p, const float *logits, int *mask) {
  const int32_t *ids;
  const float *probs;
  int n = sampler_candidates(&s, p, logits, &ids, &probs);
  memset(mask, 0, V * sizeof *mask);
  double sum = 0;
  for (int i = 0; i < n; i++) {
    mask[ids[i]] = 1;
    sum += probs[ids[i]];
  }
  CHECK(n == 0 || fabs(sum - 1) < 1e-5, "renormalized: sum %g", sum);
}

static int mask_is(const int *mask, const int *want_ids, int n_want) {
  int want[V] = {0};
  for (int i = 0; i < n_want; i++)
    want[want_ids[i]] = 1;
  return !memcmp(mask, want, sizeof want);
}

static void set_logprobs(float *logits, const double *p, int n) {
  for (int i = 0; i < V; i++)
    logits[i] = i < n ? (float)log(p[i]) : -INFINITY;
}

/* HF transformers' warpers, written from their definitions: temperature, TopK (keep scores >=
 * the k-th largest), TopP (sort ascending, drop cumulative <= 1 - top_p, keep >= 1), MinP (drop
 * probs < min_p * max prob), each on the previous one's filtered scores. Double precision. */
static void hf_reference(const float *logits, float temp, int top_k, float top_p, float min_p, int *keep) {
  double sc[V];
  for (int i = 0; i < V; i++)
    sc[i] = logits[i] / temp;
  if (top_k > 0 && top_k < V) {
    double sorted[V];
    memcpy(sorted, sc, sizeof sorted);
    for (int i = 0; i < V; i++) /* selection sort descending: tiny V */
      for (int j = i + 1; j < V; j++)
        if (sorted[j] > sorted[i]) {
          double t = sorted[i];
          sorted[i] = sorted[j];
          sorted[j] = t;
        }
    for (int i = 0; i < V; i++)
      if (sc[i] < sorted[top_k - 1])
        sc[i] = -INFINITY;
  }
  if (top_p < 1) {
    double mx = -INFINITY, sum = 0, pr[V];
    for (int i = 0; i < V; i++)
      mx = fmax(mx, sc[i]);
    for (int i = 0; i < V; i++)
      sum += (pr[i] = exp(sc[i] - mx));
    int idx[V];
    for (int i = 0; i < V; i++)
      idx[i] = i;
    for (int i = 0; i < V; i++) /* ascending by prob */
      for (int j = i + 1; j < V; j++)
        if (pr[idx[j]] < pr[idx[i]]) {
          int t = idx[i];
          idx[i] = idx[j];
          idx[j] = t;
        }
    double cum = 0;
    for (int i = 0; i < V - 1; i++) { /* the last (largest) is always kept */
      cum += pr[idx[i]] / sum;
      if (cum <= 1 - top_p)
        sc[idx[i]] = -INFINITY;
    }
  }
  if (min_p > 0) {
    double mx = -INFINITY;
    for (int i = 0; i < V; i++)
      mx = fmax(mx, sc[i]);
    for (int i = 0; i < V; i++)
      if (exp(sc[i] - mx) < min_p)
        sc[i] = -INFINITY;
  }
  for (int i = 0; i < V; i++)
    keep[i] = sc[i] != -INFINITY;
}

struct pd {
  double p;
  int id;
};

static int cmp_pd(const void *a, const void *b) {
  const struct pd *x = a, *y = b;
  if (x->p != y->p)
    return x->p > y->p ? -1 : 1;
  return x->id - y->id;
}

/* A large vocabulary (more than SAMPLER_SORT_MAX candidates) takes the bucketed top-p path: same set as a full sort (HF's rule), and
 * probabilities within 1e-6 of exact softmax. */
static void large_vocab(void) {
  enum { LV = 40000 };
  struct sampler big;
  if (sampler_init(&big, LV)) {
    CHECK(0, "init");
    return;
  }
  float *lg = malloc(LV * sizeof *lg);
  struct pd *ref = malloc(LV * sizeof *ref);
  int *keep = malloc(LV * sizeof *keep);
  uint64_t st = 777;
  const float tps[3] = {0.5f, 0.9f, 0.99f}, temps[2] = {0.7f, 1.3f};
  for (int trial = 0; trial < 12; trial++) {
    for (int i = 0; i < LV; i++) /* a peaked distribution: a few strong tokens, a long tail */
      lg[i] = 6 * test_randf(&st) * test_randf(&st) * test_randf(&st);
    struct sampler_params q = {.temperature = temps[trial % 2], .top_p = tps[trial % 3], .repetition_penalty = 1};
    q.min_p = trial >= 6 ? 0.01f : 0;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < LV; i++)
      mx = fmax(mx, lg[i]);
    for (int i = 0; i < LV; i++) {
      ref[i].p = exp((lg[i] - mx) / q.temperature);
      ref[i].id = i;
      sum += ref[i].p;
    }
    qsort(ref, LV, sizeof *ref, cmp_pd);
    memset(keep, 0, LV * sizeof *keep);
    double before = 0;
    int nk = 0;
    for (int i = 0; i < LV && before < q.top_p * sum; i++) {
      before += ref[i].p;
      if (ref[i].p >= q.min_p * ref[0].p)
        keep[ref[i].id] = 1, nk++;
    }
    const int32_t *ids;
    const float *pr;
    int n = sampler_candidates(&big, &q, lg, &ids, &pr);
    int same = n == nk;
    double kept_sum = 0, worst = 0;
    for (int i = 0; i < LV; i++)
      if (keep[i])
        kept_sum += exp((lg[i] - mx) / q.temperature);
    for (int i = 0; i < n && same; i++) {
      same &= keep[ids[i]];
      double exact = exp((lg[ids[i]] - mx) / q.temperature) / kept_sum;
      worst = fmax(worst, fabs(pr[ids[i]] - exact) / exact);
    }
    CHECK(same, "trial %d: top-p %g over %d tokens: %d kept, reference %d", trial, q.top_p, LV, n, nk);
    CHECK(worst < 1e-6, "trial %d: probability relative error %g", trial, worst);
  }
  free(lg);
  free(ref);
  free(keep);
  sampler_free(&big);
}

int main(void) {
  REQUIRE(sampler_init(&s, V) == 0, "init");
  float logits[V];
  struct sampler_params p = {.temperature = 1, .top_p = 1, .repetition_penalty = 1};
  struct rng r;
  rng_seed(&r, 1);

  /* Greedy is exactly argmax, first index on ties. */
  struct sampler_params g = p;
  g.temperature = 0;
  for (int i = 0; i < V; i++)
    logits[i] = (float)(i % 7);
  CHECK(sampler_pick(&s, &g, logits, &r) == 6, "first of the tied maxima");
  logits[40] = 6.5f;
  CHECK(sampler_pick(&s, &g, logits, &r) == 40, "strict max");

  int mask[V];
  /* top-k keeps every token tied with the k-th largest logit (HF: scores < kth value removed). */
  memset(logits, 0, sizeof logits);
  logits[3] = 5;
  logits[9] = 4;
  logits[11] = 4;
  logits[20] = 4;
  logits[30] = 3;
  struct sampler_params k = p;
  k.top_k = 1;
  mask_of(&k, logits, mask);
  CHECK(mask_is(mask, (int[]){3}, 1), "top-k 1");
  k.top_k = 2;
  mask_of(&k, logits, mask);
  CHECK(mask_is(mask, (int[]){3, 9, 11, 20}, 4), "top-k 2 keeps the ties");
  k.top_k = 5;
  mask_of(&k, logits, mask);
  CHECK(mask_is(mask, (int[]){3, 9, 11, 20, 30}, 5), "top-k 5");
  k.top_k = 1;
  k.temperature = 5;
  CHECK(sampler_pick(&s, &k, logits, &r) == 3, "top-k 1 is greedy");

  /* top-p on probabilities 0.4 0.3 0.2 0.1. */
  double pr4[4] = {0.4, 0.3, 0.2, 0.1};
  set_logprobs(logits, pr4, 4);
  struct sampler_params tp = p;
  tp.top_p = 0.35f;
  mask_of(&tp, logits, mask);
  CHECK(mask_is(mask, (int[]){0}, 1), "top-p 0.35: the first token crosses it");
  tp.top_p = 0.65f;
  mask_of(&tp, logits, mask);
  CHECK(mask_is(mask, (int[]){0, 1}, 2), "top-p 0.65");
  tp.top_p = 0.75f;
  mask_of(&tp, logits, mask);
  CHECK(mask_is(mask, (int[]){0, 1, 2}, 3), "top-p 0.75");
  /* top-p over the top-k set renormalized: top-2 = {0.4, 0.3} -> 0.571, 0.429; p 0.5 keeps one. */
  tp.top_k = 2;
  tp.top_p = 0.5f;
  mask_of(&tp, logits, mask);
  CHECK(mask_is(mask, (int[]){0}, 1), "top-k then top-p");
  tp.top_p = 0.6f;
  mask_of(&tp, logits, mask);
  CHECK(mask_is(mask, (int[]){0, 1}, 2), "top-k then top-p (0.6 > 0.571)");
  /* min-p: 0.4 * 0.3 = 0.12 keeps 0.4, 0.3, 0.2. */
  struct sampler_params mp = p;
  mp.min_p = 0.3f;
  mask_of(&mp, logits, mask);
  CHECK(mask_is(mask, (int[]){0, 1, 2}, 3), "min-p 0.3");
  mp.min_p = 0.6f;
  mask_of(&mp, logits, mask);
  CHECK(mask_is(mask, (int[]){0, 1}, 2), "min-p 0.6");
  /* Temperature sharpens before the masks: at T = 0.5 the probs are 16:9:4:1 / 30. */
  struct sampler_params tt = p;
  tt.temperature = 0.5f;
  tt.top_p = 0.6f;
  mask_of(&tt, logits, mask);
  CHECK(mask_is(mask, (int[]){0, 1}, 2), "T 0.5 then top-p 0.6 (16/30 < 0.6)");

  /* Random logits against the HF reference. */
  uint64_t st = 12345;
  int mismatches = 0;
  for (int trial = 0; trial < 3000; trial++) {
    for (int i = 0; i < V; i++)
      logits[i] = 3 * test_randf(&st);
    struct sampler_params q = p;
    q.temperature = 0.3f + 1.5f * (float)(test_rand(&st) % 100) / 100;
    q.top_k = (int)(test_rand(&st) % 3) ? (int)(test_rand(&st) % V) : 0;
    q.top_p = (int)(test_rand(&st) % 3) ? 0.05f + 0.9f * (float)(test_rand(&st) % 1000) / 1000 : 1;
    q.min_p = (int)(test_rand(&st) % 3) ? 0 : 0.3f * (float)(test_rand(&st) % 1000) / 1000;
    int ref[V];
    hf_reference(logits, q.temperature, q.top_k, q.top_p, q.min_p, ref);
    mask_of(&q, logits, mask);
    if (memcmp(mask, ref, sizeof ref))
      mismatches++;
  }
  CHECK(mismatches == 0, "%d of 3000 random masks differ from the HF definitions", mismatches);

  /* Same seed, same output; another seed, another output. */
  for (int i = 0; i < V; i++)
    logits[i] = test_randf(&st);
  int32_t a[200], b[200], c[200];
  struct rng r1, r2, r3;
  rng_seed(&r1, 42);
  rng_seed(&r2, 42);
  rng_seed(&r3, 43);
  for (int i = 0; i < 200; i++) {
    a[i] = sampler_pick(&s, &p, logits, &r1);
    b[i] = sampler_pick(&s, &p, logits, &r2);
    c[i] = sampler_pick(&s, &p, logits, &r3);
  }
  CHECK(!memcmp(a, b, sizeof a), "same seed, same tokens");
  CHECK(memcmp(a, c, sizeof a), "different seeds differ");

  /* Frequencies follow the filtered, renormalized distribution (top-k 3 of 0.4 0.3 0.2 0.1 ->
   * 4/9 3/9 2/9); 200k draws: standard error < 0.0012, so 0.006 is a 5-sigma bound. */
  set_logprobs(logits, pr4, 4);
  struct sampler_params k3 = p;
  k3.top_k = 3;
  int counts[V] = {0};
  for (int i = 0; i < 200000; i++)
    counts[sampler_pick(&s, &k3, logits, &r1)]++;
  CHECK(fabs(counts[0] / 200000.0 - 4 / 9.0) < 0.006 && fabs(counts[1] / 200000.0 - 3 / 9.0) < 0.006 &&
            fabs(counts[2] / 200000.0 - 2 / 9.0) < 0.006 && counts[3] == 0,
        "frequencies %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);

  /* Temperature only (no masks) takes its own path: same frequencies. */
  for (int i = 0; i < V; i++)
    counts[i] = 0;
  for (int i = 0; i < 200000; i++)
    counts[sampler_pick(&s, &p, logits, &r1)]++;
  CHECK(fabs(counts[0] / 200000.0 - 0.4) < 0.006 && fabs(counts[1] / 200000.0 - 0.3) < 0.006 &&
            fabs(counts[2] / 200000.0 - 0.2) < 0.006 && fabs(counts[3] / 200000.0 - 0.1) < 0.006 &&
            counts[4] == 0,
        "temperature-only frequencies %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
  large_vocab();

  /* Penalties. prompt {1, 2}, output {2, 3, 3}; logits l[1] = 2, l[2] = -1, l[3] = 3, l[4] = 1.
   * repetition 2 (HF: tokens of prompt and output): l1 = 2/2 = 1, l2 = -1*2 = -2, l3 = 3/2 = 1.5.
   * frequency 0.25, presence 0.5 (OpenAI: output counts c2 = 1, c3 = 2):
   *   l2 = -2 - 0.25 - 0.5 = -2.75, l3 = 1.5 - 0.5 - 0.5 = 0.5. logit_bias {4: +3}: l4 = 4.
   * min_tokens suppression of id 5: -inf. */
  memset(logits, 0, sizeof logits);
  logits[1] = 2;
  logits[2] = -1;
  logits[3] = 3;
  logits[4] = 1;
  int32_t prompt[2] = {1, 2}, out[3] = {2, 3, 3}, bias_id = 4, sup = 5;
  float bias_v = 3;
  struct sampler_params pen = p;
  pen.repetition_penalty = 2;
  pen.frequency_penalty = 0.25f;
  pen.presence_penalty = 0.5f;
  pen.bias_ids = &bias_id;
  pen.bias_values = &bias_v;
  pen.num_bias = 1;
  pen.suppress_ids = &sup;
  pen.num_suppress = 1;
  sampler_apply_processors(&s, &pen, logits, prompt, 2, out, 3);
  CHECK(logits[1] == 1.0f && logits[2] == -2.75f && logits[3] == 0.5f && logits[4] == 4.0f &&
            isinf(logits[5]) && logits[5] < 0 && logits[0] == 0,
        "penalties: %g %g %g %g %g", logits[1], logits[2], logits[3], logits[4], logits[5]);
  int dirty = 0;
  for (int i = 0; i < V; i++)
    dirty |= s.counts[i];
  CHECK(!dirty, "scratch counts cleared");
  CHECK(fabsf(sampler_logprob((float[]){0, 0, 0, 0}, 4, 2) - logf(0.25f)) < 1e-6f, "logprob");
  sampler_free(&s);
  return test_finish("test_sampler");
}
