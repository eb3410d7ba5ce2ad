/* request.c - request construction (deep copies of the parameters) and per-token output handling. */
#include "core/request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/beam.h"
#include "text/tokenizer.h"
#include "util/log.h"

static void *dup_mem(const void *src, size_t n) {
  if (!n)
    return NULL;
  void *p = malloc(n);
  if (p)
    memcpy(p, src, n);
  return p;
}

struct request *request_create(uint64_t id, const int32_t *prompt, int num_prompt, int max_tokens,
                               const struct pagoda_sampling_params *sp, const struct kv_manager *kv,
                               const struct tokenizer *tok, const int32_t *eog_ids, int num_eog) {
  struct request *r = calloc(1, sizeof *r);
  if (!r) {
    ERR("out of memory for a request");
    return NULL;
  }
  r->id = id;
  r->sp = *sp;
  r->num_prompt = num_prompt;
  r->max_tokens = max_tokens;
  int beam = sp->beam_width > 1;
  r->num_seqs = beam ? sp->beam_width : sp->n;
  int fail = 0;
  if (sp->prompt_logprobs && num_prompt > 1)
    fail |= !(r->prompt_lp = malloc((size_t)(num_prompt - 1) * sizeof *r->prompt_lp));
  if (sp->n_stop) {
    r->stop = calloc((size_t)sp->n_stop, sizeof *r->stop);
    fail |= !r->stop;
    for (int i = 0; !fail && i < sp->n_stop; i++)
      fail |= !(r->stop[i] = strdup(sp->stop[i]));
  }
  r->stop_ids = dup_mem(sp->stop_token_ids, (size_t)sp->n_stop_token_ids * sizeof(int32_t));
  r->bias_ids = dup_mem(sp->logit_bias_ids, (size_t)sp->n_logit_bias * sizeof(int32_t));
  r->bias_values = dup_mem(sp->logit_bias_values, (size_t)sp->n_logit_bias * sizeof(float));
  fail |= (sp->n_stop_token_ids && !r->stop_ids) || (sp->n_logit_bias && (!r->bias_ids || !r->bias_values));
  r->sp.stop = (const char *const *)r->stop;
  r->sp.stop_token_ids = r->stop_ids;
  r->sp.logit_bias_ids = r->bias_ids;
  r->sp.logit_bias_values = r->bias_values;
  if (sp->min_tokens > 0) {
    r->suppress = malloc((size_t)(num_eog + sp->n_stop_token_ids + 1) * sizeof *r->suppress);
    fail |= !r->suppress;
    if (!fail) {
      if (!sp->ignore_eos)
        for (int i = 0; i < num_eog; i++)
          r->suppress[r->num_suppress++] = eog_ids[i];
      for (int i = 0; i < sp->n_stop_token_ids; i++)
        r->suppress[r->num_suppress++] = sp->stop_token_ids[i];
    }
  }
  struct sampler_params *q = &r->sampler;
  q->temperature = beam ? 0 : sp->temperature;
  q->top_k = sp->top_k;
  q->top_p = sp->top_p;
  q->min_p = sp->min_p;
  q->repetition_penalty = sp->repetition_penalty;
  q->presence_penalty = sp->presence_penalty;
  q->frequency_penalty = sp->frequency_penalty;
  q->bias_ids = r->bias_ids;
  q->bias_values = r->bias_values;
  q->num_bias = sp->n_logit_bias;
  r->seqs = calloc((size_t)r->num_seqs, sizeof *r->seqs);
  fail |= !r->seqs;
  if (beam)
    fail |= !(r->beam = beam_state_create(r->num_seqs, max_tokens));
  uint64_t seed = (uint64_t)sp->seed;
  for (int i = 0; !fail && i < r->num_seqs; i++) {
    struct sequence *s = &r->seqs[i];
    s->req = r;
    s->index = i;
    s->cap = num_prompt + max_tokens;
    s->tokens = malloc((size_t)s->cap * sizeof *s->tokens);
    if (sp->logprobs) {
      size_t k = (size_t)max_tokens * (size_t)(sp->top_logprobs > 0 ? sp->top_logprobs : 1);
      s->lp = malloc((size_t)max_tokens * sizeof *s->lp);
      s->top_ids = malloc(k * sizeof *s->top_ids);
      s->top_lp = malloc(k * sizeof *s->top_lp);
      fail |= !s->lp || !s->top_ids || !s->top_lp;
    }
    s->detok = detokenizer_create(tok, sp->skip_special_tokens);
    if (!s->tokens || !s->detok || kv_seq_init(&s->s.kv, kv)) {
      fail = 1;
      break;
    }
    memcpy(s->tokens, prompt, (size_t)num_prompt * sizeof *prompt);
    /* Prime the detokenizer with the prompt's tail (text discarded) so that the first output
     * token decodes as a continuation (" was", not "was" as at the start of a text). */
    char scratch[512];
    for (int k = num_prompt > 4 ? num_prompt - 4 : 0; k < num_prompt; k++)
      detokenizer_push(s->detok, prompt[k], scratch, sizeof scratch);
    /* Even when the prompt decodes to nothing (a lone BOS) the output continues a text. */
    detokenizer_set_continuation(s->detok);
    s->s.tokens = s->tokens;
    s->s.num_tokens = s->s.num_prompt = num_prompt;
    /* Sample i draws from its own stream: seed and index only, never the batch. */
    rng_seed(&s->rng, seed + 0x9e3779b97f4a7c15ull * (uint64_t)i);
  }
  if (fail) {
    request_free(r);
    ERR("out of memory for a request");
    return NULL;
  }
  r->num_live = r->num_seqs;
  return r;
}

void request_free(struct request *r) {
  if (!r)
    return;
  for (int i = 0; r->seqs && i < r->num_seqs; i++) {
    struct sequence *s = &r->seqs[i];
    free(s->tokens);
    free(s->text);
    free(s->lp);
    free(s->top_ids);
    free(s->top_lp);
    free(s->raw);
    if (s->detok)
      detokenizer_free(s->detok);
    kv_seq_free(&s->s.kv);
  }
  free(r->seqs);
  beam_state_free(r->beam);
  for (int i = 0; r->stop && i < r->sp.n_stop; i++)
    free(r->stop[i]);
  free(r->stop);
  free(r->stop_ids);
  free(r->bias_ids);
  free(r->bias_values);
  free(r->suppress);
  free(r->prompt_lp);
  free(r);
}

void sequence_sampler_params(const struct sequence *seq, struct sampler_params *out) {
  const struct request *r = seq->req;
  *out = r->sampler;
  out->suppress_ids = r->suppress;
  out->num_suppress = sequence_num_output(seq) < r->sp.min_tokens ? r->num_suppress : 0;
}

static int append_text(struct sequence *seq, const char *s, size_t n) {
  if (seq->text_len + n + 1 > seq->text_cap) {
    size_t cap = seq->text_cap ? seq->text_cap : 256;
    while (cap < seq->text_len + n + 1)
      cap *= 2; /* doubling: amortized O(1), a handful of reallocations per sequence */
    char *p = realloc(seq->text, cap);
    if (!p)
      return ERR("out of memory for output text");
    seq->text = p;
    seq->text_cap = cap;
  }
  memcpy(seq->text + seq->text_len, s, n);
  seq->text_len += n;
  seq->text[seq->text_len] = 0;
  return 0;
}

/* Ends the text before the first stop string that appears in the text added since OLD_LEN. */
static int cut_at_stop(struct sequence *seq, size_t old_len) {
  const struct request *r = seq->req;
  size_t best = (size_t)-1;
  for (int i = 0; i < r->sp.n_stop; i++) {
    size_t sl = strlen(r->stop[i]);
    if (!sl)
      continue;
    size_t from = old_len >= sl - 1 ? old_len - (sl - 1) : 0;
    const char *hit = memmem(seq->text + from, seq->text_len - from, r->stop[i], sl);
    if (hit && (size_t)(hit - seq->text) < best)
      best = (size_t)(hit - seq->text);
  }
  if (best == (size_t)-1)
    return 0;
  seq->text_len = best;
  seq->text[best] = 0;
  return 1;
}

int sequence_push_token(struct sequence *seq, int32_t tok, const struct tokenizer *t, int max_model_len) {
  struct request *r = seq->req;
  seq->tokens[seq->s.num_tokens++] = tok;
  int num_out = sequence_num_output(seq);
  int may_stop = num_out >= r->sp.min_tokens, cut = 0;
  int is_stop_id = 0;
  for (int i = 0; i < r->sp.n_stop_token_ids; i++)
    is_stop_id |= r->stop_ids[i] == tok;
  if (may_stop && ((!r->sp.ignore_eos && tokenizer_is_eog(t, tok)) || is_stop_id)) {
    seq->finish = PAGODA_FINISH_STOP; /* the stop token's text is not part of the output */
  } else {
    char buf[512];
    int n = detokenizer_push(seq->detok, tok, buf, sizeof buf);
    size_t old = seq->text_len;
    if (n > 0 && append_text(seq, buf, (size_t)n))
      return -1;
    if (may_stop && r->sp.n_stop && (cut = cut_at_stop(seq, old)))
      seq->finish = PAGODA_FINISH_STOP;
  }
  if (!seq->finish && (num_out >= r->max_tokens || seq->s.num_tokens >= max_model_len))
    seq->finish = PAGODA_FINISH_LENGTH;
  if (seq->finish && !cut) { /* the held-back bytes of an incomplete character, as U+FFFD */
    char buf[512];
    int n = detokenizer_flush(seq->detok, buf, sizeof buf);
    if (n > 0 && append_text(seq, buf, (size_t)n))
      return -1;
  }
  return 0;
}

size_t sequence_reportable_text(const struct sequence *seq) {
  if (seq->finish)
    return seq->text_len;
  const struct request *r = seq->req;
  size_t hold = 0;
  for (int i = 0; i < r->sp.n_stop; i++) {
    size_t sl = strlen(r->stop[i]);
    for (size_t k = sl ? sl - 1 : 0; k > hold; k--)
      if (k <= seq->text_len && !memcmp(seq->text + seq->text_len - k, r->stop[i], k)) {
        hold = k;
        break;
      }
  }
  size_t end = seq->text_len - hold;
  return end > seq->text_sent ? end : seq->text_sent;
}

int sequence_save_raw(struct sequence *seq, const float *logits, int vocab) {
  if (!seq->raw && !(seq->raw = malloc((size_t)vocab * sizeof *seq->raw)))
    return ERR("out of memory for logprobs"), -1;
  memcpy(seq->raw, logits, (size_t)vocab * sizeof *logits);
  float mx = -INFINITY;
  for (int i = 0; i < vocab; i++)
    if (logits[i] > mx)
      mx = logits[i];
  double sum = 0;
  for (int i = 0; i < vocab; i++)
    sum += exp((double)(logits[i] - mx));
  seq->raw_lse = (float)((double)mx + log(sum));
  return 0;
}

void sequence_record_logprob(struct sequence *seq, const struct sequence *from, int vocab) {
  const struct request *r = seq->req;
  int k = sequence_num_output(seq) - 1;
  if (!r->sp.logprobs || !from->raw || k < 0 || k >= r->max_tokens)
    return;
  int32_t tok = seq->tokens[seq->s.num_tokens - 1];
  seq->lp[k] = from->raw[tok] - from->raw_lse;
  int num_top = r->sp.top_logprobs;
  int32_t *ids = seq->top_ids + (size_t)k * (size_t)num_top;
  float *lps = seq->top_lp + (size_t)k * (size_t)num_top;
  int have = 0; /* insertion into a sorted list of num_top (<= 20): O(vocab * num_top) worst case */
  for (int i = 0; i < vocab && num_top > 0; i++) {
    float v = from->raw[i];
    if (have == num_top && !(v > lps[num_top - 1]))
      continue;
    int j = have < num_top ? have++ : num_top - 1;
    while (j > 0 && v > lps[j - 1]) { /* strict: ties keep the smaller id first */
      lps[j] = lps[j - 1];
      ids[j] = ids[j - 1];
      j--;
    }
    lps[j] = v;
    ids[j] = i;
  }
  for (int j = 0; j < have; j++)
    lps[j] -= from->raw_lse;
}

void sequence_set_logprob(struct sequence *seq, float lp, const int32_t *ids, const float *lps) {
  const struct request *r = seq->req;
  int k = sequence_num_output(seq) - 1;
  if (!r->sp.logprobs || k < 0 || k >= r->max_tokens)
    return;
  seq->lp[k] = lp;
  size_t num_top = (size_t)r->sp.top_logprobs;
  memcpy(seq->top_ids + (size_t)k * num_top, ids, num_top * sizeof *ids);
  memcpy(seq->top_lp + (size_t)k * num_top, lps, num_top * sizeof *lps);
}
