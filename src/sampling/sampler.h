/* sampler.h - logits processors (bias, penalties) and the token sampler (greedy, temperature,
 * top-k, top-p, min-p) with a per-sequence random generator. */
#ifndef PAGODA_SAMPLER_H
#define PAGODA_SAMPLER_H

#include <stdint.h>

#include "sampling/rng.h"

struct sampler_params {
  float temperature;        /* <= 0: greedy, exactly the first index of the maximum */
  int top_k;                /* <= 0: off; tokens tied with the k-th largest logit are kept (HF) */
  float top_p;              /* >= 1: off */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* 1: off. HF/CTRL: every token of prompt + output, l > 0 ? l / r : l * r */
  float presence_penalty;   /* 0: off. OpenAI: l -= presence * (count > 0), output tokens only */
  float frequency_penalty;  /* 0: off. OpenAI: l -= frequency * count, output tokens only */
  const int32_t *bias_ids;  /* (num_bias) logit_bias: l[id] += value, applied first */
  const float *bias_values; /* (num_bias) */
  int num_bias;
  const int32_t *suppress_ids; /* (num_suppress) set to -inf last (min_tokens hides EOS/stop ids) */
  int num_suppress;
};

#define SAMPLER_BUCKETS 4096 /* top-p histogram over the float bits of probabilities */
#define SAMPLER_SORT_MAX 2048 /* top-p sorts at most this many candidates, else buckets first */

/* Scratch sized for one vocabulary; one per sampling thread. */
struct sampler {
  int vocab;
  int32_t *counts;     /* (vocab) zero between calls */
  float *probs;        /* (vocab) unnormalized probabilities at the current temperature */
  int32_t *order;      /* (vocab) candidate ids */
  int32_t *tmp;        /* (vocab) top-p: the ids of the crossing bucket */
  double *bucket_mass; /* (SAMPLER_BUCKETS) top-p: probability mass per bucket */
};

/* Returns 0, or -1 with err_last() set. Release with sampler_free. */
int sampler_init(struct sampler *s, int vocab);
void sampler_free(struct sampler *s);

/* What the presence and frequency penalties subtract from a token seen COUNT times in the output;
 * one function for the host sampler and the entries it hands a device (same rounding). */
float sampler_penalty_sub(const struct sampler_params *p, int32_t count);

/* The processors of P for one row, as backend_proc_entry records (backend/backend.h) for a device
 * that applies them (backend_ops.process): one entry per distinct token touched, rows set to ROW,
 * their bias values appended to BIAS from index BIAS0. The caller provides room for
 * num_bias + num_prompt + num_output + num_suppress entries and num_bias values. Returns the entries
 * written. Applying them gives exactly sampler_apply_processors' result. */
struct backend_proc_entry;
int sampler_proc_entries(struct sampler *s, const struct sampler_params *p, const int32_t *prompt, int num_prompt,
                         const int32_t *output, int num_output, int row, struct backend_proc_entry *out,
                         float *bias, int bias0);

/* The CPU reference of backend_ops.process: applies N entries (rows of VOCAB logits) in place,
 * each operation rounded as sampler_apply_processors rounds it. */
void sampler_apply_entries(float *logits, int vocab, const struct backend_proc_entry *entries, int n,
                           const float *bias);

/* In place on LOGITS (vocab): logit bias, repetition penalty, presence and frequency penalties,
 * suppression, in that order. PROMPT (num_prompt) and OUTPUT (num_output) are the sequence so far. */
void sampler_apply_processors(struct sampler *s, const struct sampler_params *p, float *logits,
                              const int32_t *prompt, int num_prompt, const int32_t *output, int num_output);

/* The tokens that survive temperature, then top-k, then top-p (over the top-k set renormalized,
 * as HF applies them), then min-p. *IDS (count) lists them; *PROBS (vocab, indexed by token id)
 * holds their probabilities renormalized to sum 1 (other entries are meaningless); both point
 * into the sampler's scratch until the next call. The order is a function of the logits and the
 * parameters only (sorted by probability, ties by id, for top-k and small top-p sets; id order
 * otherwise; large top-p sets: the whole buckets above the cut in id order, then the sorted tail).
 * Exponentials use a polynomial with relative error < 2e-7. Requires temperature > 0. Returns
 * the count. */
int sampler_candidates(struct sampler *s, const struct sampler_params *p, const float *logits,
                       const int32_t **ids, const float **probs);

/* Picks the next token from processed LOGITS: the first index of the maximum when greedy
 * (temperature <= 0, or top_k = 1); else one draw u of R and the first kept id, in id order,
 * whose running mass exceeds u times the kept total (the CUDA sampler's rule). */
int32_t sampler_pick(struct sampler *s, const struct sampler_params *p, const float *logits, struct rng *r);

/* log softmax(logits)[id] of the raw logits (for beam search scores and logprobs). */
float sampler_logprob(const float *logits, int vocab, int32_t id);

#endif
