/* scheduler.h - which tokens run each step: a token budget over running, then waiting sequences,
 * chunked prompts, and preemption by recompute when blocks run out. */
#ifndef PAGODA_SCHEDULER_H
#define PAGODA_SCHEDULER_H

#include <stdint.h>

#include "core/kv_manager.h"

enum sched_state { SCHED_NONE, SCHED_WAITING, SCHED_RUNNING };

/* What the scheduler knows of a sequence; the engine embeds it in its own sequence record.
 * Invariant: running => KV holds slots for [0, num_computed); waiting => its table is empty. */
struct sched_seq {
  struct kv_seq kv;
  const int32_t *tokens;  /* (num_tokens) prompt + output so far; owned by the engine */
  int num_tokens;         /* tokens known; the last one's KV is computed by the next step */
  int num_prompt;         /* tokens of the original prompt */
  int num_computed;       /* tokens whose KV is in the cache */
  int num_cached_prompt;  /* prompt tokens served by the prefix cache at first admission */
  int num_preemptions;
  int admitted;           /* 1 once it was first admitted (prefix stats count that admission) */
  int no_prefix_hit;      /* 1: never served from the prefix cache (every position is computed) */
  enum sched_state state;
  struct sched_seq *prev, *next; /* links in the waiting or running queue */
};

struct sched_queue {
  struct sched_seq *head, *tail;
  int count;
};

struct scheduler_params {
  int max_num_batched_tokens; /* tokens per step over all sequences */
  int max_num_seqs;           /* sequences per step */
  int prefill_chunk_size;     /* prompt tokens of one sequence per step */
  int max_model_len;          /* longest sequence (prompt + output) a request may reach */
};

/* One scheduled sequence: it computes tokens [num_computed, num_computed + num_new). */
struct sched_item {
  struct sched_seq *seq;
  int num_new;
};

struct scheduler_output {
  struct sched_item *items;  /* (max_num_seqs) in batch order */
  int num_items, num_tokens;
  struct kv_copy *copies;    /* (max_num_seqs) copy-on-writes to do before the forward */
  int num_copies;
  struct sched_seq **preempted; /* (max_num_seqs + running) sequences preempted this step */
  int num_preempted;
};

struct scheduler {
  struct scheduler_params p;
  struct kv_manager *kv;
  struct sched_queue waiting, running;
  struct scheduler_output out;
  int preempted_cap;
  int64_t total_preemptions;
};

/* Borrows KV. Returns 0, or -1 with err_last() set. Release with scheduler_free. */
int scheduler_init(struct scheduler *s, const struct scheduler_params *p, struct kv_manager *kv);
void scheduler_free(struct scheduler *s);

/* 0 when a sequence that may grow to MAX_TOKENS tokens (prompt + max_tokens) can ever run;
 * else -1 with err_last() saying why (beyond the model's context, or beyond the whole pool). */
int scheduler_check_admission(const struct scheduler *s, int num_prompt, int max_new_tokens);

/* Queues S (fresh: empty table, num_computed 0) at the tail of the waiting queue. */
void scheduler_add(struct scheduler *s, struct sched_seq *seq);
/* Adds SEQ, whose table the caller already filled (a fork), to the running queue right after
 * AFTER (or at its tail when AFTER is NULL). */
void scheduler_add_running(struct scheduler *s, struct sched_seq *seq, struct sched_seq *after);
/* Takes SEQ out of whichever queue holds it and releases its blocks (finish or abort). */
void scheduler_remove(struct scheduler *s, struct sched_seq *seq);

/* Plans one step. Running sequences first (oldest first): decodes and the next chunk of
 * prompts being prefilled; when the pool runs dry the newest running sequence is preempted
 * (its blocks freed, back to the front of the waiting queue). Then, if nothing was preempted,
 * waiting sequences in order while the budget lasts (prefix-cache hits skip their cached
 * tokens; a sequence whose next prompt block a running sequence is computing right now waits a
 * step, to hit it instead of computing it twice). The result stays valid until the next call. Returns 0, or -1 with err_last() set. */
int scheduler_schedule(struct scheduler *s, const struct scheduler_output **out);
/* After the forward pass: advances num_computed of every scheduled sequence and registers the
 * blocks that became full in the prefix cache. */
void scheduler_update(struct scheduler *s);

static inline int scheduler_has_work(const struct scheduler *s) {
  return s->waiting.count + s->running.count > 0;
}

#endif
