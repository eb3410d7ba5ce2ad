/* test_rendezvous.c - the multi-process TP rendezvous (src/dist/rendezvous.h) with real processes
 * on loopback: a 4-rank group gets rank 0's payload and passes a barrier (workers started before
 * rank 0 listens); a wrong --tp-world, a duplicated rank, another configuration hash and a missing
 * rank each fail on every side with the sentence that names them; a stray connection is ignored;
 * a rank that dies is seen by rdv_dead_peer on both sides; addresses are parsed strictly. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/rendezvous.h"
#include "test_util.h"
#include "util/log.h"

#define HASH 0x1234abcd5678ef00ull
#define PAYLOAD_LEN 128

static char master[64];

static void pick_master(void) { test_loopback_address(master, sizeof master); }

static void fill_payload(unsigned char *p) {
  for (int i = 0; i < PAYLOAD_LEN; i++)
    p[i] = (unsigned char)(i * 37 + 11);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A worker process: joins as RANK of WORLD with HASH; exit 0 when the outcome matches: success
 * with the right payload and a barrier when EXPECT is NULL, else a failure whose message
 * contains EXPECT. */
static pid_t worker(int rank, int world, uint64_t hash, const char *expect, double timeout) {
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  unsigned char got[PAYLOAD_LEN] = {0}, want[PAYLOAD_LEN];
  fill_payload(want);
  struct rdv *r;
  log_set_level(LOG_LEVEL_ERROR);
  int rc = rdv_join(master, rank, world, hash, got, PAYLOAD_LEN, timeout, &r);
  if (expect) {
    if (rc == 0 || !strstr(err_last(), expect)) {
      fprintf(stderr, "rank %d: expected an error with '%s', got rc %d: %s\n", rank, expect, rc, rc ? err_last() : "");
      _exit(1);
    }
    _exit(0);
  }
  if (rc) {
    fprintf(stderr, "rank %d: %s\n", rank, err_last());
    _exit(2);
  }
  if (memcmp(got, want, PAYLOAD_LEN) != 0)
    _exit(3);
  if (rdv_barrier(r, 10)) {
    fprintf(stderr, "rank %d barrier: %s\n", rank, err_last());
    _exit(4);
  }
  rdv_close(r);
  _exit(0);
}

static int wait_ok(pid_t pid, const char *what) {
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: worker exit status %d", what, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_group_of_four(void) {
  pick_master();
  pid_t w[3];
  for (int i = 0; i < 3; i++) /* started before rank 0 listens: they retry */
    w[i] = worker(i + 1, 4, HASH, NULL, 10);
  sleep_ms(300);
  unsigned char p[PAYLOAD_LEN];
  fill_payload(p);
  struct rdv *r;
  int rc = rdv_join(master, 0, 4, HASH, p, PAYLOAD_LEN, 10, &r);
  CHECK(rc == 0, "rank 0 join: %s", err_last());
  if (rc == 0) {
    CHECK(rdv_barrier(r, 10) == 0, "rank 0 barrier: %s", err_last());
    rdv_close(r);
  }
  for (int i = 0; i < 3; i++)
    wait_ok(w[i], "group of four");
}

/* Rank 0 of WORLD with HASH fails with a message containing EXPECT. */
static void expect_master_error(int world, double timeout, const char *expect) {
  unsigned char p[PAYLOAD_LEN];
  fill_payload(p);
  struct rdv *r = NULL;
  int rc = rdv_join(master, 0, world, HASH, p, PAYLOAD_LEN, timeout, &r);
  CHECK(rc == -1 && r == NULL, "rank 0 joined although it should fail with '%s'", expect);
  CHECK(strstr(err_last(), expect) != NULL, "rank 0 error '%s' lacks '%s'", err_last(), expect);
}

static void test_mismatches(void) {
  pick_master();
  pid_t w = worker(1, 3, HASH, "was started with --tp-world 3, rank 0 with 2", 10);
  expect_master_error(2, 10, "rank 1 was started with --tp-world 3, rank 0 with 2");
  wait_ok(w, "world mismatch");

  pick_master();
  pid_t a = worker(1, 3, HASH, NULL, 10);
  sleep_ms(200); /* so that the first rank 1 is the one accepted */
  pid_t b = worker(1, 3, HASH, "two processes joined as --tp-rank 1", 10);
  expect_master_error(3, 10, "two processes joined as --tp-rank 1");
  int st;
  waitpid(a, &st, 0); /* the accepted rank 1 is told the group failed too: exit 2 */
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "the first rank 1 did not see the failure (%d)", st);
  wait_ok(b, "duplicate rank");

  pick_master();
  w = worker(1, 2, HASH ^ 1, "another model or other engine flags", 10);
  expect_master_error(2, 10, "rank 1 runs another model or other engine flags");
  wait_ok(w, "hash mismatch");

  pick_master();
  w = worker(1, 3, HASH, "rank(s) 2 did not join", 10);
  expect_master_error(3, 1.0, "rank(s) 2 did not join");
  wait_ok(w, "missing rank");

  pick_master(); /* nobody listens */
  w = worker(1, 2, HASH, "cannot reach rank 0 at --tp-master", 0.5);
  wait_ok(w, "no rank 0");
}

/* A connection that sends garbage is dropped without taking rank 1's place. */
static void test_stray_connection(void) {
  pick_master();
  pid_t stray = fork();
  if (stray == 0) {
    char host[64];
    int port;
    rdv_parse_address(master, host, sizeof host, &port);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    for (int i = 0; i < 50; i++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        if (write(fd, "GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxx", 40) < 0)
          _exit(1);
        sleep_ms(100);
        close(fd);
        _exit(0);
      }
      close(fd);
      sleep_ms(50);
    }
    _exit(1);
  }
  sleep_ms(20);
  pid_t w = fork();
  if (w == 0) { /* rank 1 comes after the stray client */
    sleep_ms(400);
    pid_t k = worker(1, 2, HASH, NULL, 10);
    int st;
    waitpid(k, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 9);
  }
  unsigned char p[PAYLOAD_LEN];
  fill_payload(p);
  struct rdv *r;
  log_set_level(LOG_LEVEL_ERROR);
  int rc = rdv_join(master, 0, 2, HASH, p, PAYLOAD_LEN, 10, &r);
  CHECK(rc == 0, "join after a stray connection: %s", err_last());
  if (rc == 0) {
    CHECK(rdv_barrier(r, 10) == 0, "barrier: %s", err_last());
    rdv_close(r);
  }
  wait_ok(stray, "stray client");
  wait_ok(w, "rank 1 after a stray connection");
}

/* A rank that exits is seen as dead by rank 0, and rank 0's exit by a worker. */
static void test_dead_peer(void) {
  pick_master();
  pid_t w = fork();
  if (w == 0) {
    unsigned char got[PAYLOAD_LEN];
    struct rdv *r;
    if (rdv_join(master, 1, 2, HASH, got, PAYLOAD_LEN, 10, &r))
      _exit(2);
    _exit(rdv_dead_peer(r, 0) == -1 ? 0 : 3); /* alive right after the join; exit closes the socket */
  }
  unsigned char p[PAYLOAD_LEN];
  fill_payload(p);
  struct rdv *r;
  int rc = rdv_join(master, 0, 2, HASH, p, PAYLOAD_LEN, 10, &r);
  CHECK(rc == 0, "join: %s", err_last());
  wait_ok(w, "dead peer worker");
  if (rc == 0) {
    CHECK(rdv_dead_peer(r, 2000) == 1, "rank 0 did not notice rank 1's exit");
    rdv_close(r);
  }

  pick_master();
  w = fork();
  if (w == 0) {
    unsigned char got[PAYLOAD_LEN];
    struct rdv *wr;
    if (rdv_join(master, 1, 2, HASH, got, PAYLOAD_LEN, 10, &wr))
      _exit(2);
    int dead = rdv_dead_peer(wr, 5000);
    _exit(dead == 0 ? 0 : 3);
  }
  rc = rdv_join(master, 0, 2, HASH, p, PAYLOAD_LEN, 10, &r);
  CHECK(rc == 0, "join: %s", err_last());
  if (rc == 0)
    rdv_close(r); /* rank 0 goes away */
  wait_ok(w, "worker sees rank 0 exit");
}

static void test_parse(void) {
  char host[64];
  int port = 0;
  CHECK(rdv_parse_address("node-1.cluster:29500", host, sizeof host, &port) == 0 && !strcmp(host, "node-1.cluster") &&
            port == 29500, "host:port");
  CHECK(rdv_parse_address("[fe80::1]:80", host, sizeof host, &port) == 0 && !strcmp(host, "fe80::1") && port == 80,
        "[v6]:port");
  const char *bad[] = {"", "host", "host:", ":80", "host:0", "host:65536", "host:12x", "fe80::1:80", "[::1]80", "[::1]"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CHECK(rdv_parse_address(bad[i], host, sizeof host, &port) == -1, "accepted '%s'", bad[i]);
    CHECK(strstr(err_last(), "--tp-master") != NULL, "error for '%s' does not name the flag: %s", bad[i], err_last());
  }
  struct rdv *r;
  CHECK(rdv_join("127.0.0.1:1", 2, 2, HASH, host, 8, 1, &r) == -1 && strstr(err_last(), "--tp-rank 2"), "rank >= world");
  CHECK(rdv_join("127.0.0.1:1", 0, 0, HASH, host, 8, 1, &r) == -1 && strstr(err_last(), "--tp-world 0"), "world 0");
  CHECK(rdv_join("127.0.0.1:1", 0, 1, HASH, host, 8, 1, &r) == 0 && rdv_dead_peer(r, 0) == -1, "world 1");
  rdv_close(r);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LOG_LEVEL_ERROR);
  test_parse();
  test_group_of_four();
  test_mismatches();
  test_stray_connection();
  test_dead_peer();
  return test_finish("test_rendezvous");
}
