/* cpu_act.c - the CPU backend's element-wise ops of Gemma 2: GeGLU (tanh GELU), scale, logit
 * softcapping. Reference semantics for the CUDA kernels (see backend.h). Arithmetic in double,
 * rounded to f32 once, so the result is within one f32 rounding of the exact value. */
#include <math.h>

#include "backend/cpu/cpu_backend.h"
#include "util/log.h"

/* sqrt(2 / pi), the constant of PyTorch's tanh approximation of GELU. */
#define GELU_TANH_C 0.7978845608028654
#define GELU_TANH_K 0.044715

int cpu_gelu_tanh_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F) {
  if (T < 0 || F < 0)
    return ERR("gelu_tanh_mul: T = %d, F = %d", T, F);
  float *o = out;        /* (T, F), may alias gate */
  const float *g = gate; /* (T, F) */
  const float *u = up;   /* (T, F) */
  size_t n = (size_t)T * F;
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)n * 16)) if (n > 65536) schedule(static)
  for (size_t i = 0; i < n; i++) {
    double x = g[i];
    double gelu = 0.5 * x * (1.0 + tanh(GELU_TANH_C * (x + GELU_TANH_K * x * x * x)));
    o[i] = (float)(gelu * u[i]);
  }
  return 0;
}

int cpu_scale(struct backend *be, void *x, size_t n, float s) {
  float *v = x; /* (n) */
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)n)) if (n > 65536) schedule(static)
  for (size_t i = 0; i < n; i++)
    v[i] *= s;
  return 0;
}

int cpu_softcap(struct backend *be, float *logits, int n, int vocab, float cap) {
  if (!(cap > 0) || n < 0 || vocab < 0)
    return ERR("softcap: cap %g (must be > 0), %d rows of %d", (double)cap, n, vocab);
  size_t total = (size_t)n * vocab;
#pragma omp parallel for num_threads(cpu_threads_for(be, (int64_t)total * 16)) if (total > 65536) schedule(static)
  for (size_t i = 0; i < total; i++)
    logits[i] = (float)(cap * tanh((double)(logits[i] / cap)));
  return 0;
}
