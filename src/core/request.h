/* request.h - a request (prompt, sampling parameters, its samples) and its sequences: tokens,
 * random state, output text with stop-string handling. */
#ifndef PAGODA_REQUEST_H
#define PAGODA_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/scheduler.h"
#include "pagoda.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

struct tokenizer;
struct detokenizer;
struct request;

struct sequence {
  struct sched_seq s;      /* first member: the scheduler's view (a sched_seq * is a sequence *) */
  struct request *req;
  int index;               /* sample index (beam rank for beam search) */
  int32_t *tokens;         /* (cap) prompt + output */
  int cap;                 /* num_prompt + max_tokens */
  struct rng rng;
  struct detokenizer *detok;
  char *text;              /* (text_cap) output text so far (stop strings cut off) */
  size_t text_len, text_cap;
  size_t text_sent;        /* bytes of text already reported */
  int tokens_sent;         /* output tokens already reported */
  double score;            /* beam search: cumulative logprob */
  enum pagoda_finish_reason finish;
  int dirty;               /* 1 while it sits in the engine's to-report list */
  int started;             /* 0 for samples 1..n-1 until they fork from sample 0 */
  /* Asynchronous steps: 1 while tokens[s.num_tokens - 1] is a placeholder for the id a launched
   * step sampled and the engine has not read yet; it is entry pend_entry (slot * max_num_seqs +
   * entry) of that step. Never reported: outputs count num_tokens - pend. */
  int pend, pend_entry;
  /* sp.logprobs only: per output token, its raw logprob and the top sp.top_logprobs. */
  float *lp;               /* (max_tokens) */
  int32_t *top_ids;        /* (max_tokens x top_logprobs) */
  float *top_lp;           /* (max_tokens x top_logprobs) */
  float *raw;              /* (vocab) the raw logits of the last row sampled for this sequence */
  float raw_lse;           /* log sum exp of raw */
};

struct request {
  uint64_t id;
  struct pagoda_sampling_params sp; /* pointers redirected to the copies below */
  char **stop;                      /* (sp.n_stop) owned copies */
  int32_t *stop_ids;                /* (sp.n_stop_token_ids) */
  int32_t *bias_ids;                /* (sp.n_logit_bias) */
  float *bias_values;               /* (sp.n_logit_bias) */
  int32_t *suppress;                /* (num_suppress) EOS/end-of-turn and stop ids, for min_tokens */
  int num_suppress;
  struct sampler_params sampler;
  int num_prompt, max_tokens, num_cached_prompt;
  struct beam_state *beam;          /* beam search state; NULL for sampling */
  float *prompt_lp;                 /* (num_prompt - 1) sp.prompt_logprobs: log P(prompt[i+1] | ..i) */
  int prompt_lp_done, prompt_lp_sent; /* all computed / reported */
  struct sequence *seqs;            /* (num_seqs) */
  int num_seqs, num_live;
  int sync_steps;                   /* 1: its steps need the host to know each token first (engine.c) */
  int num_inflight;                 /* entries of launched, unread steps naming its sequences: the
                                     * request is freed only once this is 0 */
  double t_arrival;
  struct request *prev, *next;      /* the engine's list of live requests */
};

/* Builds a request for PROMPT (num_prompt ids) with SP (copied deeply) and num_seqs sequences whose
 * tables come from KV. EOG_IDS (num_eog) feed min_tokens suppression. NULL with err_last() set.
 * Free with request_free (after its sequences left the scheduler). */
struct request *request_create(uint64_t id, const int32_t *prompt, int num_prompt, int max_tokens,
                               const struct pagoda_sampling_params *sp, const struct kv_manager *kv,
                               const struct tokenizer *tok, const int32_t *eog_ids, int num_eog);
void request_free(struct request *r);

/* The sampler parameters for SEQ's next token (min_tokens suppression included), into *OUT.
 * Reads only: safe to call for several sequences at once. */
void sequence_sampler_params(const struct sequence *seq, struct sampler_params *out);

/* Appends generated token TOK to SEQ: decodes its text, applies EOS / stop ids / stop strings
 * (after min_tokens), max_tokens and MAX_MODEL_LEN; sets seq->finish when it ends. Returns 0, or
 * -1 when out of memory for the text. */
int sequence_push_token(struct sequence *seq, int32_t tok, const struct tokenizer *t, int max_model_len);
/* Bytes of text that may be reported now: everything once finished; otherwise all but the
 * longest tail that could still grow into a stop string. */
size_t sequence_reportable_text(const struct sequence *seq);

/* sp.logprobs: keeps a copy of LOGITS (vocab, raw: before any processor) for the token drawn
 * from them. Returns 0, or -1 when out of memory. Touches only SEQ. */
int sequence_save_raw(struct sequence *seq, const float *logits, int vocab);
/* sp.logprobs: records the logprob (and top logprobs) of SEQ's last output token from the raw
 * row saved in FROM (SEQ itself, or the sample it forked from). */
void sequence_record_logprob(struct sequence *seq, const struct sequence *from, int vocab);
/* sp.logprobs: the same from values computed elsewhere (backend_ops.topk_rows on the device):
 * LP the logprob of SEQ's last output token, IDS / LPS its sp.top_logprobs best, best first. */
void sequence_set_logprob(struct sequence *seq, float lp, const int32_t *ids, const float *lps);

static inline int sequence_num_output(const struct sequence *seq) { return seq->s.num_tokens - seq->s.num_prompt; }

#endif
