/* sampler.c - logits processors and the top-k / top-p / min-p sampler. */
#include "sampling/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int sampler_init(struct sampler *s, int vocab) {
  s->vocab = vocab;
  s->counts = calloc((size_t)vocab, sizeof *s->counts);
  s->probs = malloc((size_t)vocab * sizeof *s->probs);
  s->order = malloc((size_t)vocab * sizeof *s->order);
  if (!s->counts || !s->probs || !s->order) {
    sampler_free(s);
    return ERR("out of memory for a sampler over %d tokens", vocab);
  }
  return 0;
}

void sampler_free(struct sampler *s) {
  free(s->counts);
  free(s->probs);
  free(s->order);
  s->counts = NULL;
  s->probs = NULL;
  s->order = NULL;
}

void sampler_apply_processors(struct sampler *s, const struct sampler_params *p, float *logits,
                              const int32_t *prompt, int n_prompt, const int32_t *output, int n_output) {
  for (int i = 0; i < p->n_bias; i++)
    logits[p->bias_ids[i]] += p->bias_values[i];
  int32_t *c = s->counts;
  if (p->repetition_penalty != 1.0f && p->repetition_penalty > 0) {
    /* Each distinct token once, however often it occurs (counts marks the ones done). */
    float r = p->repetition_penalty;
    for (int pass = 0; pass < 2; pass++) {
      const int32_t *t = pass ? output : prompt;
      int n = pass ? n_output : n_prompt;
      for (int i = 0; i < n; i++)
        if (!c[t[i]]) {
          c[t[i]] = 1;
          float *l = &logits[t[i]];
          *l = *l > 0 ? *l / r : *l * r;
        }
    }
    for (int i = 0; i < n_prompt; i++)
      c[prompt[i]] = 0;
    for (int i = 0; i < n_output; i++)
      c[output[i]] = 0;
  }
  if (p->presence_penalty != 0 || p->frequency_penalty != 0) {
    for (int i = 0; i < n_output; i++)
      c[output[i]]++;
    for (int i = 0; i < n_output; i++)
      if (c[output[i]]) { /* the first occurrence applies the whole count, then clears it */
        logits[output[i]] -= p->frequency_penalty * (float)c[output[i]] + p->presence_penalty;
        c[output[i]] = 0;
      }
  }
  for (int i = 0; i < p->n_suppress; i++)
    logits[p->suppress_ids[i]] = -INFINITY;
}

/* Total order: higher probability first, then lower id. */
static int before(const float *probs, int32_t a, int32_t b) {
  return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
  const float *probs = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return before(probs, x, y) ? -1 : before(probs, y, x) ? 1 : 0;
}

/* Reorders ids[0, n) so that its first k are the k first in the total order (unsorted). */
static void select_top(const float *probs, int32_t *ids, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int32_t pivot = ids[lo + (hi - lo) / 2];
    int i = lo, j = hi;
    while (i <= j) {
      while (before(probs, ids[i], pivot))
        i++;
      while (before(probs, pivot, ids[j]))
        j--;
      if (i <= j) {
        int32_t t = ids[i];
        ids[i++] = ids[j];
        ids[j--] = t;
      }
    }
    if (k - 1 <= j)
      hi = j;
    else if (k - 1 >= i)
      lo = i;
    else
      break;
  }
}

int sampler_candidates(struct sampler *s, const struct sampler_params *p, const float *logits,
                       const int32_t **ids, const float **probs) {
  int V = s->vocab;
  float mx = -INFINITY;
  for (int i = 0; i < V; i++)
    if (logits[i] > mx)
      mx = logits[i];
  float inv_t = 1.0f / p->temperature;
  int n = 0;
  for (int i = 0; i < V; i++)
    if (logits[i] > -INFINITY)
      s->order[n++] = i;
  if (p->top_k > 0 && p->top_k < n) {
    /* Select on the logits (same order as the probabilities): only k exponentials per token. */
    select_top(logits, s->order, n, p->top_k);
    n = p->top_k;
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    int32_t id = s->order[i];
    float e = expf((logits[id] - mx) * inv_t);
    s->probs[id] = e;
    if (e > 0) /* underflow at low temperature: such tokens cannot be drawn */
      s->order[m++] = id;
  }
  n = m;
  if (p->top_p < 1.0f && p->top_p > 0) {
    qsort_r(s->order, (size_t)n, sizeof *s->order, cmp_desc, s->probs);
    double total = 0;
    for (int i = 0; i < n; i++)
      total += s->probs[s->order[i]];
    /* Keep a token while the mass strictly before it is below top_p (the one crossing is kept),
     * which is HF's "drop the low tail whose cumulative mass <= 1 - top_p". */
    double before_mass = 0;
    int keep = 0;
    while (keep < n && before_mass < p->top_p * total) {
      before_mass += s->probs[s->order[keep]];
      keep++;
    }
    n = keep > 0 ? keep : 1;
  } else if (p->top_k > 0) {
    qsort_r(s->order, (size_t)n, sizeof *s->order, cmp_desc, s->probs);
  }
  if (p->min_p > 0) {
    /* Relative to the most likely token; renormalization does not change the ratio. */
    float thr = p->min_p; /* the maximum's unnormalized probability is exp(0) = 1 */
    int m = 0;
    for (int i = 0; i < n; i++)
      if (s->probs[s->order[i]] >= thr)
        s->order[m++] = s->order[i];
    n = m;
  }
  double total = 0;
  for (int i = 0; i < n; i++)
    total += s->probs[s->order[i]];
  for (int i = 0; i < n; i++) /* in place: probs stays indexed by token id */
    s->probs[s->order[i]] = (float)(s->probs[s->order[i]] / total);
  *ids = s->order;
  *probs = s->probs;
  return n;
}

int32_t sampler_pick(struct sampler *s, const struct sampler_params *p, const float *logits, struct rng *r) {
  if (p->temperature <= 0) {
    int32_t best = 0;
    for (int i = 1; i < s->vocab; i++)
      if (logits[i] > logits[best])
        best = i;
    return best;
  }
  const int32_t *ids;
  const float *probs;
  int n = sampler_candidates(s, p, logits, &ids, &probs);
  if (n == 0) /* every logit -inf: fall back to the argmax rule */
    return 0;
  double u = rng_uniform(r), cum = 0;
  for (int i = 0; i < n; i++) {
    cum += probs[ids[i]];
    if (u < cum)
      return ids[i];
  }
  return ids[n - 1];
}

float sampler_logprob(const float *logits, int vocab, int32_t id) {
  float mx = -INFINITY;
  for (int i = 0; i < vocab; i++)
    if (logits[i] > mx)
      mx = logits[i];
  double sum = 0;
  for (int i = 0; i < vocab; i++)
    sum += exp((double)(logits[i] - mx));
  return (float)((double)(logits[id] - mx) - log(sum));
}
