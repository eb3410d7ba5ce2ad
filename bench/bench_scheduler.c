/* bench_scheduler.c - scheduler + KV manager cost per step with 256 running sequences and a fake
 * forward pass (no model): schedule, CoW bookkeeping, num_computed/prefix-cache update, token
 * append, finishing and admitting requests in steady state. Prints mean / p50 / p99 per step.
 * usage: bench_scheduler [running=256] [steps=4000] [block_size=32] [prefix_cache=1] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scheduler.h"

struct seq {
  struct sched_seq s;
  int32_t *tokens; /* (cap) */
  int target;
};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int running = argc > 1 ? atoi(argv[1]) : 256, steps = argc > 2 ? atoi(argv[2]) : 4000;
  int bs = argc > 3 ? atoi(argv[3]) : 32, prefix = argc > 4 ? atoi(argv[4]) : 1;
  const int prompt = 512, max_out = 256, cap = prompt + max_out, pool = running * (cap / bs + 2) + 1;
  struct kv_manager kv;
  struct kv_manager_params kp = {pool, bs, cap / bs + 1, prefix, 0, 0};
  struct scheduler sch;
  struct scheduler_params sp = {8192, running, 4096, cap};
  if (kv_manager_init(&kv, &kp) || scheduler_init(&sch, &sp, &kv))
    return 1;
  /* 2 * running sequence records, recycled: a finished one is re-added with a new prompt. */
  int n = 2 * running;
  struct seq *seqs = calloc((size_t)n, sizeof *seqs);
  uint64_t rng = 1;
  for (int i = 0; i < n; i++) {
    seqs[i].tokens = malloc((size_t)cap * sizeof(int32_t));
    kv_seq_init(&seqs[i].s.kv, &kv);
  }
  struct seq **free_list = malloc((size_t)n * sizeof *free_list);
  int n_free = 0;
  for (int i = n - 1; i >= 0; i--)
    free_list[n_free++] = &seqs[i];
  double *t = malloc((size_t)steps * sizeof *t), all_sum = 0, all_max = 0;
  int measured = 0, all_n = 0;
  long long tokens = 0;
  for (int step = 0; measured < steps; step++) {
    double t0 = now_us();
    /* keep `running` sequences in the system: admit new prompts for the finished ones */
    while (sch.running.count + sch.waiting.count < running && n_free) {
      struct seq *q = free_list[--n_free];
      for (int i = 0; i < prompt; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        q->tokens[i] = i < 256 ? i : (int32_t)(rng >> 40); /* a 256-token shared system prompt */
      }
      q->s.tokens = q->tokens;
      q->s.num_tokens = q->s.num_prompt = prompt;
      q->s.admitted = 0;
      q->target = prompt + 64 + (int)((rng >> 20) % (max_out - 64));
      scheduler_add(&sch, &q->s);
    }
    const struct scheduler_output *o;
    if (scheduler_schedule(&sch, &o))
      return 1;
    /* fake forward: nothing; then the engine's bookkeeping */
    scheduler_update(&sch);
    for (int i = 0; i < o->num_items; i++) {
      struct seq *q = (struct seq *)o->items[i].seq;
      if (q->s.num_computed < q->s.num_tokens)
        continue;
      q->tokens[q->s.num_tokens++] = 7;
      if (q->s.num_tokens >= q->target) {
        scheduler_remove(&sch, &q->s);
        free_list[n_free++] = q;
      }
    }
    double dt = now_us() - t0;
    tokens += o->num_tokens;
    if (step > 50) {
      all_sum += dt;
      all_n++;
      all_max = dt > all_max ? dt : all_max;
    }
    /* measure only pure decode steps at full occupancy (prefill steps are dominated by hashing
     * their prompt blocks, which the forward pass dwarfs) */
    if (step > 50 && o->num_items == running && o->num_tokens <= running + 64)
      t[measured++] = dt;
    if (step > 100000)
      break;
  }
  qsort(t, (size_t)measured, sizeof *t, cmp);
  double sum = 0;
  for (int i = 0; i < measured; i++)
    sum += t[i];
  printf("scheduler+kv_manager per step: %d running, block size %d, prefix cache %s: mean %.2f us, "
         "p50 %.2f us, p99 %.2f us over %d decode steps (%lld preemptions)\n",
         running, bs, prefix ? "on" : "off", sum / measured, t[measured / 2], t[(int)(measured * 0.99)], measured,
         (long long)sch.total_preemptions);
  printf("all %d steps (admission steps hash their new prompts' blocks too): mean %.2f us, max %.2f us\n", all_n,
         all_sum / all_n, all_max);
  return 0;
}
