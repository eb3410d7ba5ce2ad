/* async_engine.c - the thread-safe front of the engine (pagoda_async_*, pagoda_stream_*).
 *
 * One engine thread owns the engine. Other threads talk to it only through the async object,
 * under its single mutex MU:
 *   - submit: the stream goes on the submission queue; the engine thread adds it between steps
 *     and signals the stream's condition variable with the outcome (the submitter waits, so the
 *     prompt and parameters it passed stay valid until then and are not copied);
 *   - abort: the stream goes on the abort queue; the engine thread calls pagoda_abort between
 *     steps, so the blocks return to the pool before the next step;
 *   - outputs: after each step the engine thread copies every output into an event node
 *     appended to its stream (found by request id in a hash table) and signals the stream.
 * A stream has two references: its caller's (dropped by pagoda_stream_free) and the engine's
 * (held while the request is live, dropped when its last sample's finish was queued). The last
 * one to let go frees it. Nothing blocks while holding MU except condition waits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pagoda.h"
#include "util/log.h"

#define HASH_BUCKETS 4096 /* live streams by request id; chains stay short below ~10^4 live */

struct ev_node {
  struct ev_node *next;
  struct pagoda_event ev; /* its arrays point into this allocation, after the node */
};

enum stream_state { ST_PENDING, ST_LIVE, ST_DONE, ST_REJECTED };

struct pagoda_stream {
  struct pagoda_async *a;
  uint64_t id;
  enum stream_state state;
  int refs;
  int status;                /* ST_REJECTED: the engine's status and message */
  char err[512];
  const char *text;          /* submission (the submitter's memory, valid while it waits) */
  const int32_t *ids;
  int n_ids;
  const struct pagoda_sampling_params *sp;
  int expect;                /* finish events to come: n, or beam_width for beam search */
  int finishes_queued, finishes_delivered;
  int started;               /* first event queued (no longer counts as waiting) */
  int abort_requested;
  struct ev_node *head, *tail, *cur; /* queued events; CUR: the one last returned */
  pthread_cond_t cv;
  struct pagoda_stream *hnext;       /* hash chain (live) */
  struct pagoda_stream *qnext;       /* submission or abort queue */
  int in_abort_queue;
};

struct pagoda_async {
  pagoda_engine_t *e;
  struct pagoda_async_params p;
  pthread_t thread;
  int thread_started, joined;
  pthread_mutex_t mu;
  pthread_cond_t wake;              /* the engine thread waits on it when idle */
  struct pagoda_stream *subq, *subq_tail;
  struct pagoda_stream *abortq;
  struct pagoda_stream *live[HASH_BUCKETS];
  int accepting, stopping;
  double deadline;                  /* stopping: abort everything after this (monotonic s) */
  int aborted_all;
  struct pagoda_async_stats st;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cond_init_monotonic(pthread_cond_t *c) {
  pthread_condattr_t at;
  if (pthread_condattr_init(&at))
    return -1;
  pthread_condattr_setclock(&at, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(c, &at);
  pthread_condattr_destroy(&at);
  return rc;
}

void pagoda_async_params_default(struct pagoda_async_params *p) {
  memset(p, 0, sizeof *p);
  p->max_waiting = 1024;
}

const pagoda_engine_t *pagoda_async_engine(const pagoda_async_t *a) { return a->e; }

/* ---- streams (MU held) ---- */

static struct pagoda_stream **bucket(struct pagoda_async *a, uint64_t id) {
  return &a->live[(id * 0x9e3779b97f4a7c15ull) >> 52 & (HASH_BUCKETS - 1)];
}

static struct pagoda_stream *find_live(struct pagoda_async *a, uint64_t id) {
  for (struct pagoda_stream *s = *bucket(a, id); s; s = s->hnext)
    if (s->id == id)
      return s;
  return NULL;
}

static void unlink_live(struct pagoda_async *a, struct pagoda_stream *s) {
  for (struct pagoda_stream **pp = bucket(a, s->id); *pp; pp = &(*pp)->hnext)
    if (*pp == s) {
      *pp = s->hnext;
      return;
    }
}

static void stream_destroy(struct pagoda_stream *s) {
  for (struct ev_node *n = s->head, *nx; n; n = nx) {
    nx = n->next;
    free(n);
  }
  free(s->cur);
  pthread_cond_destroy(&s->cv);
  free(s);
}

static void unref(struct pagoda_stream *s) {
  if (--s->refs == 0)
    stream_destroy(s);
}

/* Copies OUT into a node appended to S. Returns -1 when out of memory (the event is lost; a
 * finish is still recorded so that the caller is not left waiting). */
static int push_event(struct pagoda_stream *s, const struct pagoda_output *o) {
  size_t nt = (size_t)o->num_token_ids, nk = (size_t)o->num_top_logprobs;
  size_t sz = sizeof(struct ev_node) + nt * sizeof(int32_t) + (o->logprobs ? nt * sizeof(float) : 0) +
              (o->logprobs ? nt * nk * (sizeof(int32_t) + sizeof(float)) : 0) + o->text_len + 1;
  struct ev_node *n = malloc(sz);
  if (!n)
    return -1;
  /* Layout after the node: floats, int32s (both 4-aligned), then the text. */
  char *p = (char *)(n + 1);
  n->next = NULL;
  struct pagoda_event *ev = &n->ev;
  ev->index = o->index;
  ev->finish_reason = o->finish_reason;
  ev->usage = o->usage;
  ev->num_token_ids = o->num_token_ids;
  ev->num_top_logprobs = o->logprobs ? o->num_top_logprobs : 0;
  ev->logprobs = NULL;
  ev->top_logprobs = NULL;
  ev->top_logprob_ids = NULL;
  if (o->logprobs) {
    memcpy(p, o->logprobs, nt * sizeof(float));
    ev->logprobs = (const float *)p;
    p += nt * sizeof(float);
    memcpy(p, o->top_logprobs, nt * nk * sizeof(float));
    ev->top_logprobs = (const float *)p;
    p += nt * nk * sizeof(float);
    memcpy(p, o->top_logprob_ids, nt * nk * sizeof(int32_t));
    ev->top_logprob_ids = (const int32_t *)p;
    p += nt * nk * sizeof(int32_t);
  }
  memcpy(p, o->token_ids, nt * sizeof(int32_t));
  ev->token_ids = (const int32_t *)p;
  p += nt * sizeof(int32_t);
  memcpy(p, o->text, o->text_len);
  p[o->text_len] = 0;
  ev->text = p;
  ev->text_len = o->text_len;
  if (s->tail)
    s->tail->next = n;
  else
    s->head = n;
  s->tail = n;
  return 0;
}

/* ---- the engine thread ---- */

static void dispatch(struct pagoda_async *a, const struct pagoda_output *outs, int n) {
  for (int i = 0; i < n; i++) {
    struct pagoda_stream *s = find_live(a, outs[i].request_id);
    if (!s)
      continue;
    if (!s->started) {
      s->started = 1;
      a->st.queued--;
    }
    if (push_event(s, &outs[i]))
      log_error("out of memory for a stream event of request %llu", (unsigned long long)s->id);
    if (outs[i].finish_reason != PAGODA_FINISH_NONE && ++s->finishes_queued == s->expect) {
      s->state = ST_DONE;
      unlink_live(a, s);
      a->st.active--;
      a->st.finished++;
      if (outs[i].finish_reason == PAGODA_FINISH_ABORT)
        a->st.aborted++;
      pthread_cond_broadcast(&s->cv);
      unref(s);
      continue;
    }
    pthread_cond_broadcast(&s->cv);
  }
}

/* Aborts every live request (engine thread, MU held). */
static void abort_all(struct pagoda_async *a) {
  for (int b = 0; b < HASH_BUCKETS; b++)
    for (struct pagoda_stream *s = a->live[b]; s; s = s->hnext)
      if (s->state == ST_LIVE)
        pagoda_abort(a->e, s->id);
}

/* Adds queued submissions (MU held; released around each add, which may tokenize). */
static void apply_submissions(struct pagoda_async *a) {
  while (a->subq) {
    struct pagoda_stream *s = a->subq;
    a->subq = s->qnext;
    if (!a->subq)
      a->subq_tail = NULL;
    s->qnext = NULL;
    if (a->stopping) {
      s->state = ST_REJECTED;
      s->status = PAGODA_ERR_CLOSED;
      snprintf(s->err, sizeof s->err, "the server is shutting down");
      a->st.queued--;
      a->st.active--;
      pthread_cond_broadcast(&s->cv);
      continue;
    }
    pthread_mutex_unlock(&a->mu);
    uint64_t id = 0;
    int st = s->text ? pagoda_add_request(a->e, s->text, s->sp, &id)
                     : pagoda_add_request_tokens(a->e, s->ids, s->n_ids, s->sp, &id);
    char err[sizeof s->err];
    if (st != PAGODA_OK)
      snprintf(err, sizeof err, "%s", pagoda_last_error());
    pthread_mutex_lock(&a->mu);
    if (st != PAGODA_OK) {
      s->state = ST_REJECTED;
      s->status = st;
      memcpy(s->err, err, sizeof err);
      a->st.queued--;
      a->st.active--;
    } else {
      s->id = id;
      s->state = ST_LIVE;
      s->refs++; /* the engine's reference */
      struct pagoda_stream **bk = bucket(a, id);
      s->hnext = *bk;
      *bk = s;
      a->st.submitted++;
      if (s->abort_requested) /* aborted while it waited for admission */
        pagoda_abort(a->e, id);
    }
    s->text = NULL;
    s->ids = NULL;
    s->sp = NULL;
    pthread_cond_broadcast(&s->cv);
  }
}

static void apply_aborts(struct pagoda_async *a) {
  while (a->abortq) {
    struct pagoda_stream *s = a->abortq;
    a->abortq = s->qnext;
    s->qnext = NULL;
    s->in_abort_queue = 0;
    if (s->state == ST_LIVE)
      pagoda_abort(a->e, s->id);
    unref(s); /* the queue's reference */
  }
}

static void *engine_main(void *arg) {
  struct pagoda_async *a = arg;
  pthread_mutex_lock(&a->mu);
  for (;;) {
    apply_submissions(a);
    apply_aborts(a);
    int work = pagoda_engine_has_work(a->e);
    if (a->stopping) {
      if (!work)
        break;
      if (!a->aborted_all && now_s() >= a->deadline) {
        abort_all(a);
        a->aborted_all = 1;
      }
    }
    if (!work) {
      pthread_cond_wait(&a->wake, &a->mu);
      continue;
    }
    pthread_mutex_unlock(&a->mu);
    const struct pagoda_output *outs;
    int n = 0;
    int st = pagoda_engine_step(a->e, &outs, &n);
    char err[512];
    if (st != PAGODA_OK)
      snprintf(err, sizeof err, "%s", pagoda_last_error());
    pthread_mutex_lock(&a->mu);
    dispatch(a, outs, n);
    if (st != PAGODA_OK)
      a->st.step_failures++;
    if (st != PAGODA_OK && st != PAGODA_ERR_BACKEND) {
      /* Nothing can progress (the pool cannot hold what runs): end every request rather than
       * leave their callers waiting; the engine keeps serving new ones. */
      log_error("engine step failed: %s; aborting the running requests", err);
      abort_all(a);
    }
    pagoda_engine_stats(a->e, &a->st.engine);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

/* ---- public API ---- */

int pagoda_async_create(const struct pagoda_engine_params *ep, const struct pagoda_async_params *ap,
                        pagoda_async_t **out) {
  *out = NULL;
  if (ep->on_output)
    return ERR("the async engine takes the outputs itself: leave on_output NULL"), PAGODA_ERR_INVALID_ARG;
  struct pagoda_async_params defp;
  pagoda_async_params_default(&defp);
  if (!ap)
    ap = &defp;
  if (ap->max_waiting < 1)
    return ERR("max_waiting must be >= 1 (got %d)", ap->max_waiting), PAGODA_ERR_INVALID_ARG;
  struct pagoda_async *a = calloc(1, sizeof *a);
  if (!a)
    return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
  a->p = *ap;
  int st = pagoda_engine_create(ep, &a->e);
  if (st != PAGODA_OK) {
    free(a);
    return st;
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->wake, NULL);
  a->accepting = 1;
  a->st.accepting = 1;
  pagoda_engine_stats(a->e, &a->st.engine);
  if (pthread_create(&a->thread, NULL, engine_main, a)) {
    pagoda_engine_free(a->e);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->wake);
    free(a);
    return ERR("cannot start the engine thread"), PAGODA_ERR_OUT_OF_MEMORY;
  }
  a->thread_started = 1;
  *out = a;
  return PAGODA_OK;
}

void pagoda_async_shutdown(pagoda_async_t *a, int grace_ms) {
  pthread_mutex_lock(&a->mu);
  if (a->joined) {
    pthread_mutex_unlock(&a->mu);
    return;
  }
  a->accepting = 0;
  a->st.accepting = 0;
  if (!a->stopping) {
    a->stopping = 1;
    a->deadline = now_s() + (grace_ms > 0 ? grace_ms : 0) / 1000.0;
  }
  pthread_cond_signal(&a->wake);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->thread, NULL);
  pthread_mutex_lock(&a->mu);
  a->joined = 1;
  apply_submissions(a); /* any that raced in: rejected as closed */
  pthread_mutex_unlock(&a->mu);
}

void pagoda_async_free(pagoda_async_t *a) {
  if (!a)
    return;
  pagoda_async_shutdown(a, 0);
  pthread_mutex_lock(&a->mu);
  apply_aborts(a); /* drops the queue's references */
  pthread_mutex_unlock(&a->mu);
  pagoda_engine_free(a->e);
  pthread_cond_destroy(&a->wake);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

int pagoda_async_submit(pagoda_async_t *a, const char *text, const int32_t *ids, int n_ids,
                        const struct pagoda_sampling_params *sp, pagoda_stream_t **out) {
  *out = NULL;
  if (!text && (!ids || n_ids < 1))
    return ERR("a request needs a prompt (text or token ids)"), PAGODA_ERR_INVALID_ARG;
  struct pagoda_stream *s = calloc(1, sizeof *s);
  if (!s || cond_init_monotonic(&s->cv)) {
    free(s);
    return ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY;
  }
  s->a = a;
  s->refs = 1;
  s->text = text;
  s->ids = ids;
  s->n_ids = n_ids;
  s->sp = sp;
  s->expect = !sp ? 1 : sp->beam_width > 1 ? sp->beam_width : sp->n > 0 ? sp->n : 1;
  pthread_mutex_lock(&a->mu);
  if (!a->accepting || a->joined) {
    pthread_mutex_unlock(&a->mu);
    stream_destroy(s);
    return ERR("the server is shutting down"), PAGODA_ERR_CLOSED;
  }
  if (a->st.queued >= a->p.max_waiting) {
    a->st.rejected_busy++;
    int q = a->st.queued;
    pthread_mutex_unlock(&a->mu);
    stream_destroy(s);
    return ERR("the waiting queue is full (%d requests wait for their first token); retry later", q),
           PAGODA_ERR_BUSY;
  }
  a->st.queued++;
  a->st.active++;
  if (a->subq_tail)
    a->subq_tail->qnext = s;
  else
    a->subq = s;
  a->subq_tail = s;
  pthread_cond_signal(&a->wake);
  while (s->state == ST_PENDING)
    pthread_cond_wait(&s->cv, &a->mu);
  pthread_mutex_unlock(&a->mu);
  if (s->state == ST_REJECTED) {
    int st = s->status;
    ERR("%s", s->err);
    stream_destroy(s);
    return st;
  }
  *out = s;
  return PAGODA_OK;
}

int pagoda_stream_next(pagoda_stream_t *s, struct pagoda_event *ev, int timeout_ms) {
  struct pagoda_async *a = s->a;
  struct timespec until;
  if (timeout_ms > 0) {
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&a->mu);
  free(s->cur);
  s->cur = NULL;
  while (!s->head) {
    if (s->state == ST_DONE || s->finishes_delivered >= s->expect) {
      pthread_mutex_unlock(&a->mu);
      return PAGODA_ERR_NOT_FOUND;
    }
    int timed_out = timeout_ms == 0;
    if (timeout_ms < 0)
      pthread_cond_wait(&s->cv, &a->mu);
    else if (timeout_ms > 0)
      timed_out = pthread_cond_timedwait(&s->cv, &a->mu, &until) != 0;
    if (timed_out && !s->head && s->state != ST_DONE) {
      pthread_mutex_unlock(&a->mu);
      return PAGODA_ERR_TIMEOUT;
    }
  }
  struct ev_node *n = s->head;
  s->head = n->next;
  if (!s->head)
    s->tail = NULL;
  s->cur = n;
  *ev = n->ev;
  if (ev->finish_reason != PAGODA_FINISH_NONE)
    s->finishes_delivered++;
  pthread_mutex_unlock(&a->mu);
  return PAGODA_OK;
}

/* MU held. */
static void request_abort(struct pagoda_stream *s) {
  struct pagoda_async *a = s->a;
  if (s->abort_requested || s->state != ST_LIVE)
    return;
  s->abort_requested = 1;
  if (a->joined)
    return; /* the engine thread is gone: every request already ended */
  s->refs++; /* the abort queue's reference */
  s->in_abort_queue = 1;
  s->qnext = a->abortq;
  a->abortq = s;
  pthread_cond_signal(&a->wake);
}

void pagoda_stream_abort(pagoda_stream_t *s) {
  pthread_mutex_lock(&s->a->mu);
  request_abort(s);
  pthread_mutex_unlock(&s->a->mu);
}

uint64_t pagoda_stream_id(const pagoda_stream_t *s) { return s->id; }

void pagoda_stream_free(pagoda_stream_t *s) {
  if (!s)
    return;
  struct pagoda_async *a = s->a;
  pthread_mutex_lock(&a->mu);
  request_abort(s);
  unref(s);
  pthread_mutex_unlock(&a->mu);
}

int pagoda_async_stats(pagoda_async_t *a, struct pagoda_async_stats *out) {
  pthread_mutex_lock(&a->mu);
  *out = a->st;
  pthread_mutex_unlock(&a->mu);
  return PAGODA_OK;
}
