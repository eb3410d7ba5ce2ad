/* cpu_comm.c - the CPU backend's collectives: ranks are threads of one process (the CPU reference
 * of tensor parallelism, which tests/c/test_tp_cpu.c compares against one rank). The id handed
 * around is a number naming a group in this process's registry; all_reduce_sum sums in rank
 * order, so every rank gets bitwise the same result. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "dist/rendezvous.h"

/* A collective over processes waits at most this long for the others; a lost rank is noticed
 * much sooner (end-of-file on its socket, or the watchdog's rdv_abort). */
#define CPU_RDV_TIMEOUT_S 600.0

#define CPU_COMM_MAX 64

struct cpu_comm {
  uint64_t id;           /* what cpu_comm_id handed out */
  struct cpu_comm *next; /* in the registry */
  pthread_mutex_t mu;
  pthread_barrier_t barrier;
  int world, refs;       /* refs: ranks joined and not yet freed */
  float *bufs[CPU_COMM_MAX];
};

/* The groups of this process by id, made by the first rank to join and freed by the last rank
 * to leave. An id is only a number, so one that nobody joins (a load refused before the ranks
 * met) costs nothing. */
static pthread_mutex_t comm_init_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cpu_comm *comm_groups;
static uint64_t comm_next_id = 1;

int cpu_comm_id(struct backend *be, void *id) {
  (void)be;
  pthread_mutex_lock(&comm_init_mu);
  uint64_t v = comm_next_id++;
  pthread_mutex_unlock(&comm_init_mu);
  memset(id, 0, BACKEND_COMM_ID_BYTES);
  memcpy(id, &v, sizeof v);
  return 0;
}

static void comm_unref(struct cpu_comm *c) {
  pthread_mutex_lock(&comm_init_mu);
  int last = --c->refs == 0;
  if (last)
    for (struct cpu_comm **p = &comm_groups; *p; p = &(*p)->next)
      if (*p == c) {
        *p = c->next;
        break;
      }
  pthread_mutex_unlock(&comm_init_mu);
  if (!last)
    return;
  pthread_barrier_destroy(&c->barrier);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int cpu_comm_init(struct backend *be, const void *id, int rank, int world) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  uint64_t v;
  memcpy(&v, id, sizeof v);
  if (world < 1 || world > CPU_COMM_MAX || rank < 0 || rank >= world)
    return ERR("comm_init: rank %d of %d (1..%d ranks)", rank, world, CPU_COMM_MAX);
  if (cb->comm)
    return ERR("comm_init: this backend already has a communicator");
  pthread_mutex_lock(&comm_init_mu);
  struct cpu_comm *c = comm_groups;
  while (c && c->id != v)
    c = c->next;
  if (!c && (c = calloc(1, sizeof *c)) != NULL) {
    c->id = v;
    c->world = world;
    pthread_mutex_init(&c->mu, NULL);
    pthread_barrier_init(&c->barrier, NULL, (unsigned)world);
    c->next = comm_groups;
    comm_groups = c;
  }
  int ok = c && c->world == world, group_world = c ? c->world : 0;
  if (ok)
    c->refs++;
  pthread_mutex_unlock(&comm_init_mu);
  if (!c)
    return ERR("out of memory");
  if (!ok)
    return ERR("comm_init: world %d, but the group was made for %d", world, group_world);
  cb->comm = c;
  cb->comm_rank = rank;
  pthread_barrier_wait(&c->barrier); /* every rank has joined */
  return 0;
}

/* Reduce-scatter then all-gather, in place: rank r sums slice r over every rank's buffer (in rank
 * order) into its own buffer, then copies the other slices from their owners. Between the
 * phases each rank writes only what no other rank reads. */
int cpu_all_reduce_sum(struct backend *be, void *x, size_t n) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  if (cb->rdv)
    return rdv_all_reduce_sum(cb->rdv, x, n, CPU_RDV_TIMEOUT_S);
  struct cpu_comm *c = cb->comm;
  if (!c)
    return ERR("all_reduce_sum before comm_init");
  int r = cb->comm_rank, W = c->world;
  c->bufs[r] = x;
  pthread_barrier_wait(&c->barrier);
  size_t lo = n * (size_t)r / (size_t)W, hi = n * (size_t)(r + 1) / (size_t)W;
  float *mine = x;
  for (size_t i = lo; i < hi; i++) {
    float s = c->bufs[0][i];
    for (int k = 1; k < W; k++)
      s += c->bufs[k][i];
    mine[i] = s;
  }
  pthread_barrier_wait(&c->barrier);
  for (int k = 0; k < W; k++) {
    if (k == r)
      continue;
    size_t klo = n * (size_t)k / (size_t)W, khi = n * (size_t)(k + 1) / (size_t)W;
    memcpy(mine + klo, c->bufs[k] + klo, (khi - klo) * sizeof(float));
  }
  pthread_barrier_wait(&c->barrier);
  return 0;
}

/* The vocabulary-parallel head's gather (backend.h). In one process rank 0 copies every rank's
 * columns straight from its buffer (published like all_reduce_sum's); the others wait until it
 * has, so their IN stays valid. Across processes the rendezvous carries only broadcasts and the
 * rank-order sum, so each rank writes its columns into a zeroed full-width buffer (rank 0: OUT,
 * the others: SCRATCH) and all-reduces it: every element is one rank's value plus zeros, which
 * the sum leaves unchanged (only a -0 logit would come back as +0). */
int cpu_gather_cols(struct backend *be, float *out, const float *in, float *scratch, int rows, int cols) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  if (rows < 0 || cols < 1)
    return ERR("gather_cols: %d rows of %d columns", rows, cols);
  if (cb->rdv) {
    int r = rdv_rank(cb->rdv), W = rdv_world(cb->rdv);
    float *full = r == 0 ? out : scratch;
    size_t wide = (size_t)W * (size_t)cols;
    if (!full)
      return ERR("gather_cols: no %s buffer on rank %d", r == 0 ? "output" : "scratch", r);
    memset(full, 0, sizeof(float) * wide * (size_t)rows);
    for (int t = 0; t < rows; t++)
      memcpy(full + (size_t)t * wide + (size_t)r * cols, in + (size_t)t * cols, sizeof(float) * (size_t)cols);
    return rdv_all_reduce_sum(cb->rdv, full, wide * (size_t)rows, CPU_RDV_TIMEOUT_S);
  }
  struct cpu_comm *c = cb->comm;
  if (!c)
    return ERR("gather_cols before comm_init");
  int r = cb->comm_rank, W = c->world;
  c->bufs[r] = (float *)in;
  pthread_barrier_wait(&c->barrier);
  if (r == 0) {
    size_t wide = (size_t)W * (size_t)cols;
    for (int t = 0; t < rows; t++)
      for (int k = 0; k < W; k++)
        memcpy(out + (size_t)t * wide + (size_t)k * cols, c->bufs[k] + (size_t)t * cols,
               sizeof(float) * (size_t)cols);
  }
  pthread_barrier_wait(&c->barrier);
  return 0;
}

void cpu_comm_free(struct backend *be) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  if (cb->comm)
    comm_unref(cb->comm);
  cb->comm = NULL;
  cb->rdv = NULL; /* borrowed */
}

int cpu_comm_attach_rdv(struct backend *be, struct rdv *r) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  if (!r)
    return ERR("comm_attach_rdv: no rendezvous");
  if (cb->comm || cb->rdv)
    return ERR("comm_attach_rdv: this backend already has a communicator");
  cb->rdv = r;
  return 0;
}

void cpu_comm_abort(struct backend *be) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  if (cb->rdv)
    rdv_abort(cb->rdv);
}
