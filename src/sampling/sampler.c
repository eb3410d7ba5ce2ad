/* sampler.c - logits processors and the top-k / top-p / min-p sampler. */
#include "sampling/sampler.h"

#include "backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int sampler_init(struct sampler *s, int vocab) {
  s->vocab = vocab;
  s->counts = calloc((size_t)vocab, sizeof *s->counts);
  s->probs = malloc((size_t)vocab * sizeof *s->probs);
  s->order = malloc((size_t)vocab * sizeof *s->order);
  s->tmp = malloc((size_t)vocab * sizeof *s->tmp);
  s->bucket_mass = malloc(SAMPLER_BUCKETS * sizeof *s->bucket_mass);
  if (!s->counts || !s->probs || !s->order || !s->tmp || !s->bucket_mass) {
    sampler_free(s);
    return ERR("out of memory for a sampler over %d tokens", vocab);
  }
  return 0;
}

void sampler_free(struct sampler *s) {
  free(s->counts);
  free(s->probs);
  free(s->order);
  free(s->tmp);
  free(s->bucket_mass);
  s->tmp = NULL;
  s->bucket_mass = NULL;
  s->counts = NULL;
  s->probs = NULL;
  s->order = NULL;
}

float sampler_penalty_sub(const struct sampler_params *p, int32_t count) {
  return p->frequency_penalty * (float)count + p->presence_penalty;
}

/* The entry of token ID in OUT (N so far), created on first use; C maps id -> index + 1. */
static struct backend_proc_entry *entry_for(int32_t *c, struct backend_proc_entry *out, int *n, int row, int32_t id) {
  if (!c[id]) {
    out[*n] = (struct backend_proc_entry){.row = row, .id = id, .rep = 1.0f};
    c[id] = ++*n;
  }
  return &out[c[id] - 1];
}

int sampler_proc_entries(struct sampler *s, const struct sampler_params *p, const int32_t *prompt, int num_prompt,
                         const int32_t *output, int num_output, int row, struct backend_proc_entry *out,
                         float *bias, int bias0) {
  int32_t *c = s->counts, *cur = s->tmp;
  int n = 0;
  for (int i = 0; i < p->num_bias; i++) /* first the number of values per token, in order of appearance */
    entry_for(c, out, &n, row, p->bias_ids[i])->num_bias++;
  for (int e = 0, at = bias0; e < n; e++) {
    out[e].bias0 = at;
    at += out[e].num_bias;
    cur[e] = 0;
  }
  for (int i = 0; i < p->num_bias; i++) { /* then the values, each token's in request order */
    struct backend_proc_entry *e = &out[c[p->bias_ids[i]] - 1];
    bias[e->bias0 + cur[c[p->bias_ids[i]] - 1]++] = p->bias_values[i];
  }
  if (p->repetition_penalty != 1.0f && p->repetition_penalty > 0) {
    for (int i = 0; i < num_prompt; i++)
      entry_for(c, out, &n, row, prompt[i])->rep = p->repetition_penalty;
    for (int i = 0; i < num_output; i++)
      entry_for(c, out, &n, row, output[i])->rep = p->repetition_penalty;
  }
  if (p->presence_penalty != 0 || p->frequency_penalty != 0) {
    for (int i = 0; i < num_output; i++) /* the count, held in sub until it is converted below */
      entry_for(c, out, &n, row, output[i])->sub += 1.0f;
    for (int k = 0; k < n; k++)
      if (out[k].sub > 0)
        out[k].sub = sampler_penalty_sub(p, (int32_t)out[k].sub);
  }
  for (int i = 0; i < p->num_suppress; i++)
    entry_for(c, out, &n, row, p->suppress_ids[i])->suppress = 1;
  for (int k = 0; k < n; k++)
    c[out[k].id] = 0;
  return n;
}

void sampler_apply_entries(float *logits, int vocab, const struct backend_proc_entry *entries, int n,
                           const float *bias) {
  for (int i = 0; i < n; i++) {
    const struct backend_proc_entry *e = &entries[i];
    float *l = &logits[(size_t)e->row * vocab + e->id];
    for (int b = 0; b < e->num_bias; b++)
      *l += bias[e->bias0 + b];
    if (e->rep != 1.0f)
      *l = *l > 0 ? *l / e->rep : *l * e->rep;
    if (e->sub != 0.0f)
      *l -= e->sub;
    if (e->suppress)
      *l = -INFINITY;
  }
}

void sampler_apply_processors(struct sampler *s, const struct sampler_params *p, float *logits,
                              const int32_t *prompt, int num_prompt, const int32_t *output, int num_output) {
  for (int i = 0; i < p->num_bias; i++)
    logits[p->bias_ids[i]] += p->bias_values[i];
  int32_t *c = s->counts;
  if (p->repetition_penalty != 1.0f && p->repetition_penalty > 0) {
    /* Each distinct token once, however often it occurs (counts marks the ones done). */
    float r = p->repetition_penalty;
    for (int pass = 0; pass < 2; pass++) {
      const int32_t *t = pass ? output : prompt;
      int n = pass ? num_output : num_prompt;
      for (int i = 0; i < n; i++)
        if (!c[t[i]]) {
          c[t[i]] = 1;
          float *l = &logits[t[i]];
          *l = *l > 0 ? *l / r : *l * r;
        }
    }
    for (int i = 0; i < num_prompt; i++)
      c[prompt[i]] = 0;
    for (int i = 0; i < num_output; i++)
      c[output[i]] = 0;
  }
  if (p->presence_penalty != 0 || p->frequency_penalty != 0) {
    for (int i = 0; i < num_output; i++)
      c[output[i]]++;
    for (int i = 0; i < num_output; i++)
      if (c[output[i]]) { /* the first occurrence applies the whole count, then clears it */
        logits[output[i]] -= sampler_penalty_sub(p, c[output[i]]);
        c[output[i]] = 0;
      }
  }
  for (int i = 0; i < p->num_suppress; i++)
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

static int cmp_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
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

/* The largest of X[0, n) (-inf for none); eight independent lanes so the loop vectorizes. */
static float max_of(const float *x, int n) {
  float m[8];
  for (int j = 0; j < 8; j++)
    m[j] = -INFINITY;
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++)
      m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  float r = -INFINITY;
  for (int j = 0; j < 8; j++)
    r = m[j] > r ? m[j] : r;
  for (; i < n; i++)
    r = x[i] > r ? x[i] : r;
  return r;
}

/* exp(x) for x <= 0, vectorizable: x = k ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2),
 * e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^k through the exponent bits.
 * Below -87.3 (and -inf, NaN) it is 0, as the probability of such a token is below FLT_MIN;
 * above 0 it is clamped to 1 (callers pass logit - max <= 0). */
static inline float exp_nonpos(float x) {
  float xc = x > -87.3f ? (x < 0 ? x : 0) : -87.3f; /* clamped (NaN too): the int conversion is defined */
  float k = rintf(xc * 1.44269504f);
  float r = xc - k * 0.693145752f - k * 1.42860677e-6f;
  float p = 1 + r * (1 + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  union {
    int32_t i;
    float f;
  } sc;
  sc.i = (int32_t)((uint32_t)((int32_t)k + 127) << 23); /* k in [-126, 0] */
  return x >= -87.3f ? p * sc.f : 0.0f;
}

static uint32_t prob_key(float p) { /* monotone in p for p > 0: the exponent and 4 mantissa bits */
  union {
    float f;
    uint32_t u;
  } v = {p};
  return v.u >> 19;
}

/* top-p over order[0, n) when n is large: the probability mass per bucket of prob_key locates
 * the bucket where the cumulative mass (from the top) crosses top_p; buckets above it are kept
 * whole, only the crossing one is sorted. Same set as sorting everything. Returns the count. */
static int top_p_buckets(struct sampler *s, int n, float top_p) {
  double *mass = s->bucket_mass;
  memset(mass, 0, SAMPLER_BUCKETS * sizeof *mass);
  double total = 0;
  for (int i = 0; i < n; i++) {
    float q = s->probs[s->order[i]];
    mass[prob_key(q)] += q;
    total += q;
  }
  double target = top_p * total, cum = 0;
  int b = SAMPLER_BUCKETS - 1;
  for (; b >= 0; b--) {
    if (cum + mass[b] >= target)
      break;
    cum += mass[b];
  }
  if (b < 0)
    return n; /* rounding: everything is below the target */
  int m = 0, t = 0;
  for (int i = 0; i < n; i++) {
    int32_t id = s->order[i];
    uint32_t k = prob_key(s->probs[id]);
    if (k > (uint32_t)b)
      s->order[m++] = id;
    else if (k == (uint32_t)b)
      s->tmp[t++] = id;
  }
  qsort_r(s->tmp, (size_t)t, sizeof *s->tmp, cmp_desc, s->probs);
  for (int i = 0; i < t && cum < target; i++) {
    s->order[m++] = s->tmp[i];
    cum += s->probs[s->tmp[i]];
  }
  return m;
}

/* The K first ids of the total order on LOGITS (finite ones only), unsorted, into heap[0, ret):
 * one pass with a K-entry min-heap whose root is the weakest kept id. */
static int top_k_heap(const float *logits, int V, int k, int32_t *heap) {
  int n = 0;
  for (int i = 0; i < V; i++) {
    if (!(logits[i] > -INFINITY))
      continue;
    int j;
    if (n < k) { /* sift up */
      j = n++;
      while (j > 0 && before(logits, heap[(j - 1) / 2], i)) {
        heap[j] = heap[(j - 1) / 2];
        j = (j - 1) / 2;
      }
      heap[j] = i;
      continue;
    }
    if (!before(logits, i, heap[0]))
      continue;
    j = 0; /* replace the root, sift down */
    for (;;) {
      int c = 2 * j + 1;
      if (c >= n)
        break;
      if (c + 1 < n && before(logits, heap[c], heap[c + 1]))
        c++;
      if (!before(logits, i, heap[c]))
        break;
      heap[j] = heap[c];
      j = c;
    }
    heap[j] = i;
  }
  return n;
}

/* Candidates with unnormalized probabilities (the maximum's is 1); *TOTAL their sum. */
static int candidates_raw(struct sampler *s, const struct sampler_params *p, const float *logits,
                          double *total_out) {
  int V = s->vocab, n = 0;
  float mx = max_of(logits, V), inv_t = 1.0f / p->temperature;
  if (p->top_k > 0 && p->top_k < V) {
    /* Select on the logits (same order as the probabilities): only k exponentials. */
    if (p->top_k <= 1024) {
      n = top_k_heap(logits, V, p->top_k, s->order);
    } else {
      for (int i = 0; i < V; i++)
        if (logits[i] > -INFINITY)
          s->order[n++] = i;
      if (p->top_k < n) {
        select_top(logits, s->order, n, p->top_k);
        n = p->top_k;
      }
    }
    /* As HF's TopKLogitsWarper: every token tied with the k-th largest logit stays too. */
    float kth = INFINITY;
    for (int i = 0; i < n; i++)
      kth = logits[s->order[i]] < kth ? logits[s->order[i]] : kth;
    int m = 0;
    for (int i = 0; i < n; i++)
      if (logits[s->order[i]] > kth)
        s->order[m++] = s->order[i];
    for (int i = 0; i < V && n > 0; i++)
      if (logits[i] == kth)
        s->order[m++] = i;
    n = m;
    m = 0;
    for (int i = 0; i < n; i++) {
      int32_t id = s->order[i];
      s->probs[id] = exp_nonpos((logits[id] - mx) * inv_t);
      if (s->probs[id] > 0) /* underflow at low temperature: such tokens cannot be drawn */
        s->order[m++] = id;
    }
    n = m;
  } else {
    for (int i = 0; i < V; i++) /* contiguous: vectorized */
      s->probs[i] = exp_nonpos((logits[i] - mx) * inv_t);
    for (int i = 0; i < V; i++)
      if (s->probs[i] > 0)
        s->order[n++] = i;
  }
  if (p->top_p < 1.0f && p->top_p > 0 && n > SAMPLER_SORT_MAX) {
    n = top_p_buckets(s, n, p->top_p);
  } else if (p->top_p < 1.0f && p->top_p > 0) {
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
  *total_out = total;
  return n;
}

int sampler_candidates(struct sampler *s, const struct sampler_params *p, const float *logits,
                       const int32_t **ids, const float **probs) {
  double total;
  int n = candidates_raw(s, p, logits, &total);
  for (int i = 0; i < n; i++) /* in place: probs stays indexed by token id */
    s->probs[s->order[i]] = (float)(s->probs[s->order[i]] / total);
  *ids = s->order;
  *probs = s->probs;
  return n;
}

int32_t sampler_pick(struct sampler *s, const struct sampler_params *p, const float *logits, struct rng *r) {
  if (p->temperature <= 0 || p->top_k == 1) { /* the first index holding the maximum */
    float mx = max_of(logits, s->vocab);
    for (int i = 0; i < s->vocab; i++)
      if (logits[i] == mx)
        return i;
    return 0;
  }
  if (!(p->top_k > 0 && p->top_k < s->vocab) && !(p->top_p < 1.0f && p->top_p > 0) && !(p->min_p > 0)) {
    /* Temperature only: every token is a candidate, walked in id order without an id list. */
    int V = s->vocab;
    float mx = max_of(logits, V), inv_t = 1.0f / p->temperature;
    for (int i = 0; i < V; i++)
      s->probs[i] = exp_nonpos((logits[i] - mx) * inv_t);
    double lane[8] = {0}, total = 0;
    int i = 0;
    for (; i + 8 <= V; i += 8)
      for (int j = 0; j < 8; j++)
        lane[j] += s->probs[i + j];
    for (int j = 0; j < 8; j++)
      total += lane[j];
    for (; i < V; i++)
      total += s->probs[i];
    if (!(total > 0)) /* every logit -inf */
      return 0;
    double target = rng_uniform(r) * total, cum = 0;
    int last = 0;
    for (i = 0; i < V; i++) {
      if (s->probs[i] > 0) {
        cum += s->probs[i];
        last = i;
        if (target < cum)
          return i;
      }
    }
    return last;
  }
  double total;
  int n = candidates_raw(s, p, logits, &total);
  if (n == 0) /* every logit -inf: fall back to the argmax rule */
    return 0;
  /* One draw: the first kept id, in id order, whose running (unnormalized) mass exceeds
   * u * total -- the rule of the CUDA backend's sampler, so both pick the same token from the
   * same draw. Small sets are sorted by id; large ones are marked and walked. */
  double target = rng_uniform(r) * total, cum = 0;
  if (n <= SAMPLER_SORT_MAX) {
    qsort(s->order, (size_t)n, sizeof *s->order, cmp_id);
    for (int i = 0; i < n; i++) {
      cum += s->probs[s->order[i]];
      if (target < cum)
        return s->order[i];
    }
    return s->order[n - 1];
  }
  for (int i = 0; i < n; i++)
    s->counts[s->order[i]] = 1;
  int32_t pick = -1, last = 0;
  for (int i = 0; i < s->vocab; i++) {
    if (!s->counts[i])
      continue;
    s->counts[i] = 0; /* scratch back to zero as we go */
    last = i;
    if (pick < 0) {
      cum += s->probs[i];
      if (target < cum)
        pick = i;
    }
  }
  return pick >= 0 ? pick : last;
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
