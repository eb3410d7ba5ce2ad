/* test_tp_cpu_procs.c - the CPU backend's all_reduce_sum in multi-process mode
 * (cpu_comm_attach_rdv): 2 and 3 processes joined by the rendezvous on loopback get, through
 * be->ops->all_reduce_sum, bitwise the result of the in-process group (the same backends' ops on
 * rank threads, tests/c/test_tp_cpu.c's mode), for several calls of different sizes; after a
 * peer is killed the surviving rank's all_reduce_sum fails naming the lost rank, and comm_abort
 * shuts the group's sockets. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "dist/rendezvous.h"
#include "dist/tp.h"
#include "rdv_procs.h"
#include "test_util.h"
#include "util/log.h"

#define MAXW 3
#define CALLS 3
static const size_t sizes[CALLS] = {1, 4097, 50000};

static void fill(float *x, size_t n, int rank, int call) {
  uint32_t s = (uint32_t)(rank * 7919 + call * 104729 + 17);
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = ldexpf((float)(s >> 8) / 16777216.0f - 0.5f, (int)(s >> 28) - 8);
  }
}

/* The in-process reference: W CPU backends on rank threads. want[call] = the summed tensor. */
struct inproc {
  struct backend *bes[MAXW];
  unsigned char id[BACKEND_COMM_ID_BYTES];
  int world;
  float *x[MAXW];
  size_t n;
  int call;
};

static int inproc_init(int r, void *p) {
  struct inproc *q = p;
  return q->bes[r]->ops->comm_init(q->bes[r], q->id, r, q->world);
}

static int inproc_reduce(int r, void *p) {
  struct inproc *q = p;
  fill(q->x[r], q->n, r, q->call);
  return q->bes[r]->ops->all_reduce_sum(q->bes[r], q->x[r], q->n);
}

static int reference(int world, float *want[CALLS]) {
  struct inproc q = {.world = world};
  struct tp_group *g = tp_group_create(world);
  int rc = g ? 0 : -1;
  for (int r = 0; r < world && !rc; r++)
    rc = (q.bes[r] = backend_cpu_create(1)) ? 0 : -1;
  if (!rc)
    rc = q.bes[0]->ops->comm_id(q.bes[0], q.id) || tp_group_run(g, inproc_init, &q);
  for (int c = 0; c < CALLS && !rc; c++) {
    q.n = sizes[c];
    q.call = c;
    for (int r = 0; r < world; r++)
      q.x[r] = malloc(sizeof(float) * q.n);
    rc = tp_group_run(g, inproc_reduce, &q);
    want[c] = q.x[0];
    for (int r = 1; r < world; r++) {
      if (memcmp(q.x[r], q.x[0], sizeof(float) * q.n))
        rc = -1;
      free(q.x[r]);
    }
  }
  for (int r = 0; r < world; r++)
    if (q.bes[r])
      q.bes[r]->ops->destroy(q.bes[r]);
  tp_group_destroy(g);
  return rc;
}

/* One process of the multi-process group: 0 when every call matches the in-process sums (CTX). */
static int proc_reduce(struct backend *be, int rank, int world, void *ctx) {
  float **want = ctx;
  (void)world;
  int bad = 0;
  for (int c = 0; c < CALLS && !bad; c++) {
    float *x = malloc(sizeof(float) * sizes[c]);
    fill(x, sizes[c], rank, c);
    if (be->ops->all_reduce_sum(be, x, sizes[c])) {
      fprintf(stderr, "rank %d: %s\n", rank, err_last());
      bad = 3;
    } else if (memcmp(x, want[c], sizeof(float) * sizes[c])) {
      fprintf(stderr, "rank %d call %d: differs from the in-process all-reduce\n", rank, c);
      bad = 4;
    }
    free(x);
  }
  return bad;
}

static void test_matches_inprocess(int world) {
  float *want[CALLS] = {0};
  if (reference(world, want)) {
    CHECK(0, "in-process reference, world %d: %s", world, err_last());
    return;
  }
  rdv_procs_run(world, 99, proc_reduce, want, "all_reduce_sum across processes");
  for (int c = 0; c < CALLS; c++)
    free(want[c]);
}

/* Rank 1 is killed: rank 0's all_reduce_sum fails naming rank 1. */
static void test_lost_rank(void) {
  struct lost_rank l;
  if (lost_rank_start(&l, 99))
    return;
  float x[16] = {0};
  CHECK(l.be && l.be->ops->all_reduce_sum(l.be, x, 16) == -1 && strstr(err_last(), "rank 1"), "after a lost rank: %s",
        err_last());
  if (l.be)
    l.be->ops->comm_abort(l.be);
  CHECK(rdv_dead_peer(l.r, 0) == 1, "aborted group still looks alive");
  lost_rank_free(&l);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LOG_LEVEL_ERROR);
  test_matches_inprocess(2);
  test_matches_inprocess(3);
  test_lost_rank();
  return test_finish("test_tp_cpu_procs");
}
