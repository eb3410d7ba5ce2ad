/* rdv_procs.h - the process groups of the cross-process CPU collective tests (test_gather_cols,
 * test_tp_cpu_procs): ranks are this process (rank 0) and forked children, joined by the
 * rendezvous on loopback, each with a CPU backend attached to the group (cpu_comm_attach_rdv).
 *  - rdv_procs_run: every rank runs the same body; each must return 0;
 *  - lost_rank_start / lost_rank_free: a 2-rank group whose rank 1 is SIGKILLed right after it
 *    joins; every collective rank 0 then calls must fail naming rank 1. */
#ifndef PAGODA_TEST_RDV_PROCS_H
#define PAGODA_TEST_RDV_PROCS_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "dist/rendezvous.h"
#include "test_util.h"
#include "util/log.h"

#define RDV_PROCS_MAX 8

/* One rank's body: BE is its CPU backend on the group. 0 when every check passed, else a nonzero
 * exit status (with the reason printed on stderr). */
typedef int (*rdv_rank_fn)(struct backend *be, int rank, int world, void *ctx);

static int rdv_rank_main(const char *master, int rank, int world, uint64_t hash, rdv_rank_fn fn, void *ctx) {
  unsigned char p[4] = {0};
  struct rdv *r;
  if (rdv_join(master, rank, world, hash, p, sizeof p, 10, &r)) {
    fprintf(stderr, "rank %d: join: %s\n", rank, err_last());
    return 1;
  }
  struct backend *be = backend_cpu_create(1);
  int rc = !be || cpu_comm_attach_rdv(be, r) ? 2 : fn(be, rank, world, ctx);
  if (be)
    be->ops->destroy(be);
  rdv_close(r);
  return rc;
}

/* Runs FN as every rank of a WORLD-process group (config hash HASH): rank 0 here, the others in
 * forked children (which inherit CTX); CHECKs that every rank returned 0, naming WHAT. */
static void rdv_procs_run(int world, uint64_t hash, rdv_rank_fn fn, void *ctx, const char *what) {
  char master[64];
  test_loopback_address(master, sizeof master);
  pid_t pids[RDV_PROCS_MAX];
  for (int k = 1; k < world && k < RDV_PROCS_MAX; k++)
    if ((pids[k] = fork()) == 0)
      _exit(rdv_rank_main(master, k, world, hash, fn, ctx));
  CHECK(rdv_rank_main(master, 0, world, hash, fn, ctx) == 0, "%s, world %d: rank 0 failed", what, world);
  for (int k = 1; k < world && k < RDV_PROCS_MAX; k++) {
    int st = 0;
    waitpid(pids[k], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s, world %d: rank %d exit %d", what, world, k,
          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
}

struct lost_rank {
  struct backend *be; /* rank 0's CPU backend on the group, or NULL */
  struct rdv *r;
  pid_t pid; /* rank 1 */
};

/* 0 with L set up; -1 after a failed CHECK (nothing to free). HASH: the group's config hash. */
static int lost_rank_start(struct lost_rank *l, uint64_t hash) {
  char master[64];
  test_loopback_address(master, sizeof master);
  l->be = NULL;
  l->pid = fork();
  if (l->pid == 0) {
    unsigned char p[4];
    struct rdv *r;
    if (rdv_join(master, 1, 2, hash, p, sizeof p, 10, &r))
      _exit(1);
    raise(SIGKILL);
  }
  unsigned char p[4] = {0};
  if (rdv_join(master, 0, 2, hash, p, sizeof p, 10, &l->r)) {
    CHECK(0, "join: %s", err_last());
    waitpid(l->pid, NULL, 0);
    return -1;
  }
  l->be = backend_cpu_create(1);
  CHECK(l->be && cpu_comm_attach_rdv(l->be, l->r) == 0, "attach: %s", err_last());
  return 0;
}

static void lost_rank_free(struct lost_rank *l) {
  if (l->be)
    l->be->ops->destroy(l->be);
  rdv_close(l->r);
  waitpid(l->pid, NULL, 0);
}

#endif
