/* bench_sampler.c - CPU cost of sampling one token from a Llama-3-sized vocabulary (128256):
 * greedy, temperature, top-k, top-p, min-p and penalties, per token and per 256-sequence step
 * on one thread. usage: bench_sampler [vocab=128256] [iters=200] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sampling/sampler.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

int main(int argc, char **argv) {
  int V = argc > 1 ? atoi(argv[1]) : 128256, iters = argc > 2 ? atoi(argv[2]) : 200;
  struct sampler s;
  if (sampler_init(&s, V))
    return 1;
  float *base = malloc((size_t)V * sizeof *base), *lg = malloc((size_t)V * sizeof *lg);
  uint64_t x = 1;
  for (int i = 0; i < V; i++) { /* logits with a realistic spread: a few large, most small */
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(x >> 11) * 0x1.0p-53;
    base[i] = (float)(-8 + 10 * pow(u, 6));
  }
  int32_t hist[512];
  for (int i = 0; i < 512; i++)
    hist[i] = (i * 7919) % V;
  struct {
    const char *name;
    struct sampler_params p;
    int penalties;
  } cases[] = {
      {"greedy", {.temperature = 0, .top_p = 1, .repetition_penalty = 1}, 0},
      {"temperature 1.0", {.temperature = 1, .top_p = 1, .repetition_penalty = 1}, 0},
      {"top-k 50", {.temperature = 0.8f, .top_k = 50, .top_p = 1, .repetition_penalty = 1}, 0},
      {"top-p 0.9", {.temperature = 0.8f, .top_p = 0.9f, .repetition_penalty = 1}, 0},
      {"min-p 0.05", {.temperature = 0.8f, .top_p = 1, .min_p = 0.05f, .repetition_penalty = 1}, 0},
      {"temp 1 + penalties (512 tokens)",
       {.temperature = 1, .top_p = 1, .repetition_penalty = 1.1f, .presence_penalty = 0.5f, .frequency_penalty = 0.5f},
       1},
  };
  struct rng r;
  rng_seed(&r, 1);
  printf("vocab %d, one thread:\n", V);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double t0 = now_us();
    long sink = 0;
    for (int it = 0; it < iters; it++) {
      for (int i = 0; i < V; i++)
        lg[i] = base[i];
      if (cases[c].penalties)
        sampler_apply_processors(&s, &cases[c].p, lg, hist, 256, hist + 256, 256);
      sink += sampler_pick(&s, &cases[c].p, lg, &r);
    }
    double per = (now_us() - t0) / iters;
    printf("  %-32s %8.1f us per token, %7.2f ms per step of 256 sequences (%ld)\n", cases[c].name, per,
           per * 256 / 1000, sink % 2);
  }
  sampler_free(&s);
  free(base);
  free(lg);
  return 0;
}
