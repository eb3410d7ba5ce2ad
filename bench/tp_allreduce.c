/* tp_allreduce.c - the all-reduce of single-process tensor parallelism on the CUDA backend: the
 * peer all-reduce (cuda_allreduce.cu) against NCCL, bf16, 8 KiB .. 8 MiB, over the GPUs of this
 * machine (2 unless given), each rank on its own thread as under --tp N.
 *
 * For each size: every rank's input is random bf16, and the result of each path is compared with
 * the CPU's rank-order sum (f32, one bf16 rounding): the peer all-reduce must match it bit for bit
 * on every rank (exit 1 otherwise); NCCL's mismatches are counted (for 2 ranks it rounds the
 * same way). Then the time per all-reduce, two ways: eager (ITERS calls back to back, then a
 * sync: what a step without CUDA graphs pays, launch included) and, for the peer all-reduce, in
 * a CUDA graph of 32 all-reduces replayed (what a graph step pays; NCCL is never captured).
 *
 * Usage: tp_allreduce [world 2] [iters 200]   (NCCL_NVLS_ENABLE=0 on the lent machines) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "backend/backend.h"
#include "dist/tp.h"
#include "util/dtype.h"
#include "util/log.h"

#define MAX_BYTES (8u << 20)
#define GRAPH_ARS 32

struct ctx {
  int world, phase, iters;
  struct backend *bes[TP_MAX_WORLD];
  unsigned char id[BACKEND_COMM_ID_BYTES];
  void *x[TP_MAX_WORLD];
  uint16_t *host[TP_MAX_WORLD]; /* inputs, then results */
  size_t n, max_bytes;
};

enum { P_CREATE, P_INIT, P_CONNECT, P_UPLOAD, P_ONE, P_DOWNLOAD, P_EAGER, P_GRAPH, P_FREE };

static int record_ars(void *p) {
  struct ctx *c = ((void **)p)[0];
  int r = (int)(intptr_t)((void **)p)[1];
  for (int i = 0; i < GRAPH_ARS; i++)
    if (c->bes[r]->ops->all_reduce_sum(c->bes[r], c->x[r], c->n))
      return -1;
  return 0;
}

static int rank_fn(int r, void *p) {
  struct ctx *c = p;
  struct backend *be = c->bes[r];
  switch (c->phase) {
  case P_CREATE: {
    struct backend_params bp = {"cuda", 1, r};
    if (!(c->bes[r] = backend_create(&bp)))
      return -1;
    /* waits for the kernel preloading, which slows what runs beside it (as bench/cuda_attention.c) */
    if (c->bes[r]->ops->reserve && c->bes[r]->ops->reserve(c->bes[r], 1, 1, 1))
      return -1;
    return c->bes[r]->ops->bind ? c->bes[r]->ops->bind(c->bes[r]) : 0;
  }
  case P_INIT:
    if (!(c->x[r] = be->ops->alloc(be, MAX_BYTES)))
      return -1;
    if (be->ops->comm_init(be, c->id, r, c->world))
      return -1;
    return be->ops->peer_ar_alloc(be, c->world);
  case P_CONNECT: return be->ops->peer_ar_connect(be, c->bes, r, c->world, c->max_bytes);
  case P_UPLOAD: return be->ops->upload(be, c->x[r], c->host[r], c->n * 2) || be->ops->sync(be);
  case P_ONE: return be->ops->all_reduce_sum(be, c->x[r], c->n) || be->ops->sync(be);
  case P_DOWNLOAD: return be->ops->download(be, c->host[r], c->x[r], c->n * 2) || be->ops->sync(be);
  case P_EAGER:
    for (int i = 0; i < c->iters; i++)
      if (be->ops->all_reduce_sum(be, c->x[r], c->n))
        return -1;
    return be->ops->sync(be);
  case P_GRAPH: {
    void *rc[2] = {c, (void *)(intptr_t)r};
    int key = 1000 + (int)(c->n / 4096) + (c->max_bytes ? 0 : 100000);
    for (int i = 0; i < 2 + c->iters / GRAPH_ARS; i++) /* run, capture, replays */
      if (be->ops->graph_run(be, key, record_ars, rc))
        return -1;
    return be->ops->sync(be);
  }
  case P_FREE:
    if (be) {
      be->ops->free(be, c->x[r]);
      be->ops->destroy(be);
    }
    return 0;
  }
  return -1;
}

static int run(struct tp_group *g, struct ctx *c, int phase) {
  c->phase = phase;
  if (tp_group_run(g, rank_fn, c)) {
    fprintf(stderr, "tp_allreduce: phase %d: %s\n", phase, err_last());
    return -1;
  }
  return 0;
}

/* Uploads fresh inputs, runs one all-reduce, checks every rank against the rank-order sum;
 * returns the number of mismatching elements, or -1. */
static long check(struct tp_group *g, struct ctx *c, unsigned seed) {
  uint16_t *in = malloc(c->n * 2 * (size_t)c->world);
  for (int r = 0; r < c->world; r++)
    for (size_t i = 0; i < c->n; i++) {
      seed = seed * 1664525u + 1013904223u;
      float v = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 8.0f;
      in[(size_t)r * c->n + i] = c->host[r][i] = f32_to_bf16(v);
    }
  long bad = -1;
  if (run(g, c, P_UPLOAD) == 0 && run(g, c, P_ONE) == 0 && run(g, c, P_DOWNLOAD) == 0) {
    bad = 0;
    for (size_t i = 0; i < c->n; i++) {
      float s = 0;
      for (int r = 0; r < c->world; r++)
        s += bf16_to_f32(in[(size_t)r * c->n + i]);
      uint16_t want = f32_to_bf16(s);
      for (int r = 0; r < c->world; r++)
        bad += c->host[r][i] != want;
    }
  }
  free(in);
  return bad;
}

int main(int argc, char **argv) {
  struct ctx c = {.world = argc > 1 ? atoi(argv[1]) : 2, .iters = argc > 2 ? atoi(argv[2]) : 200};
  if (!backend_device_available("cuda")) {
    printf("tp_allreduce: no usable GPU\n");
    return 77;
  }
  struct tp_group *g = tp_group_create(c.world);
  if (!g || run(g, &c, P_CREATE))
    return 1;
  const struct backend_ops *op = c.bes[0]->ops;
  if (!op->comm_id || !op->peer_ar_alloc) {
    printf("tp_allreduce: this build has no NCCL / peer all-reduce\n");
    return 77;
  }
  for (int r = 0; r < c.world; r++)
    c.host[r] = malloc(MAX_BYTES);
  if (op->comm_id(c.bes[0], c.id) || run(g, &c, P_INIT))
    return 1;
  printf("| bytes | peer eager us | NCCL eager us | peer in a graph us | peer mismatches | NCCL mismatches |\n");
  printf("|---:|---:|---:|---:|---:|---:|\n");
  int fail = 0;
  for (size_t bytes = 8192; bytes <= MAX_BYTES; bytes *= 2) {
    c.n = bytes / 2;
    double us[4];
    long bad[2];
    for (int k = 0; k < 2; k++) { /* k 0: peer, 1: NCCL */
      c.max_bytes = k == 0 ? MAX_BYTES : 0;
      if (run(g, &c, P_CONNECT))
        return 1;
      bad[k] = check(g, &c, 12345u + (unsigned)bytes);
      double t0 = bench_now();
      if (run(g, &c, P_EAGER))
        return 1;
      us[k] = (bench_now() - t0) * 1e6 / c.iters;
      us[2 + k] = -1;
      if (k == 1) /* NCCL is never captured (cuda_nccl.cu) */
        continue;
      if (run(g, &c, P_GRAPH)) /* warm-up and capture outside the timing */
        return 1;
      t0 = bench_now();
      if (run(g, &c, P_GRAPH))
        return 1;
      us[2 + k] = (bench_now() - t0) * 1e6 / (GRAPH_ARS * (c.iters / GRAPH_ARS + 2));
    }
    if (bad[0] != 0)
      fail = 1;
    printf("| %zu | %.2f | %.2f | %.2f | %ld | %ld |\n", bytes, us[0], us[1], us[2], bad[0], bad[1]);
    fflush(stdout);
  }
  run(g, &c, P_FREE);
  tp_group_destroy(g);
  if (fail)
    printf("tp_allreduce: the peer all-reduce does not equal the rank-order sum\n");
  return fail;
}
