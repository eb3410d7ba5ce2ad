/* test_gather_cols.c - the CPU backend's gather_cols (the vocabulary-parallel output head's
 * collective, backend.h): rank 0's out(rows, world * cols) holds rank r's in(rows, cols) in
 * columns [r * cols, (r + 1) * cols), bitwise, for 2 and 3 ranks and several shapes in a row
 * (including one row, one column and zero rows);
 * - in one process (ranks are threads, cpu_comm.c's group): the ranks' OUT is NULL on ranks > 0;
 * - across processes joined by the rendezvous on loopback (cpu_comm_attach_rdv), where the op
 *   all-reduces each rank's columns written into zeros: the same bits on rank 0.
 * Values span many binades and are never zero, so any change (a wrong column block, a sum with
 * a nonzero) shows. Also: a worker killed before the call makes rank 0's gather fail naming it. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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
#define CALLS 4
static const int shape_rows[CALLS] = {3, 1, 0, 17}, shape_cols[CALLS] = {5, 64, 4, 1};


/* Rank R's element (t, j) in call C: nonzero, magnitudes over many binades. */
static float value(int rank, int call, int t, int j) {
  uint32_t h = (uint32_t)(t * 2654435761u) ^ (uint32_t)(j * 40503 + rank * 7919 + call * 104729 + 1);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  float mant = 0.5f + (float)(h & 0xffff) / 131072.0f;
  return ldexpf(h & 0x10000 ? -mant : mant, (int)(h >> 27) - 12);
}

static float *input(int rank, int call) {
  int R = shape_rows[call], C = shape_cols[call];
  float *x = malloc(sizeof(float) * (size_t)(R ? R * C : 1));
  for (int t = 0; t < R; t++)
    for (int j = 0; j < C; j++)
      x[t * C + j] = value(rank, call, t, j);
  return x;
}

/* 0 when OUT is the expected gather of WORLD ranks for CALL. */
static int check_out(const float *out, int world, int call) {
  int R = shape_rows[call], C = shape_cols[call];
  for (int t = 0; t < R; t++)
    for (int r = 0; r < world; r++)
      for (int j = 0; j < C; j++) {
        float want = value(r, call, t, j);
        if (memcmp(&out[(size_t)t * world * C + (size_t)r * C + j], &want, sizeof want))
          return -1;
      }
  return 0;
}

/* ---- in one process ---- */
struct inproc {
  struct backend *bes[MAXW];
  unsigned char id[BACKEND_COMM_ID_BYTES];
  int world, call;
  float *out;
};

static int inproc_init(int r, void *p) {
  struct inproc *q = p;
  return q->bes[r]->ops->comm_init(q->bes[r], q->id, r, q->world);
}

static int inproc_gather(int r, void *p) {
  struct inproc *q = p;
  int R = shape_rows[q->call], C = shape_cols[q->call];
  float *in = input(r, q->call), *scratch = malloc(sizeof(float) * (size_t)(R * C * q->world + 1));
  int rc = q->bes[r]->ops->gather_cols(q->bes[r], r == 0 ? q->out : NULL, in, scratch, R, C);
  free(in);
  free(scratch);
  return rc;
}

static void test_inprocess(int world) {
  struct inproc q = {.world = world};
  struct tp_group *g = tp_group_create(world);
  if (!g) {
    CHECK(0, "tp_group_create: %s", err_last());
    return;
  }
  int rc = 0;
  for (int r = 0; r < world && !rc; r++)
    rc = (q.bes[r] = backend_cpu_create(1)) ? 0 : -1;
  if (!rc)
    rc = q.bes[0]->ops->comm_id(q.bes[0], q.id) || tp_group_run(g, inproc_init, &q);
  CHECK(!rc, "world %d: setup: %s", world, err_last());
  for (int c = 0; c < CALLS && !rc; c++) {
    size_t n = (size_t)shape_rows[c] * shape_cols[c] * world;
    q.call = c;
    q.out = malloc(sizeof(float) * (n + 1));
    rc = tp_group_run(g, inproc_gather, &q);
    CHECK(!rc, "world %d call %d: %s", world, c, err_last());
    CHECK(rc || check_out(q.out, world, c) == 0, "world %d call %d (%d x %d): wrong gather", world, c,
          shape_rows[c], shape_cols[c]);
    free(q.out);
  }
  for (int r = 0; r < world; r++)
    if (q.bes[r])
      q.bes[r]->ops->destroy(q.bes[r]);
  tp_group_destroy(g);
}

/* ---- across processes ---- */
static int proc_gather(struct backend *be, int rank, int world, void *ctx) {
  (void)ctx;
  int bad = 0;
  for (int c = 0; c < CALLS && !bad; c++) {
    size_t n = (size_t)shape_rows[c] * shape_cols[c] * world;
    float *in = input(rank, c), *out = rank == 0 ? malloc(sizeof(float) * (n + 1)) : NULL,
          *scratch = malloc(sizeof(float) * (n + 1));
    if (be->ops->gather_cols(be, out, in, scratch, shape_rows[c], shape_cols[c])) {
      fprintf(stderr, "rank %d call %d: %s\n", rank, c, err_last());
      bad = 3;
    } else if (rank == 0 && check_out(out, world, c)) {
      fprintf(stderr, "world %d call %d: rank 0's gather is wrong\n", world, c);
      bad = 4;
    }
    free(in);
    free(out);
    free(scratch);
  }
  return bad;
}

/* Rank 1 dies after joining: rank 0's gather fails naming rank 1 instead of waiting. */
static void test_lost_rank(void) {
  struct lost_rank l;
  if (lost_rank_start(&l, 7))
    return;
  float in[4] = {1, 2, 3, 4}, out[8], scratch[8];
  CHECK(l.be && l.be->ops->gather_cols(l.be, out, in, scratch, 2, 2) == -1 && strstr(err_last(), "rank 1"),
        "gather after a lost rank: %s", err_last());
  lost_rank_free(&l);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LOG_LEVEL_ERROR);
  test_inprocess(2);
  test_inprocess(3);
  rdv_procs_run(2, 7, proc_gather, NULL, "gather_cols across processes");
  rdv_procs_run(3, 7, proc_gather, NULL, "gather_cols across processes");
  test_lost_rank();
  return test_finish("test_gather_cols");
}
