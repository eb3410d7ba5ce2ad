/* beam.h - beam search over a request's sequences: candidates per beam, selection, forks that
 * share blocks, losers freed, finished hypotheses with a length penalty. */
#ifndef PAGODA_BEAM_H
#define PAGODA_BEAM_H

#include "core/request.h"

struct tokenizer;

/* Per-request state (W = beam_width). */
struct beam_state {
  int width;
  int32_t *cand_tok;   /* (W, 2W) best next tokens of each beam, by logprob */
  float *cand_lp;      /* (W, 2W) their logprobs */
  int *has_cand;       /* (W) 1 once the beam's logits for this round arrived */
  int *live;           /* (W) 1 for a sequence slot holding a live beam */
  int *selected;       /* (W) scratch: times a beam is a parent this round */
  struct beam_pick { float score; int beam, rank; int32_t tok; } *picks; /* (2W * W) scratch */
  int32_t *hyp_tokens; /* (W, max_tokens) finished hypotheses' output tokens */
  int *hyp_len;        /* (W) */
  float *hyp_score;    /* (W) length-penalized */
  int *hyp_finish;     /* (W) pagoda_finish_reason */
  int num_hyp, max_tokens;
};

/* What beam search needs from the engine. */
struct beam_env {
  struct scheduler *sched;
  struct kv_manager *kv;
  const struct tokenizer *tok;
  int vocab, max_model_len;
};

/* Returns NULL when out of memory. Free with beam_state_free. */
struct beam_state *beam_state_create(int width, int max_tokens);
void beam_state_free(struct beam_state *b);

/* LOGITS (vocab, processed) arrived for beam SEQ. Once every live beam of the request has its
 * candidates, selects the next beams (forking and freeing sequences). Returns 1 when the request
 * finished: its sequences then hold the best hypotheses in rank order (finish set, text decoded,
 * all out of the scheduler); 0 otherwise; -1 on out of memory. */
int beam_on_logits(const struct beam_env *env, struct sequence *seq, const float *logits);
/* The same from the beam's candidates computed elsewhere (backend_ops.topk_rows on the device):
 * IDS and LPS (2 x width) its best next tokens and their log-probabilities, best first. */
int beam_on_candidates(const struct beam_env *env, struct sequence *seq, const int32_t *ids, const float *lps);
/* The host reference of those candidates: the K best log softmax(LOGITS (vocab)) values, best
 * first (ties: the lower id first), and their ids; lse = mx + log(sum of exp(x - mx)) with the
 * sum in double, each value x - lse in f32. Requires k <= vocab. */
void beam_candidates(const float *logits, int vocab, int k, int32_t *ids, float *lps);

#endif
