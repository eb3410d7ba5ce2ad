/* test_tp_allreduce.c - the CUDA backend's tensor-parallel all-reduces op by op on 2 GPUs, each
 * rank on its own thread (tp_group) with its own backend, as under --tp 2 (cuda_allreduce.cu,
 * docs/distributed.md "Peer all-reduce").
 *
 * For each configuration of the peer all-reduce (PAGODA_TP_AR=pull, =push, push with
 * PAGODA_TP_AR_PDL=0; bound 8 MiB, its staging) and for n from 1 to the bound (odd sizes, the
 * push bound of 1 MiB and either side of it, x and resid 16-byte aligned or not):
 *   - all_reduce_add(resid, x, n) answers 0 on both ranks; x holds the sum and resid the sum
 *     added, byte for byte what all_reduce_sum followed by the CUDA rmsnorm's residual add gives
 *     on the same inputs (the sequence blocks.c runs when the op answers 1), and byte for byte the
 *     CPU's rank-order sum (f32 from 0, one bf16 rounding) and add (f32, one bf16 rounding);
 *   - pull, push and NCCL (peer bound 0) give the same bytes for all_reduce_sum (2 ranks: NCCL's
 *     bf16 sum of two values is one rounding too);
 *   - one element past the bound, and with NCCL or PAGODA_TP_AR_ADD=0, all_reduce_add answers 1
 *     on both ranks and leaves x and resid as they were;
 *   - 240 back-to-back calls without a sync (sums and adds, sizes switching between the
 *     variants' ranges, 4 buffers: a stale read of the other parity's buffers shows as a wrong
 *     power of two) against the CPU's replay of the same sequence;
 *   - a sequence of 6 calls inside a CUDA graph (graph_run: run, capture, 4 replays; the record
 *     function must have run exactly twice, so the graph was captured) against the CPU.
 * PAGODA_TP_AR=bogus is refused by peer_ar_connect naming the variable.
 * Inputs are random bf16 in [-4, 4) (no zeros, no denormals), so exact equality is the
 * specification, not luck. Skips (77) without 2 GPUs or without NCCL in the build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dist/tp.h"
#include "test_util.h"
#include "util/dtype.h"
#include "util/log.h"

#define W 2
#define MAX_BYTES ((size_t)8 << 20) /* the peer staging (PEER_AR_STAGE_BYTES): the largest bound */
#define LL_BYTES ((size_t)1 << 20)  /* the push variant's bound (PEER_AR_LL_BYTES) */
#define NMAX (MAX_BYTES / 2)
#define PAD 64 /* elements past NMAX in each buffer: offsets and the one-past-the-bound case */
#define NBUF 4 /* regions of the back-to-back test */
#define SEQ_CALLS 240
#define GRAPH_CALLS 6
#define GRAPH_RUNS 6

struct call {
  int add;     /* all_reduce_add, else all_reduce_sum */
  int buf;     /* region */
  size_t n;
};

struct ctx {
  struct tp_group *g;
  struct backend *bes[W];
  unsigned char id[BACKEND_COMM_ID_BYTES];
  int phase;
  size_t max_bytes; /* peer bound of the next connect */
  /* device: x, resid for all_reduce_add; y, r2 for all_reduce_sum + rmsnorm; o the norm's output */
  void *x[W], *r[W], *y[W], *r2[W], *o[W];
  struct weight w1[W]; /* the 1-element norm weight of rmsnorm(T = n, dim = 1) */
  uint16_t *hx[W], *hr[W], *gx[W], *gr[W], *gy[W], *gr2[W]; /* host: inputs, results */
  size_t n, off;     /* the case: n elements at element offset off */
  size_t span;       /* elements of each buffer moved up and down, and checked */
  int graph_key;
  int answer[W];     /* what all_reduce_add answered on each rank */
  const struct call *calls;
  int n_calls, records;
};

enum { P_CREATE, P_INIT, P_CONNECT, P_UPLOAD, P_ADD, P_SEQ, P_DOWNLOAD, P_CALLS, P_GRAPH, P_FREE };

static void *at(void *base, size_t off) { return (uint16_t *)base + off; }

static int run_calls(struct ctx *c, int r) {
  struct backend *be = c->bes[r];
  for (int i = 0; i < c->n_calls; i++) {
    const struct call *k = &c->calls[i];
    size_t base = (size_t)k->buf * (NMAX / NBUF);
    if (k->add) {
      int rc = be->ops->all_reduce_add(be, at(c->r[r], base), at(c->x[r], base), k->n);
      if (rc != 0)
        return rc < 0 ? -1 : ERR("all_reduce_add of %zu answered %d in the sequence", k->n, rc);
    } else if (be->ops->all_reduce_sum(be, at(c->x[r], base), k->n))
      return -1;
  }
  return 0;
}

static int record_calls(void *p) {
  struct ctx *c = ((void **)p)[0];
  int r = (int)(intptr_t)((void **)p)[1];
  if (r == 0)
    c->records++;
  return run_calls(c, r);
}

static int rank_fn(int r, void *p) {
  struct ctx *c = p;
  struct backend *be = c->bes[r];
  const size_t bytes = c->span * 2;
  switch (c->phase) {
  case P_CREATE: {
    struct backend_params bp = {"cuda", 1, r};
    if (!(c->bes[r] = backend_create(&bp)))
      return -1;
    return c->bes[r]->ops->bind ? c->bes[r]->ops->bind(c->bes[r]) : 0;
  }
  case P_INIT: {
    void **bufs[5] = {&c->x[r], &c->r[r], &c->y[r], &c->r2[r], &c->o[r]};
    for (int i = 0; i < 5; i++)
      if (!(*bufs[i] = be->ops->alloc(be, (NMAX + PAD) * 2)))
        return -1;
    float one = 1.0f;
    if (be->ops->weight_from_host(be, &c->w1[r], &one, DTYPE_F32, 1, 1))
      return -1;
    if (be->ops->comm_init(be, c->id, r, W))
      return -1;
    return be->ops->peer_ar_alloc(be, W);
  }
  case P_CONNECT: return be->ops->peer_ar_connect(be, c->bes, r, W, c->max_bytes);
  case P_UPLOAD:
    return be->ops->upload(be, c->x[r], c->hx[r], bytes) || be->ops->upload(be, c->y[r], c->hx[r], bytes) ||
           be->ops->upload(be, c->r[r], c->hr[r], bytes) || be->ops->upload(be, c->r2[r], c->hr[r], bytes) ||
           be->ops->sync(be);
  case P_ADD:
    c->answer[r] = be->ops->all_reduce_add(be, at(c->r[r], c->off), at(c->x[r], c->off), c->n);
    return c->answer[r] < 0 ? -1 : be->ops->sync(be);
  case P_SEQ: /* what blocks.c runs when all_reduce_add answers 1 */
    if (be->ops->all_reduce_sum(be, at(c->y[r], c->off), c->n))
      return -1;
    if (be->ops->rmsnorm(be, c->o[r], at(c->r2[r], c->off), at(c->y[r], c->off), &c->w1[r], (int)c->n, 1, 1e-5f))
      return -1;
    return be->ops->sync(be);
  case P_DOWNLOAD:
    return be->ops->download(be, c->gx[r], c->x[r], bytes) || be->ops->download(be, c->gr[r], c->r[r], bytes) ||
           be->ops->download(be, c->gy[r], c->y[r], bytes) || be->ops->download(be, c->gr2[r], c->r2[r], bytes) ||
           be->ops->sync(be);
  case P_CALLS: return run_calls(c, r) || be->ops->sync(be);
  case P_GRAPH: {
    void *rc[2] = {c, (void *)(intptr_t)r};
    for (int i = 0; i < GRAPH_RUNS; i++) /* run, capture (and launch), replays */
      if (be->ops->graph_run(be, c->graph_key, record_calls, rc))
        return -1;
    return be->ops->sync(be);
  }
  case P_FREE:
    if (be) {
      void *bufs[5] = {c->x[r], c->r[r], c->y[r], c->r2[r], c->o[r]};
      for (int i = 0; i < 5; i++)
        if (bufs[i])
          be->ops->free(be, bufs[i]);
      if (c->w1[r].data)
        be->ops->weight_free(be, &c->w1[r]);
      be->ops->destroy(be);
    }
    return 0;
  }
  return -1;
}

static int run(struct ctx *c, int phase) {
  c->phase = phase;
  if (tp_group_run(c->g, rank_fn, c)) {
    fprintf(stderr, "test_tp_allreduce: phase %d: %s\n", phase, err_last());
    return -1;
  }
  return 0;
}

static void fill(uint16_t *h, size_t n, uint64_t *st) {
  for (size_t i = 0; i < n; i++) {
    float v = test_randf(st) * 4.0f;
    if (v > -1e-3f && v < 1e-3f)
      v = 0.5f; /* no zeros (the sign of a zero sum is the only thing the orders could disagree on) */
    h[i] = f32_to_bf16(v);
  }
}

/* The CPU's all_reduce_sum of element I over the ranks' X: f32 from 0 in rank order, one bf16
 * rounding; written into every rank's X. With ADD, each rank's R[i] += it as rmsnorm's add. */
static void cpu_reduce(uint16_t *const *x, uint16_t *const *r, size_t i, int add) {
  float s = 0.0f;
  for (int k = 0; k < W; k++)
    s += bf16_to_f32(x[k][i]);
  uint16_t b = f32_to_bf16(s);
  for (int k = 0; k < W; k++) {
    x[k][i] = b;
    if (add)
      r[k][i] = f32_to_bf16(bf16_to_f32(b) + bf16_to_f32(r[k][i]));
  }
}

/* Elements of A and B (N each from OFF) that differ, on any rank. */
static size_t diff(uint16_t *const *a, uint16_t *const *b, size_t off, size_t n) {
  size_t bad = 0;
  for (int k = 0; k < W; k++)
    for (size_t i = off; i < off + n; i++)
      bad += a[k][i] != b[k][i];
  return bad;
}

/* FNV-1a of rank 0's and rank 1's N elements of H from OFF. */
static uint64_t hash_ranks(uint16_t *const *h, size_t off, size_t n) {
  uint64_t v = 1469598103934665603ull;
  for (int k = 0; k < W; k++)
    for (size_t i = off; i < off + n; i++)
      v = (v ^ h[k][i]) * 1099511628211ull;
  return v;
}

/* One case: N elements at element offset OFF, fresh inputs from SEED. EXPECT_ADD: all_reduce_add
 * should take it (answer 0), else decline (1). Returns the hash of all_reduce_sum's results. */
static uint64_t check_case(struct ctx *c, const char *cfg, size_t n, size_t off, uint64_t seed, int expect_add) {
  uint64_t st = seed;
  c->n = n;
  c->off = off;
  c->span = off + n + PAD <= NMAX + PAD ? off + n + PAD : NMAX + PAD;
  const size_t span = c->span;
  for (int k = 0; k < W; k++) {
    fill(c->hx[k], span, &st);
    fill(c->hr[k], span, &st);
  }
  if (run(c, P_UPLOAD) || run(c, P_ADD)) {
    CHECK(0, "%s n %zu: the all-reduce failed", cfg, n);
    return 0;
  }
  CHECK(c->answer[0] == c->answer[1], "%s n %zu: all_reduce_add answered %d on rank 0, %d on rank 1", cfg, n,
        c->answer[0], c->answer[1]);
  CHECK(c->answer[0] == (expect_add ? 0 : 1), "%s n %zu: all_reduce_add answered %d (expected %d)", cfg, n,
        c->answer[0], expect_add ? 0 : 1);
  if (run(c, P_SEQ) || run(c, P_DOWNLOAD)) {
    CHECK(0, "%s n %zu: all_reduce_sum + rmsnorm failed", cfg, n);
    return 0;
  }
  /* the CPU: the sum and add (or, when the op declined, the inputs unchanged) */
  uint16_t *ex[W], *er[W];
  for (int k = 0; k < W; k++) {
    ex[k] = malloc(span * 2);
    er[k] = malloc(span * 2);
    memcpy(ex[k], c->hx[k], span * 2);
    memcpy(er[k], c->hr[k], span * 2);
  }
  for (size_t i = off; i < off + n; i++)
    cpu_reduce(ex, er, i, 1);
  if (c->answer[0] == 0) {
    size_t bx = diff(c->gx, ex, 0, span), br = diff(c->gr, er, 0, span);
    CHECK(bx == 0 && br == 0, "%s n %zu off %zu: all_reduce_add: %zu sums and %zu residuals differ from the CPU's", cfg,
          n, off, bx, br);
    size_t sx = diff(c->gx, c->gy, 0, span), sr = diff(c->gr, c->gr2, 0, span);
    CHECK(sx == 0 && sr == 0,
          "%s n %zu off %zu: all_reduce_add differs from all_reduce_sum + rmsnorm's add in %zu sums, %zu residuals",
          cfg, n, off, sx, sr);
  } else {
    size_t bx = diff(c->gx, c->hx, 0, span), br = diff(c->gr, c->hr, 0, span);
    CHECK(bx == 0 && br == 0, "%s n %zu: all_reduce_add answered 1 but changed %zu x and %zu resid elements", cfg, n,
          bx, br);
  }
  /* all_reduce_sum + the add against the CPU, whichever path took it (peer or NCCL); nothing
   * around the n elements touched */
  size_t by = diff(c->gy, ex, 0, span), br2 = diff(c->gr2, er, 0, span);
  CHECK(by == 0 && br2 == 0, "%s n %zu off %zu: all_reduce_sum: %zu sums and %zu added residuals differ from the CPU's",
        cfg, n, off, by, br2);
  for (int k = 0; k < W; k++) {
    free(ex[k]);
    free(er[k]);
  }
  return hash_ranks(c->gy, off, n);
}

static const size_t sizes[] = {1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 100, 255, 256, 257, 1000, 1023, 4095, 4096,
                               4097, 8191, 12289, 65535, 65536, 131071, LL_BYTES / 2 - 1, LL_BYTES / 2,
                               LL_BYTES / 2 + 1, 1000003, NMAX - 3, NMAX};
#define N_SIZES (sizeof sizes / sizeof sizes[0])
#define N_CASES (2 * N_SIZES)

/* Every size at offsets 0 and 1 (elements: x and resid then only 2-byte aligned; of the large
 * sizes only two unaligned), the same seeds in every configuration; HASHES[case] gets the hash
 * of all_reduce_sum's results (0 for a case not run). Then one element past the bound: declined
 * on both ranks (all_reduce_sum takes NCCL). */
static void check_sizes(struct ctx *c, const char *cfg, int expect_add, uint64_t *hashes) {
  for (size_t s = 0; s < N_SIZES; s++)
    for (size_t off = 0; off < 2; off++) {
      hashes[2 * s + off] = 0;
      if (off && sizes[s] > 65536 && sizes[s] != NMAX - 3 && sizes[s] != LL_BYTES / 2)
        continue;
      hashes[2 * s + off] = check_case(c, cfg, sizes[s], off, 1000 + 17 * s + off, expect_add);
    }
  check_case(c, cfg, NMAX + 1, 0, 99, 0);
  printf("%s: every size from 1 to %zu checked\n", cfg, (size_t)NMAX);
}

/* The CPU's replay of C->calls (NRUNS times) on fresh inputs, then the GPU's result (PHASE:
 * eager calls or a graph) against it. */
static void check_calls(struct ctx *c, const char *cfg, const char *what, int phase, int nruns) {
  uint64_t st = 4242;
  c->span = NMAX + PAD;
  for (int k = 0; k < W; k++) {
    fill(c->hx[k], c->span, &st);
    fill(c->hr[k], c->span, &st);
  }
  c->records = 0;
  if (run(c, P_UPLOAD) || run(c, phase) || run(c, P_DOWNLOAD)) {
    CHECK(0, "%s: %s failed", cfg, what);
    return;
  }
  for (int rep = 0; rep < nruns; rep++)
    for (int i = 0; i < c->n_calls; i++) {
      const struct call *k = &c->calls[i];
      size_t base = (size_t)k->buf * (NMAX / NBUF);
      for (size_t j = base; j < base + k->n; j++)
        cpu_reduce(c->hx, c->hr, j, k->add);
    }
  size_t bx = diff(c->gx, c->hx, 0, c->span), br = diff(c->gr, c->hr, 0, c->span);
  CHECK(bx == 0 && br == 0, "%s: %s: %zu sums and %zu residuals differ from the CPU's replay", cfg, what, bx, br);
  printf("%s: %s: %s\n", cfg, what, bx == 0 && br == 0 ? "equal to the CPU's replay" : "DIFFERENT");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!backend_device_available("cuda"))
    return test_skip("no usable GPU");
  struct backend_params bp = {"cuda", 0, 1};
  struct backend *probe = backend_create(&bp);
  if (!probe) {
    char why[512];
    snprintf(why, sizeof why, "the all-reduce test needs 2 GPUs: %s", err_last());
    return test_skip(why);
  }
  int nccl = probe->ops->all_reduce_sum && probe->ops->all_reduce_add && probe->ops->peer_ar_connect;
  probe->ops->destroy(probe);
  if (!nccl)
    return test_skip("this build's CUDA backend has no NCCL (tensor parallelism off)");
  const char *gr = getenv("PAGODA_CUDA_GRAPHS");
  int graphs = !(gr && !strcmp(gr, "0"));
  unsetenv("PAGODA_TP_AR");
  unsetenv("PAGODA_TP_AR_ADD");
  unsetenv("PAGODA_TP_AR_PDL");

  struct ctx c = {0};
  if (!(c.g = tp_group_create(W)) || run(&c, P_CREATE))
    return test_finish("test_tp_allreduce");
  for (int k = 0; k < W; k++) {
    uint16_t **hs[6] = {&c.hx[k], &c.hr[k], &c.gx[k], &c.gr[k], &c.gy[k], &c.gr2[k]};
    for (int i = 0; i < 6; i++)
      *hs[i] = malloc((NMAX + PAD) * 2);
  }
  if (c.bes[0]->ops->comm_id(c.bes[0], c.id) || run(&c, P_INIT))
    return test_finish("test_tp_allreduce");

  /* the back-to-back sequence: sums and adds, sizes on both sides of the push bound */
  static const size_t seq_n[] = {4096, 1, 65536, 4097, 300000, 8, LL_BYTES / 2, 600001};
  struct call seq[SEQ_CALLS], graph[GRAPH_CALLS];
  for (int i = 0; i < SEQ_CALLS; i++)
    seq[i] = (struct call){.add = i % 3 != 0, .buf = i % NBUF, .n = seq_n[i % 8]};
  static const size_t graph_n[GRAPH_CALLS] = {4096, 1, LL_BYTES / 2, 4097, 600001, 4096};
  for (int i = 0; i < GRAPH_CALLS; i++)
    graph[i] = (struct call){.add = i != 3, .buf = i % NBUF, .n = graph_n[i]};

  static const char *const cfgs[] = {"pull", "push", "push, PAGODA_TP_AR_PDL=0", "NCCL"};
  static uint64_t hashes[4][N_CASES];
  for (int v = 0; v < 4; v++) {
    if (v == 1 || v == 2)
      setenv("PAGODA_TP_AR", "push", 1);
    if (v == 2)
      setenv("PAGODA_TP_AR_PDL", "0", 1);
    c.max_bytes = v == 3 ? 0 : MAX_BYTES;
    int ok = run(&c, P_CONNECT) == 0;
    unsetenv("PAGODA_TP_AR");
    unsetenv("PAGODA_TP_AR_PDL");
    CHECK(ok, "%s: peer_ar_connect failed", cfgs[v]);
    if (!ok)
      continue;
    check_sizes(&c, cfgs[v], v != 3, hashes[v]);
    if (v == 3)
      continue; /* NCCL is never captured, and all_reduce_add declines */
    c.calls = seq;
    c.n_calls = SEQ_CALLS;
    check_calls(&c, cfgs[v], "240 back-to-back all-reduces", P_CALLS, 1);
    if (graphs) {
      c.calls = graph;
      c.n_calls = GRAPH_CALLS;
      c.graph_key = 7001 + v; /* a graph per configuration: each captures its own kernels */
      char what[96];
      snprintf(what, sizeof what, "%d all-reduces in a CUDA graph, run %d times", GRAPH_CALLS, GRAPH_RUNS);
      check_calls(&c, cfgs[v], what, P_GRAPH, GRAPH_RUNS);
      CHECK(c.records == 2, "%s: the graph's record function ran %d times (2: run, capture; more: not captured)",
            cfgs[v], c.records);
    }
  }
  if (!graphs)
    printf("PAGODA_CUDA_GRAPHS=0: the CUDA-graph part is not run\n");
  for (int v = 1; v < 4; v++) {
    int same = !memcmp(hashes[v], hashes[0], sizeof hashes[0]);
    CHECK(same, "all_reduce_sum: %s differs from pull", cfgs[v]);
    printf("all_reduce_sum, every size: %s %s pull\n", cfgs[v], same ? "byte-equal to" : "DIFFERS from");
  }

  /* PAGODA_TP_AR_ADD=0: all_reduce_add declines on both ranks, untouched */
  setenv("PAGODA_TP_AR_ADD", "0", 1);
  c.max_bytes = MAX_BYTES;
  int ok = run(&c, P_CONNECT) == 0;
  unsetenv("PAGODA_TP_AR_ADD");
  CHECK(ok, "PAGODA_TP_AR_ADD=0: peer_ar_connect failed");
  if (ok)
    for (size_t n = 1; n <= 4096; n *= 64)
      check_case(&c, "PAGODA_TP_AR_ADD=0", n, 0, 7 + n, 0);
  /* a bad variant name is refused, naming the variable */
  setenv("PAGODA_TP_AR", "bogus", 1);
  c.phase = P_CONNECT;
  int rc = tp_group_run(c.g, rank_fn, &c);
  CHECK(rc < 0 && strstr(err_last(), "PAGODA_TP_AR=bogus"), "PAGODA_TP_AR=bogus: connect gave %d (%s)", rc,
        err_last());
  unsetenv("PAGODA_TP_AR");

  run(&c, P_FREE);
  tp_group_destroy(c.g);
  for (int k = 0; k < W; k++) {
    free(c.hx[k]);
    free(c.hr[k]);
    free(c.gx[k]);
    free(c.gr[k]);
    free(c.gy[k]);
    free(c.gr2[k]);
  }
  return test_finish("test_tp_allreduce");
}
