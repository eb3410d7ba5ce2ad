/* fuzz_scheduler.c - byte-driven sequences of scheduler and KV-manager operations (add, step
 * with chunked prefill and preemption, append, fork, abort) on a tiny pool, paged or contiguous,
 * prefix cache on or off; every invariant is checked after each operation (abort on violation)
 * and every sequence must end with all its blocks returned. */
#include <stdlib.h>
#include <string.h>

#include "core/scheduler.h"

#define NSEQ 12
#define MAXTOK 128

struct fseq {
  struct sched_seq s;
  int32_t tokens[MAXTOK];
  int live, target;
};

static void check(struct kv_manager *kv, struct fseq *seqs) {
  struct kv_seq *tabs[NSEQ];
  int n = 0;
  for (int i = 0; i < NSEQ; i++)
    if (seqs[i].live && seqs[i].s.state == SCHED_RUNNING)
      tabs[n++] = &seqs[i].s.kv;
    else if (seqs[i].live && seqs[i].s.kv.num_blocks)
      abort(); /* a waiting sequence holds blocks */
  if (kv_manager_check(kv, tabs, n))
    abort();
}

int fuzz_one(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  int mode = data[0];
  struct kv_manager kv;
  struct kv_manager_params kp = {8 + data[1] % 40, 8, MAXTOK / 8, mode & 1, (mode >> 1) & 1, (mode >> 2) & 3};
  if (kp.contiguous && kp.num_blocks - 1 < kp.max_blocks_per_seq)
    kp.num_blocks = kp.max_blocks_per_seq + 1 + data[1] % 20;
  struct scheduler sch;
  struct scheduler_params sp = {4 + (mode >> 4) * 8, 1 + (mode >> 4), 1 + (mode & 0x38), MAXTOK};
  if (kv_manager_init(&kv, &kp) || scheduler_init(&sch, &sp, &kv))
    abort();
  static struct fseq seqs[NSEQ];
  memset(seqs, 0, sizeof seqs);
  for (int i = 0; i < NSEQ; i++)
    kv_seq_init(&seqs[i].s.kv, &kv);
  for (size_t i = 2; i + 1 < size; i += 2) {
    int op = data[i] % 5, arg = data[i + 1];
    struct fseq *f = &seqs[arg % NSEQ];
    if (op == 0 && !f->live) { /* add a prompt; long ones can be rejected at admission */
      int n = 1 + arg % 100, max_new = 1 + (arg >> 3) % 28;
      if (scheduler_check_admission(&sch, n, max_new))
        continue;
      for (int k = 0; k < n; k++)
        f->tokens[k] = (arg & 0x80) ? k : arg * 31 + k; /* half of them share prefixes */
      f->s.tokens = f->tokens;
      f->s.num_tokens = f->s.num_prompt = n;
      f->s.admitted = 0;
      f->target = n + max_new;
      f->live = 1;
      scheduler_add(&sch, &f->s);
    } else if (op == 1 || op == 2) { /* a step */
      const struct scheduler_output *o;
      if (scheduler_schedule(&sch, &o))
        abort();
      scheduler_update(&sch);
      for (int b = 0; b < o->num_items; b++) {
        struct fseq *q = (struct fseq *)o->items[b].seq;
        if (q->s.num_computed != q->s.num_tokens)
          continue;
        q->tokens[q->s.num_tokens] = 1000 + q->s.num_tokens;
        q->s.num_tokens++;
        if (q->s.num_tokens >= q->target) {
          scheduler_remove(&sch, &q->s);
          q->live = 0;
        }
      }
    } else if (op == 3 && f->live) { /* abort */
      scheduler_remove(&sch, &f->s);
      f->live = 0;
    } else if (op == 4 && f->live && f->s.state == SCHED_RUNNING && f->s.num_computed == f->s.num_tokens - 1 &&
               kv_manager_can_fork(&kv)) { /* fork into a free slot: a sample with another last token */
      struct fseq *c = NULL;
      for (int k = 0; k < NSEQ && !c; k++)
        if (!seqs[(arg + k) % NSEQ].live)
          c = &seqs[(arg + k) % NSEQ];
      if (!c)
        continue;
      kv_manager_fork(&kv, &f->s.kv, &c->s.kv);
      memcpy(c->tokens, f->tokens, sizeof c->tokens);
      c->s.tokens = c->tokens;
      c->s.num_tokens = f->s.num_tokens;
      c->s.num_prompt = f->s.num_prompt;
      c->s.num_computed = f->s.num_computed;
      c->target = f->target;
      c->live = 1;
      c->tokens[c->s.num_tokens - 1] = 2000 + arg; /* its own sampled token */
      scheduler_add_running(&sch, &c->s, &f->s);
    }
    check(&kv, seqs);
  }
  for (int i = 0; i < NSEQ; i++) {
    if (seqs[i].live)
      scheduler_remove(&sch, &seqs[i].s);
    kv_seq_free(&seqs[i].s.kv);
  }
  if (kv_manager_num_free(&kv) != kv_manager_capacity(&kv))
    abort(); /* a leak */
  scheduler_free(&sch);
  kv_manager_free(&kv);
  return 0;
}

void fuzz_seeds(void (*add)(const uint8_t *, size_t)) {
  uint8_t buf[400];
  uint64_t x = 42;
  for (int s = 0; s < 8; s++) {
    for (size_t i = 0; i < sizeof buf; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      buf[i] = (uint8_t)(x >> 56);
    }
    buf[0] = (uint8_t)(s * 37);
    add(buf, sizeof buf);
  }
}
