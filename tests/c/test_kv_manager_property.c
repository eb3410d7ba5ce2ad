/* test_kv_manager_property.c - 100,000+ random KV-manager operations (admit with prefix match,
 * append, fork, copy-on-write, free, evict, preempt) with every invariant checked after each:
 * ref counts equal the number of tables holding a block, free + used = total, the free queue
 * holds exactly the unreferenced blocks, every cached hash maps to a block holding those tokens,
 * and every sequence reads back its own tokens from the simulated KV contents. */
#include <string.h>

#include "core/kv_manager.h"
#include "test_util.h"
#include "util/log.h"

#define MAX_SEQS 16
#define MAX_BLOCKS 12

struct sim_seq {
  struct kv_seq kv;
  int32_t tokens[MAX_BLOCKS * 32];
  int live;
};

static struct kv_manager m;
static struct sim_seq seqs[MAX_SEQS];
static int32_t *content; /* (num_blocks, block_size) simulated KV: the token written in each slot */
static int bs;
static uint64_t rng;
static long ops, fits, no_fits, hits_tokens, cows, forks, evictions;

static int rnd(int n) { return (int)(test_rand(&rng) % (uint64_t)n); }

/* Prompt tokens from one of four families sharing long prefixes, so prefix hits are frequent. */
static void make_tokens(int32_t *t, int n) {
  int fam = rnd(4), shared = rnd(n + 1);
  for (int i = 0; i < n; i++)
    t[i] = i < shared ? fam * 7919 + i : 100000 + rnd(5);
}

/* The model "computes" tokens [from, to) of S: writes them into their slots. */
static void compute(struct sim_seq *s, int from, int to) {
  for (int i = from; i < to; i++)
    content[s->kv.blocks[i / bs] * bs + i % bs] = s->tokens[i];
  kv_manager_cache_full_blocks(&m, &s->kv, s->tokens, to);
}

static void apply_copy(const struct kv_copy *c) {
  if (c->src < 0)
    return;
  memcpy(content + c->dst * bs, content + c->src * bs, (size_t)bs * sizeof *content);
  cows++;
}

/* Reserves N more slots of S and computes them; on "does not fit" checks nothing changed. */
static int grow(struct sim_seq *s, int n) {
  struct kv_seq before = s->kv;
  int free_before = kv_manager_num_free(&m);
  int need = kv_manager_blocks_needed(&m, &s->kv, n);
  struct kv_copy cp;
  int rc = kv_manager_allocate(&m, &s->kv, n, &cp);
  if (rc == 1) {
    no_fits++;
    CHECK(need > free_before, "refused although %d <= %d free", need, free_before);
    CHECK(kv_manager_num_free(&m) == free_before && s->kv.num_tokens == before.num_tokens &&
              s->kv.num_blocks == before.num_blocks,
          "a refused allocation changed state");
    return 1;
  }
  CHECK(rc == 0, "allocate: %s", err_last());
  fits++;
  CHECK(free_before - kv_manager_num_free(&m) == need, "took %d blocks, predicted %d",
        free_before - kv_manager_num_free(&m), need);
  apply_copy(&cp);
  compute(s, s->kv.num_tokens - n, s->kv.num_tokens);
  return 0;
}

/* Admits S with tokens already set: prefix match, then the rest; released when it cannot fit. */
static void admit(struct sim_seq *s, int n) {
  int hit = kv_manager_match_prefix(&m, &s->kv, s->tokens, n);
  CHECK(hit % bs == 0 && hit <= n - 1, "hit %d of %d", hit, n);
  CHECK(m.p.enable_prefix_cache || hit == 0, "hit with caching off");
  hits_tokens += hit;
  if (grow(s, n - hit)) {
    kv_manager_release(&m, &s->kv);
    return;
  }
  s->live = 1;
}

static int free_slot(void) {
  int i = rnd(MAX_SEQS);
  for (int k = 0; k < MAX_SEQS; k++)
    if (!seqs[(i + k) % MAX_SEQS].live)
      return (i + k) % MAX_SEQS;
  return -1;
}

static struct sim_seq *live_seq(void) {
  int i = rnd(MAX_SEQS);
  for (int k = 0; k < MAX_SEQS; k++)
    if (seqs[(i + k) % MAX_SEQS].live)
      return &seqs[(i + k) % MAX_SEQS];
  return NULL;
}

static void check_all(void) {
  struct kv_seq *tabs[MAX_SEQS];
  int n = 0;
  for (int i = 0; i < MAX_SEQS; i++)
    if (seqs[i].live)
      tabs[n++] = &seqs[i].kv;
  if (kv_manager_check(&m, tabs, n)) {
    CHECK(0, "after op %ld: %s", ops, err_last());
    return;
  }
  /* Every sequence reads its own tokens back through its table (sharing and CoW are right), and
   * its cached blocks store exactly those tokens. */
  for (int q = 0; q < MAX_SEQS; q++) {
    struct sim_seq *s = &seqs[q];
    if (!s->live)
      continue;
    for (int i = 0; i < s->kv.num_tokens; i++)
      if (content[s->kv.blocks[i / bs] * bs + i % bs] != s->tokens[i]) {
        CHECK(0, "op %ld: seq %d reads a wrong token at %d", ops, q, i);
        return;
      }
    for (int b = 0; b < s->kv.num_blocks; b++) {
      int32_t id = s->kv.blocks[b];
      if (m.pool.blocks[id].has_hash &&
          memcmp(m.cache.tokens + (size_t)id * bs, s->tokens + b * bs, (size_t)bs * 4)) {
        CHECK(0, "op %ld: cached block %d stores other tokens than seq %d", ops, id, q);
        return;
      }
    }
  }
}

static void run(int num_blocks, int block_size, int prefix, int n_ops) {
  bs = block_size;
  struct kv_manager_params p = {num_blocks, bs, MAX_BLOCKS, prefix, 0, 0};
  if (kv_manager_init(&m, &p)) {
    CHECK(0, "init: %s", err_last());
    return;
  }
  content = calloc((size_t)num_blocks * bs, sizeof *content);
  for (int i = 0; i < MAX_SEQS; i++) {
    kv_seq_init(&seqs[i].kv, &m);
    seqs[i].live = 0;
  }
  int cap = MAX_BLOCKS * bs;
  for (int k = 0; k < n_ops && test_failures == 0; k++, ops++) {
    int op = rnd(100);
    struct sim_seq *s;
    int j;
    if (op < 25) { /* admit a new prompt */
      if ((j = free_slot()) >= 0) {
        int n = 1 + rnd(cap / 2);
        make_tokens(seqs[j].tokens, n);
        admit(&seqs[j], n);
      }
    } else if (op < 60) { /* append: decode tokens or a chunk */
      if ((s = live_seq()) && s->kv.num_tokens < cap) {
        int n = rnd(4) ? 1 : 1 + rnd(2 * bs);
        if (s->kv.num_tokens + n > cap)
          n = cap - s->kv.num_tokens;
        for (int i = 0; i < n; i++)
          s->tokens[s->kv.num_tokens + i] = 200000 + rnd(3);
        grow(s, n);
      }
    } else if (op < 72) { /* fork: a sample or beam shares every block */
      if ((s = live_seq()) && (j = free_slot()) >= 0) {
        kv_manager_fork(&m, &s->kv, &seqs[j].kv);
        memcpy(seqs[j].tokens, s->tokens, (size_t)s->kv.num_tokens * 4);
        seqs[j].live = 1;
        forks++;
      }
    } else if (op < 87) { /* finish / abort */
      if ((s = live_seq())) {
        kv_manager_release(&m, &s->kv);
        s->live = 0;
      }
    } else if (op < 95) { /* preempt by recompute: release, then re-admit the same tokens */
      if ((s = live_seq())) {
        int n = s->kv.num_tokens;
        kv_manager_release(&m, &s->kv);
        s->live = 0;
        check_all();
        admit(s, n);
      }
    } else { /* evict: a burst of fresh blocks pushes cached ones out */
      if ((j = free_slot()) >= 0) {
        int n = 1 + rnd(cap - 1);
        for (int i = 0; i < n; i++)
          seqs[j].tokens[i] = 300000 + i + rnd(1000) * 1000;
        if (kv_manager_match_prefix(&m, &seqs[j].kv, seqs[j].tokens, n) == 0 && !grow(&seqs[j], n))
          seqs[j].live = 1;
        else
          kv_manager_release(&m, &seqs[j].kv);
      }
    }
    check_all();
  }
  for (int i = 0; i < MAX_SEQS; i++) {
    if (seqs[i].live)
      kv_manager_release(&m, &seqs[i].kv);
    seqs[i].live = 0;
  }
  check_all();
  CHECK(kv_manager_num_free(&m) == num_blocks - 1, "all blocks back: %d of %d", kv_manager_num_free(&m),
        num_blocks - 1);
  for (int i = 0; i < MAX_SEQS; i++)
    kv_seq_free(&seqs[i].kv);
  evictions += m.cache.stats.evictions;
  free(content);
  kv_manager_free(&m);
}

int main(void) {
  rng = 0x9e3779b97f4a7c15ull;
  const int sizes[3] = {8, 16, 32};
  for (int r = 0; r < 12; r++)
    run(24 + r * 12, sizes[r % 3], r % 4 != 3, 9000);
  printf("%ld ops: %ld allocations fit, %ld did not, %ld forks, %ld copy-on-writes, %ld prefix-hit tokens, "
         "%ld evictions\n",
         ops, fits, no_fits, forks, cows, hits_tokens, evictions);
  CHECK(ops >= 100000, "ran %ld ops", ops);
  CHECK(no_fits > 1000 && cows > 1000 && hits_tokens > 10000 && forks > 1000 && evictions > 1000, "every path exercised");
  return test_finish("test_kv_manager_property");
}
