/* test_tp_group.c - the rank threads of src/dist/tp.c: every rank runs each posted function
 * exactly once, on its own thread (rank 0 on the caller's), across many runs; the lowest failing
 * rank's error comes back prefixed with its rank; the world bounds are refused with a message. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "dist/tp.h"
#include "test_util.h"
#include "util/log.h"

struct ctx {
  atomic_int calls[TP_MAX_WORLD];
  pthread_t thread[TP_MAX_WORLD];
  int fail_from; /* ranks >= this fail (TP_MAX_WORLD: none) */
};

static int fn(int rank, void *p) {
  struct ctx *c = p;
  atomic_fetch_add(&c->calls[rank], 1);
  c->thread[rank] = pthread_self();
  if (rank >= c->fail_from)
    return ERR("boom on %d", rank);
  return 0;
}

int main(void) {
  static struct ctx c;
  for (int world = 1; world <= 8; world *= 2) {
    struct tp_group *g = tp_group_create(world);
    REQUIRE(g, "tp_group_create(%d): %s", world, err_last());
    CHECK(tp_group_world(g) == world, "world %d", tp_group_world(g));
    memset(&c, 0, sizeof c);
    c.fail_from = TP_MAX_WORLD;
    pthread_t first[TP_MAX_WORLD];
    int runs = 2000, bad = 0;
    for (int i = 0; i < runs; i++) {
      bad |= tp_group_run(g, fn, &c) != 0;
      if (i == 0)
        memcpy(first, c.thread, sizeof first);
      for (int r = 0; r < world; r++) /* each rank keeps its thread */
        bad |= !pthread_equal(first[r], c.thread[r]);
    }
    CHECK(!bad, "world %d: a run failed or a rank changed thread", world);
    CHECK(pthread_equal(first[0], pthread_self()), "rank 0 runs on the caller's thread");
    for (int r = 0; r < world; r++) {
      CHECK(atomic_load(&c.calls[r]) == runs, "world %d rank %d ran %d times, want %d", world, r,
            atomic_load(&c.calls[r]), runs);
      for (int q = 0; q < r; q++)
        CHECK(!pthread_equal(first[q], first[r]), "ranks %d and %d share a thread", q, r);
    }
    if (world > 2) { /* ranks 2.. fail: the error is rank 2's, every rank still ran */
      c.fail_from = 2;
      CHECK(tp_group_run(g, fn, &c) != 0 && strstr(err_last(), "tensor-parallel rank 2: boom on 2"),
            "error of the lowest failing rank: %s", err_last());
      CHECK(atomic_load(&c.calls[world - 1]) == runs + 1, "the last rank ran too");
      c.fail_from = 0;
      CHECK(tp_group_run(g, fn, &c) != 0 && strstr(err_last(), "tensor-parallel rank 0: boom on 0"),
            "rank 0's error: %s", err_last());
      c.fail_from = TP_MAX_WORLD;
      CHECK(tp_group_run(g, fn, &c) == 0, "the group works after failures");
    }
    tp_group_destroy(g);
  }
  CHECK(!tp_group_create(0) && strstr(err_last(), "--tp 0"), "world 0 refused: %s", err_last());
  CHECK(!tp_group_create(TP_MAX_WORLD + 1), "world %d refused", TP_MAX_WORLD + 1);
  tp_group_destroy(NULL);
  return test_finish("test_tp_group");
}
