/* cpu_moe.c - the CPU backend's mixture-of-experts routing and combine (see backend.h): the
 * reference for the CUDA kernels, with the same grouping of rows by expert. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "util/log.h"

/* The k chosen experts of one token's logits l(E): ids sel[j] in increasing id order with their
 * renormalised weights w[j]. Softmax in double over all E (max subtracted), then the k largest
 * probabilities (lowest id first on ties), divided by their sum, as MixtralSparseMoeBlock does
 * (there in f32: the results agree to an f32 rounding). */
static void route_one(const float *l, int E, int k, int *sel, float *w) {
  double m = l[0], p[CPU_MOE_MAX_EXPERTS], sum = 0;
  for (int e = 1; e < E; e++)
    m = l[e] > m ? l[e] : m;
  for (int e = 0; e < E; e++)
    sum += p[e] = exp((double)l[e] - m);
  unsigned char taken[CPU_MOE_MAX_EXPERTS] = {0};
  double wsum = 0, pk[CPU_MOE_MAX_EXPERTS];
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || p[e] > p[best]))
        best = e;
    taken[best] = 1;
    wsum += p[best] / sum;
  }
  int j = 0;
  for (int e = 0; e < E; e++) /* increasing id order */
    if (taken[e]) {
      sel[j] = e;
      pk[j] = p[e] / sum;
      j++;
    }
  for (j = 0; j < k; j++)
    w[j] = (float)(pk[j] / wsum);
}

int cpu_moe_route(struct backend *be, const float *router_logits, int T, int E, int k, int32_t *row_token,
                  float *row_weight, int32_t *token_rows, int32_t *expert_start, int32_t *expert_start_host) {
  (void)be;
  if (E < 1 || E > CPU_MOE_MAX_EXPERTS || k < 1 || k > E || T < 0)
    return ERR("moe_route: %d experts, top %d, %d tokens (need 1 <= k <= E <= %d)", E, k, T,
               CPU_MOE_MAX_EXPERTS);
  /* Counting sort by expert, stable in (token, j) order, without scratch memory (nothing is
   * allocated per step): pass 1 counts each token's choices, pass 2 routes again (the same
   * result) and places the rows. */
  int sel[CPU_MOE_MAX_EXPERTS];
  float w[CPU_MOE_MAX_EXPERTS];
  memset(expert_start, 0, sizeof *expert_start * (size_t)(E + 1));
  for (int t = 0; t < T; t++) {
    route_one(router_logits + (size_t)t * E, E, k, sel, w);
    for (int j = 0; j < k; j++)
      expert_start[sel[j] + 1]++;
  }
  for (int e = 0; e < E; e++)
    expert_start[e + 1] += expert_start[e];
  int32_t next[CPU_MOE_MAX_EXPERTS];
  memcpy(next, expert_start, sizeof *next * (size_t)E);
  for (int t = 0; t < T; t++) {
    route_one(router_logits + (size_t)t * E, E, k, sel, w);
    for (int j = 0; j < k; j++) {
      int r = next[sel[j]]++;
      row_token[r] = t;
      row_weight[r] = w[j];
      token_rows[(size_t)t * k + j] = r;
    }
  }
  memcpy(expert_start_host, expert_start, sizeof *expert_start * (size_t)(E + 1));
  return 0;
}

int cpu_moe_combine(struct backend *be, void *out, const void *y, const int32_t *token_rows,
                    const float *row_weight, int T, int k, int D) {
  float *o = out;       /* (T, D) */
  const float *ys = y;  /* (T * k, D) */
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)T * k * D)) if (T > 1) schedule(static)
  for (int t = 0; t < T; t++) {
    float *ot = o + (size_t)t * D;
    for (int d = 0; d < D; d++)
      ot[d] = 0.0f;
    for (int j = 0; j < k; j++) {
      int r = token_rows[(size_t)t * k + j];
      float wr = row_weight[r];
      const float *yr = ys + (size_t)r * D;
      for (int d = 0; d < D; d++)
        ot[d] += wr * yr[d];
    }
  }
  return 0;
}
