/* test_step_wire.c - the worker channel's message (src/dist/step_wire.h): a forward's batch and a
 * copy_blocks' pairs come back field for field after encode / decode and after travelling from
 * rank 0 to two worker processes over the rendezvous sockets; every truncated or padded message,
 * a wrong magic / version / op and counts that disagree with the length are refused. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/rendezvous.h"
#include "dist/step_wire.h"
#include "test_util.h"
#include "util/log.h"

/* T = 5 tokens of B = 2 sequences (3 prefill + 2 decode... as query lengths 3 and 2), M = 3. */
static const int32_t ids[5] = {11, 12, 13, 900, 901}, pos[5] = {0, 1, 2, 7, 8}, slots[5] = {32, 33, 34, -1, 72};
static const int32_t qs[3] = {0, 3, 5}, lens[2] = {3, 9}, tables[6] = {2, -1, -1, 4, 4, 5}, lidx[2] = {2, 4};

static struct batch sample(void) {
  return (struct batch){.num_tokens = 5, .num_seqs = 2, .max_blocks_per_seq = 3, .max_seq_len = 9, .max_query_len = 3,
                        .input_ids = ids, .positions = pos, .slot_mapping = slots, .query_start = qs,
                        .seq_lens = lens, .block_tables = tables, .num_logits = 2, .logits_idx = lidx};
}

static int same_batch(const struct batch *a, const struct batch *b) {
  return a->num_tokens == b->num_tokens && a->num_seqs == b->num_seqs && a->max_blocks_per_seq == b->max_blocks_per_seq &&
         a->max_seq_len == b->max_seq_len && a->max_query_len == b->max_query_len && a->num_logits == b->num_logits &&
         !memcmp(a->input_ids, b->input_ids, sizeof ids) && !memcmp(a->positions, b->positions, sizeof pos) &&
         !memcmp(a->slot_mapping, b->slot_mapping, sizeof slots) && !memcmp(a->query_start, b->query_start, sizeof qs) &&
         !memcmp(a->seq_lens, b->seq_lens, sizeof lens) && !memcmp(a->block_tables, b->block_tables, sizeof tables) &&
         !memcmp(a->logits_idx, b->logits_idx, sizeof lidx);
}

static const int32_t csrc[3] = {1, 5, 9}, cdst[3] = {2, 6, 10};

static void test_round_trip(void) {
  struct batch b = sample();
  int32_t args[STEP_NARGS] = {0, 0, 0, 0, 0, 0, 0};
  unsigned char *buf;
  size_t len;
  CHECK(step_encode(STEP_FORWARD, args, &b, NULL, NULL, &buf, &len) == 0, "encode: %s", err_last());
  struct step_msg m;
  CHECK(step_decode(buf, len, &m) == 0 && m.op == STEP_FORWARD && same_batch(&b, &m.batch), "forward round trip: %s",
        err_last());
  step_msg_free(&m);
  /* Every shorter or longer length, and a corrupted header, is refused. */
  unsigned char *big = malloc(len + 4);
  memcpy(big, buf, len);
  memset(big + len, 0, 4);
  for (size_t n = 0; n < len; n++)
    CHECK(step_decode(buf, n, &m) == -1 && strstr(err_last(), "step message"), "accepted %zu of %zu bytes", n, len);
  CHECK(step_decode(big, len + 4, &m) == -1, "accepted a padded message");
  free(big);
  buf[0] = 'X';
  CHECK(step_decode(buf, len, &m) == -1 && strstr(err_last(), "not a step message"), "wrong magic: %s", err_last());
  buf[0] = 'P';
  unsigned char version = buf[4];
  buf[4] = 9;
  CHECK(step_decode(buf, len, &m) == -1 && strstr(err_last(), "version 9"), "wrong version: %s", err_last());
  buf[4] = version;
  buf[8] = 77;
  CHECK(step_decode(buf, len, &m) == -1 && strstr(err_last(), "unknown op 77"), "wrong op: %s", err_last());
  buf[8] = STEP_FORWARD;
  size_t tok = 12 + 4 * STEP_NARGS + 4; /* num_tokens: 6 instead of 5 with the same length */
  buf[tok] = 6;
  CHECK(step_decode(buf, len, &m) == -1 && strstr(err_last(), "do not match"), "inconsistent counts: %s", err_last());
  buf[tok] = 0xff, buf[tok + 1] = 0xff, buf[tok + 2] = 0xff, buf[tok + 3] = 0xff; /* -1 tokens */
  CHECK(step_decode(buf, len, &m) == -1, "negative count accepted");
  free(buf);

  args[0] = 3;
  CHECK(step_encode(STEP_COPY_BLOCKS, args, NULL, csrc, cdst, &buf, &len) == 0, "encode copy: %s", err_last());
  CHECK(step_decode(buf, len, &m) == 0 && m.op == STEP_COPY_BLOCKS && m.args[0] == 3 && !memcmp(m.src, csrc, sizeof csrc) &&
            !memcmp(m.dst, cdst, sizeof cdst),
        "copy round trip: %s", err_last());
  step_msg_free(&m);
  free(buf);
  int32_t cargs[STEP_NARGS] = {64, 16, 1, 256, 8, 32, 0};
  CHECK(step_encode(STEP_ALLOC_CACHE, cargs, NULL, NULL, NULL, &buf, &len) == 0 && step_decode(buf, len, &m) == 0 &&
            m.op == STEP_ALLOC_CACHE && !memcmp(m.args, cargs, sizeof cargs),
        "alloc_cache round trip: %s", err_last());
  step_msg_free(&m);
  free(buf);
  CHECK(step_encode(STEP_OP_END, NULL, NULL, NULL, NULL, &buf, &len) == -1, "encoded an unknown op");
}

static char master[64];

static void pick_master(void) { test_loopback_address(master, sizeof master); }

/* Rank 0 sends a forward, a copy_blocks and a quit; two worker processes check each. */
static void test_over_sockets(void) {
  pick_master();
  pid_t pids[3];
  for (int k = 1; k < 3; k++) {
    if ((pids[k] = fork()) != 0)
      continue;
    unsigned char p[4];
    struct rdv *r;
    if (rdv_join(master, k, 3, 42, p, sizeof p, 10, &r))
      _exit(1);
    struct step_msg m;
    struct batch b = sample();
    if (step_recv(r, &m, 10) || m.op != STEP_FORWARD || !same_batch(&b, &m.batch))
      _exit(2);
    step_msg_free(&m);
    if (step_recv(r, &m, 10) || m.op != STEP_COPY_BLOCKS || m.args[0] != 3 || memcmp(m.dst, cdst, sizeof cdst))
      _exit(3);
    step_msg_free(&m);
    if (step_recv(r, &m, 10) || m.op != STEP_QUIT)
      _exit(4);
    rdv_close(r);
    _exit(0);
  }
  unsigned char p[4] = {1, 2, 3, 4};
  struct rdv *r;
  if (rdv_join(master, 0, 3, 42, p, sizeof p, 10, &r)) {
    CHECK(0, "rank 0 join: %s", err_last());
    return;
  }
  struct batch b = sample();
  int32_t args[STEP_NARGS] = {3};
  unsigned char *buf;
  size_t len;
  CHECK(step_encode(STEP_FORWARD, NULL, &b, NULL, NULL, &buf, &len) == 0 && step_send(r, buf, len, 10) == 0,
        "send forward: %s", err_last());
  free(buf);
  CHECK(step_encode(STEP_COPY_BLOCKS, args, NULL, csrc, cdst, &buf, &len) == 0 && step_send(r, buf, len, 10) == 0,
        "send copy: %s", err_last());
  free(buf);
  CHECK(step_encode(STEP_QUIT, NULL, NULL, NULL, NULL, &buf, &len) == 0 && step_send(r, buf, len, 10) == 0,
        "send quit: %s", err_last());
  free(buf);
  for (int k = 1; k < 3; k++) {
    int st = 0;
    waitpid(pids[k], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d exit status %d", k, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  rdv_close(r);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LOG_LEVEL_ERROR);
  test_round_trip();
  test_over_sockets();
  return test_finish("test_step_wire");
}
