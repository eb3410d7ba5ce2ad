/* tp.c - the rank threads of single-process tensor parallelism (tp.h). */
#include "dist/tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/log.h"

struct tp_worker {
  struct tp_group *g;
  int rank;
  pthread_t thread;
  int started;
};

struct tp_group {
  int world;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  unsigned long gen;   /* bumped by each tp_group_run: a worker runs each generation once */
  int pending;         /* workers still running the current generation */
  int quit;
  int (*fn)(int rank, void *ctx);
  void *ctx;
  int rc[TP_MAX_WORLD];
  char err[TP_MAX_WORLD][512];
  struct tp_worker workers[TP_MAX_WORLD];
};

static void *worker_main(void *arg) {
  struct tp_worker *w = arg;
  struct tp_group *g = w->g;
  unsigned long seen = 0;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    while (!g->quit && g->gen == seen)
      pthread_cond_wait(&g->go, &g->mu);
    if (g->quit)
      break;
    seen = g->gen;
    int (*fn)(int, void *) = g->fn;
    void *ctx = g->ctx;
    pthread_mutex_unlock(&g->mu);
    int rc = fn(w->rank, ctx);
    pthread_mutex_lock(&g->mu);
    g->rc[w->rank] = rc;
    if (rc)
      snprintf(g->err[w->rank], sizeof g->err[w->rank], "%s", err_last());
    if (--g->pending == 0)
      pthread_cond_signal(&g->done);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

struct tp_group *tp_group_create(int world) {
  if (world < 1 || world > TP_MAX_WORLD) {
    ERR("--tp %d: must be 1 .. %d", world, TP_MAX_WORLD);
    return NULL;
  }
  struct tp_group *g = calloc(1, sizeof *g);
  if (!g) {
    ERR("out of memory");
    return NULL;
  }
  g->world = world;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->go, NULL);
  pthread_cond_init(&g->done, NULL);
  for (int r = 1; r < world; r++) {
    struct tp_worker *w = &g->workers[r];
    w->g = g;
    w->rank = r;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      ERR("tensor parallelism: cannot start the thread of rank %d", r);
      tp_group_destroy(g);
      return NULL;
    }
    w->started = 1;
  }
  return g;
}

int tp_group_world(const struct tp_group *g) { return g ? g->world : 1; }

int tp_group_run(struct tp_group *g, int (*fn)(int rank, void *ctx), void *ctx) {
  pthread_mutex_lock(&g->mu);
  g->fn = fn;
  g->ctx = ctx;
  g->pending = g->world - 1;
  g->gen++;
  pthread_cond_broadcast(&g->go);
  pthread_mutex_unlock(&g->mu);
  int rc0 = fn(0, ctx);
  char err0[512] = "";
  if (rc0)
    snprintf(err0, sizeof err0, "%s", err_last());
  pthread_mutex_lock(&g->mu);
  while (g->pending > 0)
    pthread_cond_wait(&g->done, &g->mu);
  pthread_mutex_unlock(&g->mu);
  if (rc0)
    return g->world > 1 ? ERR("tensor-parallel rank 0: %s", err0) : ERR("%s", err0);
  for (int r = 1; r < g->world; r++)
    if (g->rc[r])
      return ERR("tensor-parallel rank %d: %s", r, g->err[r]);
  return 0;
}

void tp_group_destroy(struct tp_group *g) {
  if (!g)
    return;
  pthread_mutex_lock(&g->mu);
  g->quit = 1;
  pthread_cond_broadcast(&g->go);
  pthread_mutex_unlock(&g->mu);
  for (int r = 1; r < g->world; r++)
    if (g->workers[r].started)
      pthread_join(g->workers[r].thread, NULL);
  pthread_cond_destroy(&g->go);
  pthread_cond_destroy(&g->done);
  pthread_mutex_destroy(&g->mu);
  free(g);
}
