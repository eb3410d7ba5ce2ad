/* mp.c - multi-process tensor parallelism (mp.h). */
#include "dist/mp.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "dist/rendezvous.h"
#include "dist/step_wire.h"
#include "dist/watchdog.h"
#include "model/model.h"
#include "util/log.h"

/* A call's message and its collectives wait at most this long on a live peer (a lost one is
 * noticed within TP_MP_WATCHDOG_MS); a worker waits for rank 0's next call forever. */
#define TP_MP_IO_TIMEOUT_S 600.0
#define TP_MP_STATUS_BYTES 512 /* a worker's answer: i32 status, then its error message */

struct tp_mp {
  struct backend *be;
  struct model *m;
  struct rdv *r;
  struct watchdog *wd;
  int rank, world;
  atomic_int failed;       /* set once, by the thread that failed the group */
  char why[1024];          /* the failure, for every later call */
  unsigned char *status;   /* (world, TP_MP_STATUS_BYTES) rank 0: the workers' answers */
  int cpu;                 /* the CPU backend: the all-reduce over the rendezvous sockets */
  unsigned char id[BACKEND_COMM_ID_BYTES]; /* the communicator id, from rank 0 */
  char master[300];
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static uint64_t fnv_int(uint64_t h, int64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)((uint64_t)v >> (8 * i));
  return fnv(h, b, 8);
}

static uint64_t fnv_float(uint64_t h, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return fnv_int(h, u);
}

uint64_t tp_mp_config_hash(const struct model_config *c, const char *isq, const char *backend_name, int world) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv(h, "pagoda-tp-1", 11);
  h = fnv(h, c->arch, strnlen(c->arch, sizeof c->arch));
  const int64_t ints[] = {c->vocab_size, c->dim,        c->n_layers,        c->n_heads,      c->n_kv_heads,
                          c->head_dim,   c->ffn_dim,    c->max_seq_len,     c->rope_dim,     c->tie_embeddings,
                          c->qkv_bias,   c->n_experts,  c->n_experts_used,  c->weight_dtype, c->sliding_window,
                          c->rope_scaling, world};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
    h = fnv_int(h, ints[i]);
  h = fnv_float(fnv_float(h, c->rope_theta), c->rms_eps);
  h = fnv(h, "|", 1);
  if (isq)
    h = fnv(h, isq, strlen(isq));
  h = fnv(h, "|", 1);
  return fnv(h, backend_name, strlen(backend_name));
}

/* Records the group's failure once (WHY), aborts the communicator and shuts the sockets, so
 * that every rank's blocked call returns. */
static void group_fail(struct tp_mp *mp, const char *why) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&mp->failed, &expected, 1))
    return;
  snprintf(mp->why, sizeof mp->why, "%s", why);
  if (mp->be->ops->comm_abort)
    mp->be->ops->comm_abort(mp->be);
  rdv_abort(mp->r);
}

/* The error of a failed call: the watchdog's lost rank when it saw one (the sockets it shut
 * make every other error a consequence), else the call's own. */
static int fail_call(struct tp_mp *mp, const char *what) {
  char why[1024];
  if (mp->wd && watchdog_lost_rank(mp->wd) != -1)
    snprintf(why, sizeof why, "%s", watchdog_message(mp->wd));
  else if (atomic_load(&mp->failed))
    snprintf(why, sizeof why, "%s", mp->why);
  else
    snprintf(why, sizeof why, "%s", what);
  group_fail(mp, why);
  return ERR("%s", why);
}

int tp_mp_check(struct tp_mp *mp) {
  if (mp->wd && watchdog_lost_rank(mp->wd) != -1)
    return fail_call(mp, "");
  if (atomic_load(&mp->failed))
    return ERR("%s", mp->why);
  return 0;
}

static int wd_comm_check(void *user) {
  struct tp_mp *mp = user;
  return mp->be->ops->comm_check ? mp->be->ops->comm_check(mp->be) : 0;
}

static void wd_on_lost(int rank, void *user) {
  struct tp_mp *mp = user;
  if (rank >= 0)
    log_error("tensor-parallel rank %d lost (its process exited or the network failed); stopping the group", rank);
  else
    log_error("tensor-parallel communicator failed (%s); stopping the group", err_last());
  if (mp->be->ops->comm_abort)
    mp->be->ops->comm_abort(mp->be);
}

/* Rank 0's model calls: sent to every worker, then run here; the workers' statuses after a
 * call other than a forward. */
static int mirror(struct model *m, const struct step_msg *c, float *logits, void *user) {
  struct tp_mp *mp = user;
  if (tp_mp_check(mp))
    return -1;
  unsigned char *buf;
  size_t len;
  if (step_encode(c->op, c->args, c->op == STEP_FORWARD ? &c->batch : NULL, c->src, c->dst, &buf, &len))
    return -1;
  int rc = step_send(mp->r, buf, len, TP_MP_IO_TIMEOUT_S);
  free(buf);
  if (rc)
    return fail_call(mp, err_last());
  if (model_run_call(m, c, logits))
    return fail_call(mp, err_last());
  if (c->op == STEP_FORWARD)
    return 0;
  unsigned char mine[TP_MP_STATUS_BYTES] = {0};
  if (rdv_gather(mp->r, mine, mp->status, TP_MP_STATUS_BYTES, TP_MP_IO_TIMEOUT_S))
    return fail_call(mp, err_last());
  for (int k = 1; k < mp->world; k++) {
    unsigned char *s = mp->status + (size_t)k * TP_MP_STATUS_BYTES;
    if (s[0] || s[1] || s[2] || s[3]) {
      char why[1024];
      s[TP_MP_STATUS_BYTES - 1] = 0;
      snprintf(why, sizeof why, "tensor-parallel rank %d: %s", k, (const char *)s + 4);
      return fail_call(mp, why);
    }
  }
  return 0;
}

struct tp_mp *tp_mp_join(struct backend *be, const char *master, int rank, int world, uint64_t config_hash,
                         double timeout_s) {
  struct tp_mp *mp = calloc(1, sizeof *mp);
  if (!mp || !(mp->status = malloc((size_t)world * TP_MP_STATUS_BYTES))) {
    free(mp);
    ERR("out of memory");
    return NULL;
  }
  mp->be = be;
  mp->rank = rank;
  mp->world = world;
  atomic_init(&mp->failed, 0);
  mp->cpu = !strcmp(be->ops->name, "cpu");
  if (!mp->cpu && (!be->ops->comm_id || !be->ops->comm_init || !be->ops->all_reduce_sum)) {
    ERR("--tp-world %d: the %s backend of this build has no collectives (the CUDA backend needs NCCL at build "
        "time: see docs/distributed.md)", world, be->ops->name);
    goto fail;
  }
  if (!mp->cpu && rank == 0 && be->ops->comm_id(be, mp->id))
    goto fail;
  if (rdv_join(master, rank, world, config_hash, mp->id, sizeof mp->id, timeout_s, &mp->r))
    goto fail;
  snprintf(mp->master, sizeof mp->master, "%s", master);
  return mp;
fail:
  tp_mp_free(mp);
  return NULL;
}

/* Every rank's OK (a zero status) or error: rank 0 gathers them and sends every rank the first
 * failure by rank, so all return the same. */
static int agree(struct tp_mp *mp, int ok) {
  unsigned char s[TP_MP_STATUS_BYTES] = {0};
  if (!ok) {
    s[0] = 1;
    snprintf((char *)s + 4, TP_MP_STATUS_BYTES - 4, "%s", err_last());
  }
  unsigned char verdict[TP_MP_STATUS_BYTES] = {0};
  if (rdv_gather(mp->r, s, mp->status, TP_MP_STATUS_BYTES, TP_MP_IO_TIMEOUT_S))
    return -1;
  if (mp->rank == 0)
    for (int k = 0; k < mp->world; k++) {
      unsigned char *sk = mp->status + (size_t)k * TP_MP_STATUS_BYTES;
      if (sk[0]) {
        sk[TP_MP_STATUS_BYTES - 1] = 0;
        verdict[0] = 1;
        snprintf((char *)verdict + 4, TP_MP_STATUS_BYTES - 4, "tensor-parallel rank %d: %s", k, (char *)sk + 4);
        break;
      }
    }
  if (rdv_broadcast(mp->r, verdict, sizeof verdict, TP_MP_IO_TIMEOUT_S))
    return -1;
  verdict[TP_MP_STATUS_BYTES - 1] = 0;
  return verdict[0] ? ERR("%s", (char *)verdict + 4) : 0;
}

int tp_mp_start(struct tp_mp *mp, struct model *m) {
  mp->m = m;
  if (agree(mp, m != NULL))
    return fail_call(mp, err_last());
  struct backend *be = mp->be;
  int rc = mp->cpu ? cpu_comm_attach_rdv(be, mp->r) : be->ops->comm_init(be, mp->id, mp->rank, mp->world);
  if (agree(mp, rc == 0))
    return fail_call(mp, err_last());
  if (!(mp->wd = watchdog_start(mp->r, TP_MP_WATCHDOG_MS, wd_comm_check, wd_on_lost, mp)))
    return fail_call(mp, err_last());
  if (mp->rank == 0)
    model_set_mirror(m, mirror, mp);
  log_info("tensor parallelism: rank %d of %d processes joined through %s (%s; watchdog every %d ms)", mp->rank,
           mp->world, mp->master, mp->cpu ? "all-reduce over the rendezvous sockets" : "the backend's communicator",
           TP_MP_WATCHDOG_MS);
  return 0;
}

int tp_mp_worker_loop(struct tp_mp *mp) {
  for (;;) {
    int w;
    while ((w = rdv_wait_message(mp->r, 1000)) == 0)
      ;
    struct step_msg c;
    if (w < 0 || step_recv(mp->r, &c, TP_MP_IO_TIMEOUT_S))
      return fail_call(mp, err_last());
    if (c.op == STEP_QUIT) {
      step_msg_free(&c);
      watchdog_stop(mp->wd); /* rank 0 closes its sockets after the barrier: not a lost rank */
      mp->wd = NULL;
      rdv_barrier(mp->r, 10.0);
      return 0;
    }
    int rc = model_run_call(mp->m, &c, NULL);
    enum step_op op = c.op;
    step_msg_free(&c);
    if (op == STEP_FORWARD) {
      if (rc) /* its collectives cannot be finished: the group ends */
        return fail_call(mp, err_last());
      continue;
    }
    unsigned char s[TP_MP_STATUS_BYTES] = {0};
    if (rc) {
      s[0] = 1;
      snprintf((char *)s + 4, TP_MP_STATUS_BYTES - 4, "%s", err_last());
    }
    if (rdv_gather(mp->r, s, NULL, TP_MP_STATUS_BYTES, TP_MP_IO_TIMEOUT_S))
      return fail_call(mp, err_last());
  }
}

void tp_mp_stop(struct tp_mp *mp) {
  if (!mp)
    return;
  watchdog_stop(mp->wd);
  mp->wd = NULL;
  if (mp->rank != 0 || atomic_load(&mp->failed) || !mp->m)
    return;
  unsigned char *buf;
  size_t len;
  if (step_encode(STEP_QUIT, NULL, NULL, NULL, NULL, &buf, &len) == 0) {
    if (step_send(mp->r, buf, len, 10.0) == 0)
      rdv_barrier(mp->r, 10.0);
    free(buf);
  }
  model_set_mirror(mp->m, NULL, NULL);
}

void tp_mp_free(struct tp_mp *mp) {
  if (!mp)
    return;
  watchdog_stop(mp->wd);
  if (mp->r)
    rdv_close(mp->r);
  free(mp->status);
  free(mp);
}
