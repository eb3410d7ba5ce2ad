/* gpu_pair.h - helpers for GPU tests that run the same op on the CPU backend (the reference) and
 * the CUDA backend: buffers mirrored on both, act-dtype conversion, a fresh seed per run. */
#ifndef PAGODA_GPU_PAIR_H
#define PAGODA_GPU_PAIR_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "test_util.h"
#include "util/dtype.h"
#include "util/log.h"

/* be[0] = cpu (reference), be[1] = cuda */
static struct backend *pair_be[2];
static uint64_t pair_rng;

/* The same tensor on both backends. */
struct dbuf {
  void *p[2];
};

/* Fresh inputs every run (seed from the clock and pid, printed); PAGODA_TEST_SEED repeats a run. */
static inline void pair_seed(void) {
  const char *s = getenv("PAGODA_TEST_SEED");
  pair_rng = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ 0x5eedull;
  printf("seed %llu (PAGODA_TEST_SEED=%llu repeats this run)\n", (unsigned long long)pair_rng,
         (unsigned long long)pair_rng);
}

/* 1 when both backends were made; 0 after a message when there is no GPU (test skips). */
static inline int pair_open(void) {
  if (!backend_device_available("cuda")) {
    printf("skipped: %s\n", err_last());
    return 0;
  }
  pair_be[0] = backend_cpu_create(0);
  pair_be[1] = backend_create(&(struct backend_params){.device = "cuda"}); /* the dlopen'ed module */
  if (!pair_be[0] || !pair_be[1]) {
    fprintf(stderr, "backend create failed: %s\n", err_last_where());
    exit(1);
  }
  return 1;
}

static inline void pair_close(void) {
  for (int i = 0; i < 2; i++)
    if (pair_be[i])
      pair_be[i]->ops->destroy(pair_be[i]);
}

/* A CUDA backend created with VAR=VAL (VAR restored after), or NULL with err_last() set. */
static inline struct backend *pair_cuda_with_env(const char *var, const char *val) {
  const char *prev = getenv(var);
  char *saved = prev ? strdup(prev) : NULL;
  setenv(var, val, 1);
  struct backend *be = backend_create(&(struct backend_params){.device = "cuda"});
  if (saved) {
    setenv(var, saved, 1);
    free(saved);
  } else {
    unsetenv(var);
  }
  return be;
}

/* A uniform value in [-scale, scale) that bf16 represents exactly, so both backends see the
 * same input whatever their activation dtype. */
static inline float pair_rnd(float scale) { return bf16_to_f32(f32_to_bf16(test_randf(&pair_rng) * scale)); }

static inline void pair_fill(float *h, size_t n, float scale) {
  for (size_t i = 0; i < n; i++)
    h[i] = pair_rnd(scale);
}

static inline int pair_int(int lo, int hi) { /* uniform in [lo, hi] */
  return lo + (int)(test_rand(&pair_rng) % (uint64_t)(hi - lo + 1));
}

static inline size_t pair_esz(int i) { return dtype_row_bytes(pair_be[i]->act_dtype, 1); }

static inline void pair_die(const char *what) {
  fprintf(stderr, "%s failed: %s\n", what, err_last_where());
  exit(1);
}

static inline void *pair_alloc1(int i, size_t bytes) {
  void *p = pair_be[i]->ops->alloc(pair_be[i], bytes ? bytes : 4);
  if (!p)
    pair_die("alloc");
  return p;
}

/* Uploads H (n floats) as act dtype elements to backend i's buffer D. */
static inline void pair_put_act(int i, void *d, const float *h, size_t n) {
  struct backend *be = pair_be[i];
  if (be->act_dtype == DTYPE_F32) {
    if (be->ops->upload(be, d, h, n * 4))
      pair_die("upload");
    return;
  }
  uint16_t *t = malloc(n * 2 + 2);
  for (size_t k = 0; k < n; k++)
    t[k] = f32_to_bf16(h[k]);
  if (be->ops->upload(be, d, t, n * 2))
    pair_die("upload");
  free(t);
}

/* Downloads n act-dtype elements of backend i's D into H as floats. */
static inline void pair_get_act(int i, float *h, const void *d, size_t n) {
  struct backend *be = pair_be[i];
  if (be->act_dtype == DTYPE_F32) {
    if (be->ops->download(be, h, d, n * 4))
      pair_die("download");
    return;
  }
  uint16_t *t = malloc(n * 2 + 2);
  if (be->ops->download(be, t, d, n * 2))
    pair_die("download");
  for (size_t k = 0; k < n; k++)
    h[k] = bf16_to_f32(t[k]);
  free(t);
}

static inline struct dbuf pair_acts(const float *h, size_t n) {
  struct dbuf b;
  for (int i = 0; i < 2; i++) {
    b.p[i] = pair_alloc1(i, n * pair_esz(i));
    pair_put_act(i, b.p[i], h, n);
  }
  return b;
}

/* n act-dtype elements on both, every byte 0xff (NaN in f32 and bf16), so that an element the
 * op fails to write shows up as NaN in the comparison. */
static inline struct dbuf pair_poisoned(size_t n) {
  struct dbuf b;
  for (int i = 0; i < 2; i++) {
    size_t bytes = n * pair_esz(i);
    void *t = malloc(bytes + 4);
    memset(t, 0xff, bytes + 4);
    b.p[i] = pair_alloc1(i, bytes);
    if (pair_be[i]->ops->upload(pair_be[i], b.p[i], t, bytes))
      pair_die("upload");
    free(t);
  }
  return b;
}

static inline struct dbuf pair_bytes(const void *h, size_t bytes) {
  struct dbuf b;
  for (int i = 0; i < 2; i++) {
    b.p[i] = pair_alloc1(i, bytes);
    if (pair_be[i]->ops->upload(pair_be[i], b.p[i], h, bytes))
      pair_die("upload");
  }
  return b;
}

static inline void pair_free(struct dbuf b) {
  for (int i = 0; i < 2; i++)
    pair_be[i]->ops->free(pair_be[i], b.p[i]);
}

/* Downloads n act elements from both sides: out[0] = cpu, out[1] = cuda (caller frees). */
static inline void pair_get_both(struct dbuf b, size_t n, float **cpu, float **gpu) {
  *cpu = malloc(n * 4 + 4);
  *gpu = malloc(n * 4 + 4);
  pair_get_act(0, *cpu, b.p[0], n);
  pair_get_act(1, *gpu, b.p[1], n);
}

/* Checks rel L2(gpu, cpu) < tol (NaN, e.g. an unwritten element, fails) and prints it. */
static inline void pair_expect(const char *what, const float *gpu, const float *cpu, size_t n, double tol) {
  double e = test_rel_l2(gpu, cpu, n);
  CHECK(e < tol, "%s: rel L2 %.3g >= %.3g", what, e, tol);
  if (e >= tol || getenv("PAGODA_TEST_VERBOSE"))
    printf("  %-48s rel L2 %.3g (tol %.3g)\n", what, e, tol);
}

/* pair_get_both + pair_expect on buffer B's N elements, both downloads freed. */
static inline void pair_check(const char *what, struct dbuf b, size_t n, double tol) {
  float *c, *g;
  pair_get_both(b, n, &c, &g);
  pair_expect(what, g, c, n, tol);
  free(c);
  free(g);
}

#endif
