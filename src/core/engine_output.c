/* engine_output.c - what a step reports: outputs of the dirty sequences, prompt logprobs,
 * and the engine's statistics. See engine_impl.h. */
#include <math.h>
#include <string.h>

#include "core/engine_impl.h"

void engine_prompt_logprobs(struct pagoda_engine *e, const struct scheduler_output *o) {
  for (int b = 0; b < o->num_items; b++) {
    if (!e->lp_num_rows[b])
      continue;
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    struct request *r = s->req;
    int n = e->lp_num_rows[b], pos0 = e->lp_pos0[b], row0 = e->lp_row0[b], V = e->vocab;
#pragma omp parallel for schedule(static) if (n > 1)
    for (int j = 0; j < n; j++) {
      const float *lg = e->logits + (size_t)(row0 + j) * V;
      float mx = lg[0];
      for (int v = 1; v < V; v++)
        mx = lg[v] > mx ? lg[v] : mx;
      double sum = 0;
      for (int v = 0; v < V; v++)
        sum += exp((double)lg[v] - mx);
      r->prompt_lp[pos0 + j] = (float)((double)lg[s->s.tokens[pos0 + j + 1]] - mx - log(sum));
    }
    if (pos0 + n == r->num_prompt - 1)
      r->prompt_lp_done = 1;
  }
}

int engine_prompt_logprobs_device(struct pagoda_engine *e, const struct scheduler_output *o) {
  int n = 0; /* the rows after the sampling ones, in item order, as run_batch laid them out */
  for (int b = 0; b < o->num_items; b++) {
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    for (int j = 0; j < e->lp_num_rows[b]; j++)
      e->lp_target[n++] = s->s.tokens[e->lp_pos0[b] + j + 1];
  }
  if (n == 0)
    return 0;
  struct backend *be = e->be;
  for (int k = 0; k < n; k += e->p.max_num_seqs) {
    int nr = n - k < e->p.max_num_seqs ? n - k : e->p.max_num_seqs;
    if (model_logits_rows(e->model, e->num_sample_rows + k, nr) ||
        be->ops->logprob_rows(be, e->lp_value + k, model_logits_device(e->model), nr, e->vocab, e->lp_target + k))
      return -1;
  }
  n = 0;
  for (int b = 0; b < o->num_items; b++) {
    if (!e->lp_num_rows[b])
      continue;
    const struct sequence *s = (const struct sequence *)o->items[b].seq;
    struct request *r = s->req;
    for (int j = 0; j < e->lp_num_rows[b]; j++)
      r->prompt_lp[e->lp_pos0[b] + j] = e->lp_value[n++];
    if (e->lp_pos0[b] + e->lp_num_rows[b] == r->num_prompt - 1)
      r->prompt_lp_done = 1;
  }
  return 0;
}

void engine_collect_outputs(struct pagoda_engine *e, int *n_outs) {
  int n = 0;
  for (int i = 0; i < e->num_dirty; i++) {
    struct sequence *s = e->dirty[i];
    struct request *r = s->req;
    struct pagoda_output *o = &e->outs[n++];
    int num_out = sequence_num_output(s) - s->pend; /* a placeholder is not a token yet */
    size_t end = sequence_reportable_text(s);
    o->request_id = r->id;
    o->index = s->index;
    o->token_ids = s->tokens + s->s.num_prompt + s->tokens_sent;
    o->num_token_ids = num_out - s->tokens_sent;
    o->text = s->text ? s->text + s->text_sent : "";
    o->text_len = end - s->text_sent;
    o->finish_reason = s->finish;
    o->usage.prompt_tokens = r->num_prompt;
    o->usage.completion_tokens = 0;
    for (int k = 0; k < r->num_seqs; k++)
      o->usage.completion_tokens += sequence_num_output(&r->seqs[k]) - r->seqs[k].pend;
    o->usage.cached_prompt_tokens = r->seqs[0].s.num_cached_prompt;
    o->prompt_logprobs = NULL;
    o->num_prompt_logprobs = 0;
    if (s->index == 0 && r->prompt_lp && r->prompt_lp_done && !r->prompt_lp_sent) {
      o->prompt_logprobs = r->prompt_lp;
      o->num_prompt_logprobs = r->num_prompt - 1;
      r->prompt_lp_sent = 1;
    }
    o->logprobs = NULL;
    o->top_logprob_ids = NULL;
    o->top_logprobs = NULL;
    o->num_top_logprobs = 0;
    if (r->sp.logprobs && s->lp) {
      o->num_top_logprobs = r->sp.top_logprobs;
      o->logprobs = s->lp + s->tokens_sent;
      o->top_logprob_ids = s->top_ids + (size_t)s->tokens_sent * (size_t)o->num_top_logprobs;
      o->top_logprobs = s->top_lp + (size_t)s->tokens_sent * (size_t)o->num_top_logprobs;
    }
    s->tokens_sent = num_out;
    s->text_sent = end;
    s->dirty = 0;
  }
  e->num_dirty = 0;
  *n_outs = n;
  /* Requests whose every sequence finished and was reported move to the dead list. */
  for (struct request *r = e->live, *next; r; r = next) {
    next = r->next;
    if (r->num_live > 0)
      continue;
    int pending = 0;
    for (int k = 0; k < r->num_seqs; k++)
      pending |= r->seqs[k].dirty;
    if (pending)
      continue;
    if (r->prev)
      r->prev->next = r->next;
    else
      e->live = r->next;
    if (r->next)
      r->next->prev = r->prev;
    r->prev = NULL;
    r->next = e->dead;
    e->dead = r;
  }
  if (e->p.on_output)
    for (int i = 0; i < n; i++)
      e->p.on_output(&e->outs[i], e->p.user);
}

int pagoda_engine_stats(const pagoda_engine_t *e, struct pagoda_engine_stats *s) {
  memset(s, 0, sizeof *s);
  const struct kv_manager *kv = &e->kv;
  s->num_blocks = kv_manager_capacity(kv);
  s->block_size = e->block_size;
  s->free_blocks = kv_manager_num_free(kv);
  s->running = e->sched.running.count;
  s->waiting = e->sched.waiting.count;
  s->kv_usage = (double)(s->num_blocks - s->free_blocks) / s->num_blocks;
  s->kv_peak_usage = e->peak_usage;
  s->kv_waste_fraction = e->alloc_slots > 0 ? e->waste_slots / e->alloc_slots : 0;
  if (kv->p.enable_prefix_cache || kv->p.contiguous) {
    s->prefix_queries = kv->cache.stats.queries;
    s->prefix_hits = kv->cache.stats.hits;
    s->prefix_evictions = kv->cache.stats.evictions;
  }
  s->preemptions = e->sched.total_preemptions;
  s->steps = e->steps;
  s->prompt_tokens_computed = e->prompt_computed;
  s->generated_tokens = e->generated;
  s->paged = !kv->p.contiguous;
  return PAGODA_OK;
}

int pagoda_max_model_len(const pagoda_engine_t *e) { return e->max_model_len; }
int pagoda_vocab_size(const pagoda_engine_t *e) { return e->vocab; }
