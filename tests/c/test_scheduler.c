/* test_scheduler.c - token budgets, max sequences, chunked prefill, mixed steps, prefix hits,
 * preemption by recompute on a tiny pool (nothing lost, invariants after every step) and
 * admission rejection. A fake model: the "next token" of a sequence is a function of its id
 * and position, so any lost or duplicated work shows up in the final token lists. */
#include <string.h>

#include "core/scheduler.h"
#include "test_util.h"
#include "util/log.h"

#define MAXSEQ 32
#define MAXTOK 512

struct fake_seq {
  struct sched_seq s;
  int32_t tokens[MAXTOK];
  int target, id, done;
};

static struct kv_manager kv;
static struct scheduler sch;
static struct fake_seq seqs[MAXSEQ];

static void setup(int num_blocks, int bs, int prefix, int max_tokens, int max_seqs, int chunk) {
  struct kv_manager_params kp = {num_blocks, bs, MAXTOK / bs, prefix, 0, 0};
  kv_manager_init(&kv, &kp);
  struct scheduler_params sp = {max_tokens, max_seqs, chunk, MAXTOK};
  scheduler_init(&sch, &sp, &kv);
  memset(seqs, 0, sizeof seqs);
}

static void teardown(void) {
  for (int i = 0; i < MAXSEQ; i++)
    if (seqs[i].s.kv.blocks)
      kv_seq_free(&seqs[i].s.kv);
  scheduler_free(&sch);
  kv_manager_free(&kv);
}

static struct fake_seq *new_seq(int id, int prompt_len, int target, int shared) {
  struct fake_seq *f = &seqs[id];
  kv_seq_init(&f->s.kv, &kv);
  for (int i = 0; i < prompt_len; i++)
    f->tokens[i] = i < shared ? 1000 + i : 5000 + id * 300 + i;
  f->s.tokens = f->tokens;
  f->s.num_tokens = f->s.num_prompt = prompt_len;
  f->target = target;
  f->id = id;
  scheduler_add(&sch, &f->s);
  return f;
}

static int32_t next_token(const struct fake_seq *f, int pos) { return 70000 + f->id * 1000 + pos; }

/* One step: schedule, check invariants, "compute", sample for sequences whose tokens are all
 * computed, finish the ones that reached their target. Returns tokens run. */
static int step(const struct scheduler_output **po) {
  const struct scheduler_output *o;
  if (scheduler_schedule(&sch, &o)) {
    CHECK(0, "schedule: %s", err_last());
    return -1;
  }
  *po = o;
  int tokens = 0;
  for (int i = 0; i < o->num_items; i++)
    tokens += o->items[i].num_new;
  CHECK(tokens == o->num_tokens && tokens <= sch.p.max_num_batched_tokens, "budget %d", tokens);
  CHECK(o->num_items <= sch.p.max_num_seqs, "max seqs");
  for (int i = 0; i < o->num_items; i++)
    CHECK(o->items[i].num_new <= sch.p.prefill_chunk_size, "chunk");
  scheduler_update(&sch);
  struct kv_seq *tabs[MAXSEQ];
  int n = 0;
  for (int i = 0; i < MAXSEQ; i++)
    if (seqs[i].s.state == SCHED_RUNNING)
      tabs[n++] = &seqs[i].s.kv;
    else if (seqs[i].s.state == SCHED_WAITING)
      CHECK(seqs[i].s.kv.num_blocks == 0, "waiting seq %d holds blocks", i);
  CHECK(kv_manager_check(&kv, tabs, n) == 0, "invariants: %s", err_last());
  for (int i = 0; i < o->num_items; i++) {
    struct fake_seq *f = (struct fake_seq *)o->items[i].seq;
    if (f->s.num_computed != f->s.num_tokens)
      continue;
    f->tokens[f->s.num_tokens] = next_token(f, f->s.num_tokens);
    f->s.num_tokens++;
    if (f->s.num_tokens >= f->target) {
      scheduler_remove(&sch, &f->s);
      f->done = 1;
    }
  }
  return tokens;
}

static void run_to_end(int max_steps) {
  const struct scheduler_output *o;
  for (int k = 0; k < max_steps && scheduler_has_work(&sch) && test_failures == 0; k++)
    step(&o);
  CHECK(!scheduler_has_work(&sch), "did not finish");
}

static void check_outputs(int n) {
  for (int i = 0; i < n; i++) {
    struct fake_seq *f = &seqs[i];
    CHECK(f->done && f->s.num_tokens == f->target, "seq %d: %d of %d tokens", i, f->s.num_tokens, f->target);
    for (int p = f->s.num_prompt; p < f->s.num_tokens; p++)
      if (f->tokens[p] != next_token(f, p)) {
        CHECK(0, "seq %d: token %d lost", i, p);
        break;
      }
  }
  CHECK(kv_manager_num_free(&kv) == kv_manager_capacity(&kv), "all blocks returned");
}

int main(void) {
  const struct scheduler_output *o;
  /* Budget 256, chunk 64, prompts of 100: four 64-token chunks fill step 1. */
  setup(200, 16, 0, 256, 8, 64);
  for (int i = 0; i < 10; i++)
    new_seq(i, 100, 110, 0);
  step(&o);
  CHECK(o->num_items == 4 && o->num_tokens == 256, "step 1: %d seqs %d tokens", o->num_items, o->num_tokens);
  for (int i = 0; i < o->num_items; i++)
    CHECK(o->items[i].seq == &seqs[i].s && o->items[i].num_new == 64, "step 1 item %d", i);
  /* Step 2: the running four finish their prompts (36 each), then waiting ones start. */
  step(&o);
  CHECK(o->num_items == 6 && o->items[0].num_new == 36 && o->items[3].num_new == 36 &&
            o->items[4].num_new == 64 && o->items[5].num_new == 48 && o->num_tokens == 256,
        "step 2: %d seqs, %d tokens", o->num_items, o->num_tokens);
  /* Step 3 is mixed: decodes of seqs 0-3 (1 token each) and prompt chunks. */
  step(&o);
  int decodes = 0, chunks = 0;
  for (int i = 0; i < o->num_items; i++)
    o->items[i].num_new == 1 ? decodes++ : chunks++;
  CHECK(decodes == 4 && chunks >= 2 && o->items[0].num_new == 1, "mixed step: %d decodes %d chunks", decodes,
        chunks);
  CHECK(o->num_items == 8, "max_num_seqs caps the step: %d", o->num_items);
  run_to_end(1000);
  check_outputs(10);
  teardown();

  /* Prefix hits: 8 requests sharing 64 of 80 prompt tokens (bs 16): after the first, each skips
   * 64 tokens. Serialised admission (budget 80) so the first one's blocks are cached. */
  setup(200, 16, 1, 80, 8, 4096);
  new_seq(0, 80, 81, 64);
  step(&o);
  for (int i = 1; i < 8; i++)
    new_seq(i, 80, 81, 64);
  run_to_end(1000);
  check_outputs(8);
  for (int i = 1; i < 8; i++)
    CHECK(seqs[i].s.num_cached_prompt == 64, "seq %d cached %d", i, seqs[i].s.num_cached_prompt);
  CHECK(kv.cache.stats.hits == 7 * 64 && kv.cache.stats.queries == 8 * 80, "prefix stats %lld / %lld",
        (long long)kv.cache.stats.hits, (long long)kv.cache.stats.queries);
  teardown();

  /* The same, all arriving together with a large budget: the others wait one step for the first
   * to compute the shared blocks instead of computing them too. */
  setup(200, 16, 1, 4096, 8, 4096);
  for (int i = 0; i < 8; i++)
    new_seq(i, 80, 81, 64);
  step(&o);
  CHECK(o->num_items == 1, "step 1 admits only the first of the shared-prefix requests (%d)", o->num_items);
  run_to_end(1000);
  check_outputs(8);
  for (int i = 1; i < 8; i++)
    CHECK(seqs[i].s.num_cached_prompt == 64, "together: seq %d cached %d", i, seqs[i].s.num_cached_prompt);
  teardown();

  /* A prompt of exactly 2 blocks recomputes its last token: only 1 block can hit. */
  setup(64, 16, 1, 512, 8, 4096);
  new_seq(0, 32, 33, 32);
  run_to_end(100);
  new_seq(1, 32, 33, 32);
  run_to_end(100);
  CHECK(seqs[1].s.num_cached_prompt == 16, "last prompt token recomputed: cached %d", seqs[1].s.num_cached_prompt);
  teardown();

  /* Preemption: 12 sequences growing to 200 tokens on a pool of 40 blocks of 16 (= 640 slots):
   * they cannot all run; the newest are preempted, recomputed later, and nothing is lost. */
  for (int prefix = 0; prefix < 2; prefix++) {
    setup(41, 16, prefix, 512, 16, 48);
    for (int i = 0; i < 12; i++)
      new_seq(i, 40 + 7 * i, 200, prefix ? 32 : 0);
    run_to_end(20000);
    check_outputs(12);
    CHECK(sch.total_preemptions > 0, "the tiny pool forced preemptions (%lld)", (long long)sch.total_preemptions);
    int preempted_seqs = 0;
    for (int i = 0; i < 12; i++)
      preempted_seqs += seqs[i].s.num_preemptions > 0;
    CHECK(preempted_seqs > 0 && seqs[0].s.num_preemptions == 0, "the oldest is never the victim");
    teardown();
  }

  /* Admission: beyond the context or the whole pool is refused with a reason. */
  setup(9, 16, 1, 512, 8, 4096); /* 8 usable blocks = 128 tokens */
  CHECK(scheduler_check_admission(&sch, 100, 28) == 0, "128 tokens fit exactly");
  CHECK(scheduler_check_admission(&sch, 100, 29) != 0 && strstr(err_last(), "--pa-memory-mb"),
        "beyond the pool: %s", err_last());
  CHECK(scheduler_check_admission(&sch, 500, 13) != 0 && strstr(err_last(), "maximum sequence length"),
        "beyond the context: %s", err_last());
  CHECK(scheduler_check_admission(&sch, 0, 10) != 0, "empty prompt");
  teardown();
  return test_finish("test_scheduler");
}
