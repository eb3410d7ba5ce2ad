/* beam.c - beam search: each round every live beam proposes its 2W best tokens; the W best
 * continuations by cumulative logprob survive (EOS candidates become finished hypotheses scored
 * sum_logprob / length^length_penalty, as HF transformers scores them). */
#include "core/beam.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "util/log.h"

struct beam_state *beam_state_create(int w, int max_tokens) {
  struct beam_state *b = calloc(1, sizeof *b);
  if (!b)
    return NULL;
  b->width = w;
  b->max_tokens = max_tokens;
  b->cand_tok = malloc((size_t)w * 2 * w * sizeof *b->cand_tok);
  b->cand_lp = malloc((size_t)w * 2 * w * sizeof *b->cand_lp);
  b->has_cand = calloc((size_t)w, sizeof *b->has_cand);
  b->live = calloc((size_t)w, sizeof *b->live);
  b->selected = calloc((size_t)w, sizeof *b->selected);
  b->picks = malloc((size_t)w * 2 * w * sizeof *b->picks);
  b->hyp_tokens = malloc((size_t)w * max_tokens * sizeof *b->hyp_tokens);
  b->hyp_len = calloc((size_t)w, sizeof *b->hyp_len);
  b->hyp_score = calloc((size_t)w, sizeof *b->hyp_score);
  b->hyp_finish = calloc((size_t)w, sizeof *b->hyp_finish);
  if (!b->cand_tok || !b->cand_lp || !b->has_cand || !b->live || !b->selected || !b->picks || !b->hyp_tokens ||
      !b->hyp_len || !b->hyp_score || !b->hyp_finish) {
    beam_state_free(b);
    return NULL;
  }
  b->live[0] = 1;
  return b;
}

void beam_state_free(struct beam_state *b) {
  if (!b)
    return;
  free(b->cand_tok);
  free(b->cand_lp);
  free(b->has_cand);
  free(b->live);
  free(b->selected);
  free(b->picks);
  free(b->hyp_tokens);
  free(b->hyp_len);
  free(b->hyp_score);
  free(b->hyp_finish);
  free(b);
}

static float penalized(float sum_lp, int len, float length_penalty) {
  return sum_lp / powf((float)(len > 0 ? len : 1), length_penalty);
}

/* Keeps the W best finished hypotheses. */
static void add_hyp(struct beam_state *b, const struct sequence *s, int32_t last, float score, int finish) {
  int k = b->num_hyp;
  if (k == b->width) {
    k = 0;
    for (int i = 1; i < b->width; i++)
      if (b->hyp_score[i] < b->hyp_score[k])
        k = i;
    if (b->hyp_score[k] >= score)
      return;
  } else {
    b->num_hyp++;
  }
  int n = sequence_num_output(s);
  memcpy(b->hyp_tokens + (size_t)k * b->max_tokens, s->tokens + s->s.num_prompt, (size_t)n * sizeof(int32_t));
  if (last >= 0)
    b->hyp_tokens[(size_t)k * b->max_tokens + n++] = last;
  b->hyp_len[k] = n;
  b->hyp_score[k] = score;
  b->hyp_finish[k] = finish;
}

static float worst_hyp(const struct beam_state *b) {
  float w = INFINITY;
  for (int i = 0; i < b->num_hyp; i++)
    w = b->hyp_score[i] < w ? b->hyp_score[i] : w;
  return w;
}

static int cmp_pick(const void *x, const void *y) {
  const struct beam_pick *a = x, *b = y;
  if (a->score != b->score)
    return a->score > b->score ? -1 : 1;
  return a->beam != b->beam ? a->beam - b->beam : a->rank - b->rank;
}

/* The request ends: every sequence leaves the scheduler and slot k gets hypothesis k. */
/* Decodes the N generated ids after the prompt into s->text as the streaming path does: a
 * detokenizer primed with the prompt's tail, so the text keeps a continuation's leading space. */
static int continuation_text(const struct tokenizer *tok, const int32_t *ids, int num_prompt, int n,
                             int skip_special, struct sequence *s) {
  struct detokenizer *d = detokenizer_create(tok, skip_special);
  size_t cap = (size_t)n * 64 + 256, len = 0;
  char *text = malloc(cap), scratch[256];
  if (!d || !text) {
    detokenizer_free(d);
    free(text);
    return ERR("out of memory for beam text");
  }
  for (int k = num_prompt > 4 ? num_prompt - 4 : 0; k < num_prompt; k++)
    detokenizer_push(d, ids[k], scratch, sizeof scratch);
  detokenizer_set_continuation(d);
  for (int k = 0; k <= n; k++) {
    for (;;) { /* push the id (k < n), then drain held-back text; flush at the end */
      int w = k < n ? detokenizer_push(d, ids[num_prompt + k], scratch, sizeof scratch)
                    : detokenizer_flush(d, scratch, sizeof scratch);
      if (w <= 0)
        break;
      if (len + (size_t)w + 1 > cap) {
        char *nt = realloc(text, cap * 2 + (size_t)w);
        if (!nt) {
          detokenizer_free(d);
          free(text);
          return ERR("out of memory for beam text");
        }
        text = nt;
        cap = cap * 2 + (size_t)w;
      }
      memcpy(text + len, scratch, (size_t)w);
      len += (size_t)w;
      if (k < n)
        break;
    }
  }
  detokenizer_free(d);
  text[len] = 0;
  free(s->text);
  s->text = text;
  s->text_len = s->text_cap = len;
  return 0;
}

static int finalize(const struct beam_env *env, struct request *r) {
  struct beam_state *b = r->beam;
  for (int i = 0; i < r->num_seqs; i++)
    if (r->seqs[i].s.state != SCHED_NONE)
      scheduler_remove(env->sched, &r->seqs[i].s);
  int order[64];
  for (int i = 0; i < b->num_hyp; i++)
    order[i] = i;
  for (int i = 1; i < b->num_hyp; i++) /* insertion sort, best first; W <= 64 */
    for (int j = i; j > 0 && b->hyp_score[order[j]] > b->hyp_score[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (int k = 0; k < r->num_seqs; k++) {
    struct sequence *s = &r->seqs[k];
    s->started = 1;
    if (k >= b->num_hyp) { /* fewer hypotheses than beams: nothing more to report */
      s->s.num_tokens = s->s.num_prompt;
      s->finish = PAGODA_FINISH_LENGTH;
      continue;
    }
    int h = order[k], n = b->hyp_len[h];
    memcpy(s->tokens + s->s.num_prompt, b->hyp_tokens + (size_t)h * b->max_tokens, (size_t)n * sizeof(int32_t));
    s->s.num_tokens = s->s.num_prompt + n;
    s->score = b->hyp_score[h];
    s->finish = b->hyp_finish[h];
    if (continuation_text(env->tok, s->tokens, s->s.num_prompt, n, r->sp.skip_special_tokens, s) != 0)
      return -1;
  }
  r->num_live = 0;
  return 1;
}

void beam_candidates(const float *logits, int vocab, int k, int32_t *ids, float *lps) {
  float mx = -INFINITY;
  for (int v = 0; v < vocab; v++)
    mx = logits[v] > mx ? logits[v] : mx;
  double sum = 0;
  for (int v = 0; v < vocab; v++)
    sum += exp((double)(logits[v] - mx));
  float lse = (float)((double)mx + log(sum)); /* as sequence_save_raw and backend_ops.topk_rows */
  int n = 0;
  for (int v = 0; v < vocab; v++) { /* insertion into a short sorted list: O(vocab) */
    float lp = logits[v] - lse;
    if (n == k && lp <= lps[k - 1])
      continue;
    int j = n < k ? n++ : k - 1;
    while (j > 0 && lps[j - 1] < lp) {
      lps[j] = lps[j - 1];
      ids[j] = ids[j - 1];
      j--;
    }
    lps[j] = lp;
    ids[j] = v;
  }
}

int beam_on_logits(const struct beam_env *env, struct sequence *seq, const float *logits) {
  struct beam_state *b = seq->req->beam;
  int K = 2 * b->width;
  size_t at = (size_t)seq->index * K;
  beam_candidates(logits, env->vocab, K, b->cand_tok + at, b->cand_lp + at);
  return beam_on_candidates(env, seq, b->cand_tok + at, b->cand_lp + at);
}

int beam_on_candidates(const struct beam_env *env, struct sequence *seq, const int32_t *ids, const float *lps) {
  struct request *r = seq->req;
  struct beam_state *b = r->beam;
  int W = b->width, K = 2 * W, i = seq->index;
  int32_t *ct = b->cand_tok + (size_t)i * K;
  float *cl = b->cand_lp + (size_t)i * K;
  if (ct != ids) {
    memcpy(ct, ids, (size_t)K * sizeof *ct);
    memcpy(cl, lps, (size_t)K * sizeof *cl);
  }
  b->has_cand[i] = 1;
  for (int k = 0; k < W; k++)
    if (b->live[k] && !b->has_cand[k])
      return 0; /* wait for the other beams of this round */

  /* Select the W best continuations over every live beam's candidates. */
  int np = 0;
  for (int k = 0; k < W; k++) {
    if (!b->live[k])
      continue;
    for (int c = 0; c < K; c++)
      b->picks[np++] = (struct beam_pick){(float)r->seqs[k].score + b->cand_lp[(size_t)k * K + c], k, c,
                                          b->cand_tok[(size_t)k * K + c]};
  }
  qsort(b->picks, (size_t)np, sizeof *b->picks, cmp_pick);
  int num_new = 0;
  float lpen = r->sp.length_penalty;
  memset(b->selected, 0, (size_t)W * sizeof *b->selected);
  for (int p = 0; p < np && num_new < W; p++) {
    struct beam_pick *pk = &b->picks[p];
    const struct sequence *parent = &r->seqs[pk->beam];
    int is_stop = 0;
    for (int s = 0; s < r->sp.n_stop_token_ids; s++)
      is_stop |= r->stop_ids[s] == pk->tok;
    if ((!r->sp.ignore_eos && tokenizer_is_eog(env->tok, pk->tok)) || is_stop) {
      if (p < W) /* as HF: an EOS continuation counts only when ranked among the first W */
        add_hyp(b, parent, pk->tok, penalized(pk->score, sequence_num_output(parent) + 1, lpen), PAGODA_FINISH_STOP);
      continue;
    }
    b->picks[num_new++] = *pk; /* compact the survivors to the front (p >= num_new) */
    b->selected[pk->beam]++;
  }
  /* Losers free their blocks; then extra copies of a parent fork into the freed slots, before
   * the parent itself is extended in place. */
  for (int k = 0; k < W; k++)
    if (b->live[k] && !b->selected[k]) {
      scheduler_remove(env->sched, &r->seqs[k].s);
      b->live[k] = 0;
    }
  int target[64];
  for (int j = 0; j < num_new; j++) {
    int par = b->picks[j].beam;
    if (b->selected[par] > 0 && b->selected[par] != -1) {
      target[j] = par; /* first use: in place */
      b->selected[par] = -1;
      continue;
    }
    int f = 0;
    while (f < W && (b->live[f] || b->selected[f] == -1))
      f++;
    struct sequence *src = &r->seqs[par], *dst = &r->seqs[f];
    memcpy(dst->tokens, src->tokens, (size_t)src->s.num_tokens * sizeof(int32_t));
    dst->s.num_tokens = src->s.num_tokens;
    dst->s.num_cached_prompt = src->s.num_cached_prompt;
    dst->s.admitted = 1;
    dst->score = src->score;
    dst->started = 1;
    b->live[f] = 1;
    b->selected[f] = -2; /* taken this round */
    if (src->s.state == SCHED_RUNNING) { /* share the parent's blocks */
      kv_manager_fork(env->kv, &src->s.kv, &dst->s.kv);
      dst->s.num_computed = src->s.num_computed;
      scheduler_add_running(env->sched, &dst->s, &src->s);
    } else { /* the parent was preempted after proposing: its KV is gone, recompute */
      scheduler_add(env->sched, &dst->s);
    }
    target[j] = f;
  }
  int length_done = 0;
  float best_live = -INFINITY;
  for (int j = 0; j < num_new; j++) {
    struct sequence *s = &r->seqs[target[j]];
    s->tokens[s->s.num_tokens++] = b->picks[j].tok;
    s->score = b->picks[j].score;
    int out = sequence_num_output(s);
    float pen = penalized(b->picks[j].score, out, lpen);
    best_live = pen > best_live ? pen : best_live;
    if (out >= r->max_tokens || s->s.num_tokens >= env->max_model_len)
      length_done = 1;
  }
  for (int k = 0; k < W; k++)
    b->has_cand[k] = 0;
  if (length_done || num_new == 0) {
    for (int k = 0; k < W; k++)
      if (b->live[k])
        add_hyp(b, &r->seqs[k], -1, penalized((float)r->seqs[k].score, sequence_num_output(&r->seqs[k]), lpen),
                PAGODA_FINISH_LENGTH);
    return finalize(env, r);
  }
  if (b->num_hyp == W && best_live <= worst_hyp(b))
    return finalize(env, r);
  return 0;
}
