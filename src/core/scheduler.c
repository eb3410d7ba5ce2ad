/* scheduler.c - token-budget scheduling with chunked prefill and preemption by recompute. */
#include "core/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static void queue_unlink(struct sched_queue *q, struct sched_seq *x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    q->head = x->next;
  if (x->next)
    x->next->prev = x->prev;
  else
    q->tail = x->prev;
  x->prev = x->next = NULL;
  q->count--;
}

static void queue_insert_after(struct sched_queue *q, struct sched_seq *x, struct sched_seq *after) {
  x->prev = after;
  x->next = after ? after->next : q->head;
  if (x->next)
    x->next->prev = x;
  else
    q->tail = x;
  if (after)
    after->next = x;
  else
    q->head = x;
  q->count++;
}

static void queue_push_back(struct sched_queue *q, struct sched_seq *x) { queue_insert_after(q, x, q->tail); }

int scheduler_init(struct scheduler *s, const struct scheduler_params *p, struct kv_manager *kv) {
  memset(s, 0, sizeof *s);
  if (p->max_num_seqs < 1 || p->max_num_batched_tokens < 1 || p->prefill_chunk_size < 1)
    return ERR("--max-num-seqs, --max-num-batched-tokens and --prefill-chunk-size must be positive");
  s->p = *p;
  s->kv = kv;
  s->out.items = malloc((size_t)p->max_num_seqs * sizeof *s->out.items);
  s->out.copies = malloc((size_t)p->max_num_seqs * sizeof *s->out.copies);
  s->preempted_cap = 64;
  s->out.preempted = malloc((size_t)s->preempted_cap * sizeof *s->out.preempted);
  if (!s->out.items || !s->out.copies || !s->out.preempted) {
    scheduler_free(s);
    return ERR("out of memory for the scheduler");
  }
  return 0;
}

void scheduler_free(struct scheduler *s) {
  free(s->out.items);
  free(s->out.copies);
  free(s->out.preempted);
  memset(s, 0, sizeof *s);
}

int scheduler_check_admission(const struct scheduler *s, int num_prompt, int max_new_tokens) {
  long total = (long)num_prompt + max_new_tokens;
  if (num_prompt < 1)
    return ERR("the prompt is empty");
  if (total > s->p.max_model_len)
    return ERR("the prompt (%d tokens) plus max_tokens (%d) exceeds the maximum sequence length of %d "
               "tokens", num_prompt, max_new_tokens, s->p.max_model_len);
  int bs = s->kv->p.block_size;
  long blocks = (total + bs - 1) / bs;
  if (blocks > kv_manager_capacity(s->kv))
    return ERR("the prompt (%d tokens) plus max_tokens (%d) needs %ld KV blocks of %d tokens but the "
               "whole pool has %d: raise --pa-memory-mb (or --pa-memory-fraction / --pa-context-len)",
               num_prompt, max_new_tokens, blocks, bs, kv_manager_capacity(s->kv));
  return 0;
}

void scheduler_add(struct scheduler *s, struct sched_seq *seq) {
  seq->state = SCHED_WAITING;
  seq->num_computed = 0;
  queue_push_back(&s->waiting, seq);
}

void scheduler_add_running(struct scheduler *s, struct sched_seq *seq, struct sched_seq *after) {
  seq->admitted = 1;
  queue_insert_after(&s->running, seq, after && after->state == SCHED_RUNNING ? after : s->running.tail);
  seq->state = SCHED_RUNNING;
}

void scheduler_remove(struct scheduler *s, struct sched_seq *seq) {
  if (seq->state == SCHED_WAITING)
    queue_unlink(&s->waiting, seq);
  else if (seq->state == SCHED_RUNNING)
    queue_unlink(&s->running, seq);
  kv_manager_release(s->kv, &seq->kv);
  seq->state = SCHED_NONE;
}

/* Preemption by recompute: the KV is dropped; tokens (prompt + output so far) are kept and
 * recomputed when the sequence is admitted again, ahead of every other waiting one. */
static int preempt(struct scheduler *s, struct sched_seq *seq) {
  queue_unlink(&s->running, seq);
  kv_manager_release(s->kv, &seq->kv);
  seq->num_computed = 0;
  seq->num_preemptions++;
  seq->state = SCHED_WAITING;
  queue_insert_after(&s->waiting, seq, NULL);
  s->total_preemptions++;
  struct scheduler_output *o = &s->out;
  if (o->num_preempted == s->preempted_cap) {
    /* Rare (at most once per doubling over the engine's life), never per token. */
    int cap = s->preempted_cap * 2;
    struct sched_seq **p = realloc(o->preempted, (size_t)cap * sizeof *p);
    if (!p)
      return ERR("out of memory recording preemptions");
    o->preempted = p;
    s->preempted_cap = cap;
  }
  o->preempted[o->num_preempted++] = seq;
  return 0;
}

static int min3(int a, int b, int c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }

static void emit(struct scheduler *s, struct sched_seq *seq, int n, const struct kv_copy *cp) {
  struct scheduler_output *o = &s->out;
  o->items[o->num_items].seq = seq;
  o->items[o->num_items++].num_new = n;
  o->num_tokens += n;
  if (cp->src >= 0)
    o->copies[o->num_copies++] = *cp;
}

/* 1 when a running sequence is still computing the block that would extend SEQ's prefix hit of
 * HIT tokens (same tokens up to the end of that block): admitting SEQ now would compute that block
 * a second time, while one step later it is a cache hit. With many requests arriving together
 * behind one shared prefix, only the first computes it. */
static int prefix_in_flight(const struct scheduler *s, const struct sched_seq *seq, int hit) {
  int end = hit + s->kv->p.block_size;
  if (!s->kv->p.enable_prefix_cache || end > seq->num_tokens - 1)
    return 0;
  for (const struct sched_seq *p = s->running.head; p; p = p->next)
    if (p->num_computed < end && p->num_tokens >= end &&
        !memcmp(p->tokens, seq->tokens, (size_t)end * sizeof *seq->tokens))
      return 1;
  return 0;
}

int scheduler_schedule(struct scheduler *s, const struct scheduler_output **out) {
  struct scheduler_output *o = &s->out;
  o->num_items = o->num_tokens = o->num_copies = o->num_preempted = 0;
  *out = o;
  int budget = s->p.max_num_batched_tokens;
  struct kv_copy cp;
  for (struct sched_seq *seq = s->running.head, *next; seq && o->num_items < s->p.max_num_seqs && budget > 0;
       seq = next) {
    next = seq->next;
    int n = min3(seq->num_tokens - seq->num_computed, budget, s->p.prefill_chunk_size);
    if (n <= 0)
      continue;
    int rc;
    while ((rc = kv_manager_allocate(s->kv, &seq->kv, n, &cp)) == 1) {
      struct sched_seq *victim = s->running.tail; /* the newest: it has the least work done */
      if (next == victim)
        next = NULL; /* the loop must not visit a preempted sequence */
      if (preempt(s, victim))
        return -1;
      if (victim == seq)
        break;
    }
    if (rc < 0)
      return -1;
    if (rc == 1)
      break; /* SEQ itself was the newest: everything after it is gone too */
    emit(s, seq, n, &cp);
    budget -= n;
  }
  if (o->num_preempted)
    return 0; /* the pool is short: admitting more would only preempt again */
  while (s->waiting.head && o->num_items < s->p.max_num_seqs && budget > 0) {
    struct sched_seq *seq = s->waiting.head;
    int hit = seq->no_prefix_hit ? 0 : kv_manager_match_prefix(s->kv, &seq->kv, seq->tokens, seq->num_tokens);
    seq->num_computed = hit;
    int n = min3(seq->num_tokens - hit, budget, s->p.prefill_chunk_size);
    int rc = !seq->no_prefix_hit && prefix_in_flight(s, seq, hit) ? 1 : kv_manager_allocate(s->kv, &seq->kv, n, &cp);
    if (rc != 0) {
      kv_manager_release(s->kv, &seq->kv); /* give the hit blocks back; retried next step */
      seq->num_computed = 0;
      if (rc < 0)
        return -1;
      break; /* first come, first served: nobody overtakes the head of the queue */
    }
    if (!seq->admitted) {
      seq->admitted = 1;
      seq->num_cached_prompt = hit;
      kv_manager_record_prefix(s->kv, seq->num_tokens, hit);
    }
    queue_unlink(&s->waiting, seq);
    seq->state = SCHED_RUNNING;
    queue_push_back(&s->running, seq);
    emit(s, seq, n, &cp);
    budget -= n;
  }
  if (o->num_items == 0 && s->waiting.head && s->running.head && !o->num_preempted) {
    /* Nothing could run: the running sequences all wait for others (beams waiting for a sibling
     * that was preempted) while holding the blocks that sibling needs. Preempting the newest
     * one frees blocks; the next step admits the head of the queue. */
    if (preempt(s, s->running.tail))
      return -1;
  }
  return 0;
}

void scheduler_update(struct scheduler *s) {
  struct scheduler_output *o = &s->out;
  for (int i = 0; i < o->num_items; i++) {
    struct sched_seq *seq = o->items[i].seq;
    seq->num_computed += o->items[i].num_new;
    kv_manager_cache_full_blocks(s->kv, &seq->kv, seq->tokens, seq->num_computed);
  }
}
