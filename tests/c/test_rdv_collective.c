/* test_rdv_collective.c - the cross-process transport of multi-process TP on the CPU backend and
 * its watchdog (src/dist/rendezvous.h, src/dist/watchdog.h), with real processes on loopback:
 * rdv_all_reduce_sum over 2 and 3 processes gives every rank bitwise the rank-order sum that the
 * in-process cpu_all_reduce_sum computes (x0 + x1 + ... element by element), for a tensor larger
 * than one transfer chunk and for several calls in a row; rdv_broadcast hands rank 0's bytes to
 * every rank; killing a worker mid-run makes rank 0's watchdog report that rank (once, through
 * on_lost) and rank 0's blocked all-reduce fail naming it within seconds, and a worker's watchdog
 * reports a lost rank 0 the same way. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/rendezvous.h"
#include "dist/watchdog.h"
#include "test_util.h"
#include "util/log.h"

#define HASH 0x77aa55cc00112233ull
#define N_FLOATS 40000 /* > one 16384-float chunk, not a multiple of it */
#define ROUNDS 3

static char master[64];

static void pick_master(void) { test_loopback_address(master, sizeof master); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank R's contribution in round K: magnitudes spread over many binades, so that another
 * summation order would change low bits. */
static float value(int rank, int round, size_t i) {
  uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503 + round * 7919 + 1);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  float mant = (float)(h & 0xffff) / 65536.0f - 0.5f;
  return ldexpf(mant, (int)(h >> 27) - 12);
}

static void fill(float *x, int rank, int round) {
  for (size_t i = 0; i < N_FLOATS; i++)
    x[i] = value(rank, round, i);
}

/* The in-process reference (cpu_comm.c): s = x0; s += x1; ... */
static void reference(float *want, int world, int round) {
  for (size_t i = 0; i < N_FLOATS; i++) {
    float s = value(0, round, i);
    for (int k = 1; k < world; k++)
      s += value(k, round, i);
    want[i] = s;
  }
}

/* One rank of the collective test: join, ROUNDS of (broadcast + all-reduce), check each. 0 ok. */
static int run_rank(int rank, int world) {
  unsigned char payload[16] = {0};
  if (rank == 0)
    memcpy(payload, "comm-id-bytes!!", 16);
  struct rdv *r;
  if (rdv_join(master, rank, world, HASH, payload, sizeof payload, 10, &r)) {
    fprintf(stderr, "rank %d join: %s\n", rank, err_last());
    return 1;
  }
  int bad = memcmp(payload, "comm-id-bytes!!", 16) != 0 ? 2 : 0;
  float *x = malloc(sizeof(float) * N_FLOATS), *want = malloc(sizeof(float) * N_FLOATS);
  for (int round = 0; round < ROUNDS && !bad; round++) {
    int batch[4] = {0};
    if (rank == 0)
      for (int i = 0; i < 4; i++)
        batch[i] = 100 * round + i;
    if (rdv_broadcast(r, batch, sizeof batch, 10)) {
      fprintf(stderr, "rank %d broadcast: %s\n", rank, err_last());
      bad = 3;
      break;
    }
    for (int i = 0; i < 4; i++)
      if (batch[i] != 100 * round + i)
        bad = 4;
    fill(x, rank, round);
    if (rdv_all_reduce_sum(r, x, N_FLOATS, 10)) {
      fprintf(stderr, "rank %d all-reduce: %s\n", rank, err_last());
      bad = 5;
      break;
    }
    reference(want, world, round);
    if (memcmp(x, want, sizeof(float) * N_FLOATS) != 0) {
      fprintf(stderr, "rank %d round %d: all-reduce differs from the rank-order sum\n", rank, round);
      bad = 6;
    }
  }
  free(x);
  free(want);
  rdv_close(r);
  return bad;
}

static void test_all_reduce(int world) {
  pick_master();
  pid_t pids[8];
  for (int k = 1; k < world; k++) {
    pids[k] = fork();
    if (pids[k] == 0)
      _exit(run_rank(k, world));
  }
  CHECK(run_rank(0, world) == 0, "world %d: rank 0 failed", world);
  for (int k = 1; k < world; k++) {
    int st = 0;
    waitpid(pids[k], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "world %d: rank %d exit status %d", world, k,
          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  /* The sum must depend on order for this data (else the bitwise check above proves little). */
  int order_matters = 0;
  for (size_t i = 0; i < N_FLOATS && !order_matters && world == 3; i++) {
    float a = value(0, 0, i) + value(1, 0, i) + value(2, 0, i);
    float b = value(2, 0, i) + value(1, 0, i) + value(0, 0, i);
    order_matters = a != b;
  }
  CHECK(world != 3 || order_matters, "test data does not distinguish summation orders");
}

static atomic_int lost_calls, lost_rank_seen;

static void on_lost(int rank, void *user) {
  (void)user;
  atomic_fetch_add(&lost_calls, 1);
  atomic_store(&lost_rank_seen, rank);
}

/* Rank 0 with a watchdog; worker 2 of 3 dies after one good round; rank 0's next all-reduce is
 * blocked on it and must fail naming rank 2 within a few seconds. */
static void test_lost_worker(void) {
  pick_master();
  pid_t pids[3];
  for (int k = 1; k < 3; k++) {
    pids[k] = fork();
    if (pids[k] == 0) {
      unsigned char p[8];
      struct rdv *r;
      if (rdv_join(master, k, 3, HASH, p, sizeof p, 10, &r))
        _exit(1);
      float x[64];
      for (int i = 0; i < 64; i++)
        x[i] = (float)k;
      if (rdv_all_reduce_sum(r, x, 64, 10))
        _exit(2);
      if (k == 2)
        raise(SIGKILL); /* mid-run, without closing anything itself */
      rdv_all_reduce_sum(r, x, 64, 10); /* rank 1 then waits; it fails when rank 0 aborts */
      rdv_close(r);
      _exit(0);
    }
  }
  unsigned char p[8] = "abcdefg";
  struct rdv *r;
  int rc = rdv_join(master, 0, 3, HASH, p, sizeof p, 10, &r);
  if (!(rc == 0)) {
    CHECK(0, "rank 0 join: %s", err_last());
    return;
  }
  atomic_store(&lost_calls, 0);
  atomic_store(&lost_rank_seen, -1);
  struct watchdog *w = watchdog_start(r, 50, NULL, on_lost, NULL);
  if (!(w != NULL)) {
    CHECK(0, "watchdog_start: %s", err_last());
    return;
  }
  float x[64];
  for (int i = 0; i < 64; i++)
    x[i] = 0;
  CHECK(rdv_all_reduce_sum(r, x, 64, 10) == 0 && x[0] == 3.0f, "first round: %s", err_last());
  double t0 = now_s();
  rc = rdv_all_reduce_sum(r, x, 64, 60); /* the timeout must not be what ends it */
  double took = now_s() - t0;
  CHECK(rc == -1, "all-reduce succeeded although rank 2 was killed");
  CHECK(strstr(err_last(), "rank 2") != NULL, "error does not name rank 2: %s", err_last());
  CHECK(took < 5, "lost rank noticed only after %.1f s", took);
  for (int i = 0; i < 100 && watchdog_lost_rank(w) == -1; i++) {
    struct timespec ts = {0, 20000000L};
    nanosleep(&ts, NULL);
  }
  CHECK(watchdog_lost_rank(w) == 2, "watchdog reports rank %d, not 2", watchdog_lost_rank(w));
  CHECK(strstr(watchdog_message(w), "tensor-parallel rank 2 lost") != NULL, "watchdog message: %s",
        watchdog_message(w));
  CHECK(atomic_load(&lost_calls) == 1 && atomic_load(&lost_rank_seen) == 2, "on_lost called %d times (rank %d)",
        atomic_load(&lost_calls), atomic_load(&lost_rank_seen));
  watchdog_stop(w);
  rdv_close(r);
  for (int k = 1; k < 3; k++) {
    int st = 0;
    waitpid(pids[k], &st, 0);
    if (k == 2)
      CHECK(WIFSIGNALED(st), "rank 2 was not killed");
    else
      CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 did not get past the aborted group: %d",
            WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
}

/* A worker whose rank 0 dies: its watchdog reports rank 0 and its blocked broadcast fails. */
static void test_lost_master(void) {
  pick_master();
  pid_t pid = fork();
  if (pid == 0) {
    unsigned char p[8] = "abcdefg";
    struct rdv *r;
    if (rdv_join(master, 0, 2, HASH, p, sizeof p, 10, &r))
      _exit(1);
    struct timespec ts = {0, 200000000L};
    nanosleep(&ts, NULL);
    raise(SIGKILL);
  }
  unsigned char p[8];
  struct rdv *r;
  int rc = rdv_join(master, 1, 2, HASH, p, sizeof p, 10, &r);
  if (!(rc == 0)) {
    CHECK(0, "rank 1 join: %s", err_last());
    return;
  }
  atomic_store(&lost_calls, 0);
  struct watchdog *w = watchdog_start(r, 50, NULL, on_lost, NULL);
  if (!(w != NULL)) {
    CHECK(0, "watchdog_start: %s", err_last());
    return;
  }
  int batch[4];
  double t0 = now_s();
  rc = rdv_broadcast(r, batch, sizeof batch, 60);
  CHECK(rc == -1 && strstr(err_last(), "rank 0"), "worker broadcast: rc %d: %s", rc, err_last());
  CHECK(now_s() - t0 < 5, "lost rank 0 noticed only after %.1f s", now_s() - t0);
  for (int i = 0; i < 100 && watchdog_lost_rank(w) == -1; i++) {
    struct timespec ts = {0, 20000000L};
    nanosleep(&ts, NULL);
  }
  CHECK(watchdog_lost_rank(w) == 0, "worker's watchdog reports rank %d, not 0", watchdog_lost_rank(w));
  CHECK(atomic_load(&lost_calls) == 1, "on_lost called %d times", atomic_load(&lost_calls));
  watchdog_stop(w);
  rdv_close(r);
  int st;
  waitpid(pid, &st, 0);
}

/* A failing comm_check is reported as -2 with its message, and aborts the group. */
static int failing_check(void *user) {
  (void)user;
  return ERR("nccl: remote process exited");
}

static void test_comm_check(void) {
  struct rdv *r;
  unsigned char p[8];
  if (rdv_join("127.0.0.1:1", 0, 1, HASH, p, sizeof p, 1, &r)) {
    CHECK(0, "world 1: %s", err_last());
    return;
  }
  atomic_store(&lost_calls, 0);
  struct watchdog *w = watchdog_start(r, 10, failing_check, on_lost, NULL);
  if (!(w != NULL)) {
    CHECK(0, "watchdog_start: %s", err_last());
    return;
  }
  for (int i = 0; i < 100 && watchdog_lost_rank(w) == -1; i++) {
    struct timespec ts = {0, 10000000L};
    nanosleep(&ts, NULL);
  }
  CHECK(watchdog_lost_rank(w) == -2, "comm_check failure reported as %d", watchdog_lost_rank(w));
  CHECK(strstr(watchdog_message(w), "remote process exited") != NULL, "message: %s", watchdog_message(w));
  CHECK(atomic_load(&lost_calls) == 1, "on_lost called %d times", atomic_load(&lost_calls));
  watchdog_stop(w);
  rdv_close(r);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LOG_LEVEL_ERROR);
  test_all_reduce(2);
  test_all_reduce(3);
  test_lost_worker();
  test_lost_master();
  test_comm_check();
  return test_finish("test_rdv_collective");
}
