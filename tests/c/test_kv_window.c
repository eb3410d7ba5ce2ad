/* test_kv_window.c - the KV manager's sliding window (kv_manager_set_window), by property:
 * random admissions with prefix matching, prefill chunks, decode steps, forks and releases
 * with windows of 1..3 blocks and not block-aligned, every invariant checked after each op
 * (kv_manager_check), and:
 * - every query sees correct keys: when tokens [from, to) are computed, each position in
 *   [from - window + 1, to) reads back its own token through the table (a block released by
 *   the window is never one a query needs);
 * - prefix hits stay correct: every matched block holds the prompt's tokens, though blocks
 *   released by the window wait in the free queue and get reused under pressure;
 * - memory is bounded: a sequence decoding 4x the window, one token a step, never holds more
 *   than window / block_size + 2 blocks, and the pool gets every block back at the end;
 * - kv_manager_blocks_needed predicts the blocks an allocation takes net of the trim, and an
 *   allocation is refused only when they exceed the free ones. */
#include <string.h>

#include "core/kv_manager.h"
#include "test_util.h"
#include "util/log.h"

#define MAX_SEQS 8
#define MAX_BLOCKS 64

struct sim_seq {
  struct kv_seq kv;
  int32_t tokens[MAX_BLOCKS * 32];
  int live;
};

static struct kv_manager m;
static struct sim_seq seqs[MAX_SEQS];
static int32_t *content; /* (num_blocks, block_size): the token written in each slot */
static int bs, window;
static uint64_t rng;
static long ops, hits, trimmed_seen, refused;

static int rnd(int n) { return (int)(test_rand(&rng) % (uint64_t)n); }

static int held(const struct kv_seq *s) { return s->num_blocks - s->num_trimmed; }

/* Computes tokens [from, to) of S: first every key a query of the chunk can see must read back
 * its token, then the chunk is written and its full blocks registered. */
static void compute(struct sim_seq *s, int from, int to) {
  int lo = from - window + 1 > 0 ? from - window + 1 : 0;
  for (int p = lo; p < from; p++) {
    int32_t id = s->kv.blocks[p / bs];
    if (id == 0 || content[id * bs + p % bs] != s->tokens[p]) {
      CHECK(0, "op %ld: a query at %d sees block %d, which lost position %d (window %d)", ops, from,
            id, p, window);
      return;
    }
  }
  for (int p = from; p < to; p++)
    content[s->kv.blocks[p / bs] * bs + p % bs] = s->tokens[p];
  kv_manager_cache_full_blocks(&m, &s->kv, s->tokens, to);
  trimmed_seen += s->kv.num_trimmed > 0;
}

static int grow(struct sim_seq *s, int n) {
  struct kv_copy cp;
  int need = kv_manager_blocks_needed(&m, &s->kv, n), free_before = kv_manager_num_free(&m);
  int rc = kv_manager_allocate(&m, &s->kv, n, &cp);
  if (rc == 1) {
    refused++;
    CHECK(need > free_before, "refused although %d <= %d free", need, free_before);
    return 1;
  }
  CHECK(rc == 0, "allocate: %s", err_last());
  int taken = free_before - kv_manager_num_free(&m);
  CHECK(taken == need || (need == 0 && taken < 0), "took %d blocks net, predicted %d", taken, need);
  if (cp.src >= 0)
    memcpy(content + cp.dst * bs, content + cp.src * bs, (size_t)bs * sizeof *content);
  compute(s, s->kv.num_tokens - n, s->kv.num_tokens);
  return 0;
}

static void check_all(void) {
  struct kv_seq *tabs[MAX_SEQS];
  int n = 0;
  for (int i = 0; i < MAX_SEQS; i++)
    if (seqs[i].live)
      tabs[n++] = &seqs[i].kv;
  if (kv_manager_check(&m, tabs, n))
    CHECK(0, "after op %ld: %s", ops, err_last());
}

static void run(int num_blocks, int block_size, int win, int prefix, int n_ops) {
  bs = block_size;
  window = win;
  struct kv_manager_params p = {num_blocks, bs, MAX_BLOCKS, prefix, 0, 0};
  if (kv_manager_init(&m, &p)) {
    CHECK(0, "init: %s", err_last());
    return;
  }
  kv_manager_set_window(&m, win);
  content = calloc((size_t)num_blocks * bs, sizeof *content);
  for (int i = 0; i < MAX_SEQS; i++) {
    kv_seq_init(&seqs[i].kv, &m);
    seqs[i].live = 0;
  }
  for (int k = 0; k < n_ops && test_failures == 0; k++, ops++) {
    int op = rnd(10);
    struct sim_seq *s = &seqs[rnd(MAX_SEQS)];
    if (!s->live && op < 7) { /* admit: one of 3 prompt families, prefix match, prefill */
      int n = 2 + rnd(bs * 6), fam = rnd(3);
      for (int i = 0; i < MAX_BLOCKS * bs; i++)
        s->tokens[i] = fam * 100003 + i;
      int hit = kv_manager_match_prefix(&m, &s->kv, s->tokens, n);
      for (int p = 0; p < hit; p++)
        if (content[s->kv.blocks[p / bs] * bs + p % bs] != s->tokens[p]) {
          CHECK(0, "op %ld: prefix hit of %d tokens serves a block without position %d", ops, hit, p);
          break;
        }
      hits += hit;
      /* prefill in chunks of up to 2 blocks */
      int done = hit, ok = 1;
      while (ok && done < n) {
        int c = n - done < 2 * bs ? n - done : 1 + rnd(2 * bs);
        c = c > n - done ? n - done : c;
        ok = grow(s, c) == 0;
        done += ok ? c : 0;
      }
      if (ok)
        s->live = 1;
      else
        kv_manager_release(&m, &s->kv);
    } else if (s->live && op < 8) { /* decode steps */
      int steps = 1 + rnd(3 * bs);
      for (int i = 0; i < steps && s->kv.num_tokens + 1 <= MAX_BLOCKS * bs; i++)
        if (grow(s, 1))
          break;
    } else if (s->live && op == 8) { /* fork into a free slot */
      struct sim_seq *c = &seqs[rnd(MAX_SEQS)];
      if (!c->live && c != s) {
        kv_manager_fork(&m, &s->kv, &c->kv);
        memcpy(c->tokens, s->tokens, sizeof s->tokens);
        c->live = 1;
      }
    } else if (s->live) {
      kv_manager_release(&m, &s->kv);
      s->live = 0;
    }
    check_all();
  }
  for (int i = 0; i < MAX_SEQS; i++) {
    if (seqs[i].live)
      kv_manager_release(&m, &seqs[i].kv);
    seqs[i].live = 0;
    kv_seq_free(&seqs[i].kv);
  }
  CHECK(kv_manager_num_free(&m) == kv_manager_capacity(&m), "window %d: %d of %d blocks free at the end",
        win, kv_manager_num_free(&m), kv_manager_capacity(&m));
  free(content);
  kv_manager_free(&m);
}

/* One sequence of 4x the window, decoded a token at a time after a one-block prompt: the blocks
 * it holds stay within window / block_size + 2; without the window they grow to 4x. */
static void bounded(int block_size, int win, int prefix) {
  bs = block_size;
  window = win;
  int total = 4 * win;
  struct kv_manager_params p = {MAX_BLOCKS + 1, bs, MAX_BLOCKS, prefix, 0, 0};
  if (kv_manager_init(&m, &p)) {
    CHECK(0, "init: %s", err_last());
    return;
  }
  kv_manager_set_window(&m, win);
  content = calloc((size_t)(MAX_BLOCKS + 1) * bs, sizeof *content);
  struct sim_seq *s = &seqs[0];
  kv_seq_init(&s->kv, &m);
  for (int i = 0; i < total; i++)
    s->tokens[i] = 7 + i;
  int max_held = 0;
  CHECK(grow(s, bs) == 0, "prompt");
  while (s->kv.num_tokens < total && test_failures == 0) {
    CHECK(grow(s, 1) == 0, "decode at %d", s->kv.num_tokens);
    if (held(&s->kv) > max_held)
      max_held = held(&s->kv);
    CHECK(kv_manager_capacity(&m) - kv_manager_num_free(&m) == held(&s->kv),
          "the pool lends %d blocks, the sequence holds %d",
          kv_manager_capacity(&m) - kv_manager_num_free(&m), held(&s->kv));
  }
  CHECK(max_held <= win / bs + 2, "window %d, block size %d: held up to %d blocks > %d", win, bs,
        max_held, win / bs + 2);
  CHECK(s->kv.num_blocks == (total + bs - 1) / bs, "table covers all %d tokens", total);
  printf("window %d, block size %d, %d tokens: at most %d blocks held (bound %d, no window %d)\n",
         win, bs, total, max_held, win / bs + 2, (total + bs - 1) / bs);
  kv_manager_release(&m, &s->kv);
  CHECK(kv_manager_num_free(&m) == kv_manager_capacity(&m), "all blocks back");
  kv_seq_free(&s->kv);
  free(content);
  kv_manager_free(&m);
}

int main(void) {
  log_set_level(LOG_LEVEL_ERROR);
  rng = 0x5eed;
  bounded(8, 64, 1);
  bounded(16, 100, 0);
  bounded(32, 96, 1);
  const struct {
    int blocks, bs, win, prefix;
  } cfgs[] = {{40, 8, 8, 1}, {40, 8, 13, 1}, {24, 8, 20, 1}, {64, 16, 40, 1}, {30, 16, 17, 0},
              {48, 32, 33, 1}, {20, 8, 1, 1}};
  for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++)
    run(cfgs[i].blocks, cfgs[i].bs, cfgs[i].win, cfgs[i].prefix, 20000);
  printf("%ld ops, %ld prefix-hit tokens, %ld computes with trimmed blocks, %ld refusals\n", ops,
         hits, trimmed_seen, refused);
  CHECK(hits > 0 && trimmed_seen > 0 && refused > 0, "the run exercised hits, trimming and a full pool");
  return test_finish("test_kv_window");
}
