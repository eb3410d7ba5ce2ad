/* lost_rank.h - the start of the lost-rank tests of the cross-process CPU collectives: rank 0 of
 * a 2-rank loopback group whose rank 1 (a forked child) is SIGKILLed right after it joins, as a
 * CPU backend attached to that group (cpu_comm_attach_rdv). Every collective rank 0 then calls
 * must fail naming rank 1. */
#ifndef PAGODA_TEST_LOST_RANK_H
#define PAGODA_TEST_LOST_RANK_H

#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "dist/rendezvous.h"
#include "test_util.h"
#include "util/log.h"

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
