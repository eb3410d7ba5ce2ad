/* watchdog.c - see watchdog.h. */
#define _POSIX_C_SOURCE 200809L
#include "dist/watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dist/rendezvous.h"
#include "util/log.h"

struct watchdog {
  struct rdv *r;
  int period_ms;
  int (*comm_check)(void *user);
  void (*on_lost)(int rank, void *user);
  void *user;
  pthread_t thread;
  atomic_int stop;
  atomic_int lost; /* -1 alive; set after message is written */
  char message[512];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *watchdog_main(void *arg) {
  struct watchdog *w = arg;
  while (!atomic_load(&w->stop)) {
    /* rdv_dead_peer returns at once while a peer's bytes wait to be read (a collective in
     * flight): the rest of the period is slept, so the watchdog never spins on a core */
    double t0 = now_s();
    int dead = rdv_dead_peer(w->r, w->period_ms);
    if (dead < 0 && w->comm_check && w->comm_check(w->user)) {
      dead = -2;
      snprintf(w->message, sizeof w->message, "tensor-parallel communicator failed: %s", err_last());
    } else if (dead >= 0) {
      snprintf(w->message, sizeof w->message,
               "tensor-parallel rank %d lost (its process exited or the network failed); stopping the group", dead);
    }
    if (dead == -1) {
      double left = w->period_ms * 1e-3 - (now_s() - t0);
      if (left > 0) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
      }
      continue;
    }
    if (w->on_lost)
      w->on_lost(dead, w->user);
    rdv_abort_lost(w->r, dead); /* dead: a rank, or -2 for a failed communicator */
    atomic_store(&w->lost, dead);
    break;
  }
  return NULL;
}

struct watchdog *watchdog_start(struct rdv *r, int period_ms, int (*comm_check)(void *user),
                                void (*on_lost)(int rank, void *user), void *user) {
  if (!r || period_ms < 1) {
    ERR("watchdog: needs a rendezvous and a period >= 1 ms");
    return NULL;
  }
  struct watchdog *w = calloc(1, sizeof *w);
  if (!w) {
    ERR("out of memory");
    return NULL;
  }
  w->r = r;
  w->period_ms = period_ms;
  w->comm_check = comm_check;
  w->on_lost = on_lost;
  w->user = user;
  atomic_init(&w->stop, 0);
  atomic_init(&w->lost, -1);
  if (pthread_create(&w->thread, NULL, watchdog_main, w)) {
    free(w);
    ERR("watchdog: cannot start its thread");
    return NULL;
  }
  return w;
}

int watchdog_lost_rank(struct watchdog *w) { return atomic_load(&w->lost); }

const char *watchdog_message(struct watchdog *w) { return atomic_load(&w->lost) == -1 ? "" : w->message; }

void watchdog_stop(struct watchdog *w) {
  if (!w)
    return;
  atomic_store(&w->stop, 1);
  pthread_join(w->thread, NULL);
  free(w);
}
