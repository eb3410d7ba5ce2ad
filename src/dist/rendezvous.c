/* rendezvous.c - see rendezvous.h for the protocol. Plain blocking sockets driven by poll() with a
 * deadline, so that no call can wait longer than its timeout. */
#define _POSIX_C_SOURCE 200809L
#include "dist/rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

#define RDV_MAGIC "PGTP"
#define RDV_VERSION 1u
#define RDV_HELLO_BYTES 24 /* magic, version, rank, world, config_hash */
#define RDV_BARRIER_BYTE 'B'

struct rdv {
  int rank, world;
  atomic_int lost; /* rdv_abort_lost's rank, else -1: what a call that the abort broke names */
  int *fds; /* rank 0: fds[r] for r = 1 .. world-1; other ranks: fds[0] = the socket to rank 0 */
  char master[300];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ms_left(double deadline) {
  double left = deadline - now_s();
  return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u64(unsigned char *p, uint64_t v) {
  put_u32(p, (uint32_t)v);
  put_u32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get_u64(const unsigned char *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* Reads exactly N bytes before DEADLINE: 0, or -1 on EOF / error / timeout (errno = ETIMEDOUT
 * for the timeout, 0 for EOF). */
static int read_full(int fd, void *buf, size_t n, double deadline) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, ms_left(deadline));
    if (rc == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    if (rc < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
    if (k == 0) {
      errno = 0;
      return -1;
    }
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      return -1;
    }
    got += (size_t)k;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t k = send(fd, (const char *)buf + put, n - put, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    put += (size_t)k;
  }
  return 0;
}

static const char *io_reason(void) { return errno == ETIMEDOUT ? "timed out" : errno ? strerror(errno) : "connection closed"; }

int rdv_parse_address(const char *addr, char *host, size_t cap, int *port) {
  const char *colon;
  size_t hl;
  if (!addr || !*addr)
    return ERR("--tp-master: empty address (expected host:port)");
  if (addr[0] == '[') {
    const char *end = strchr(addr, ']');
    if (!end || end[1] != ':')
      return ERR("--tp-master '%s': expected [ipv6-address]:port", addr);
    hl = (size_t)(end - addr - 1);
    colon = end + 1;
    addr++;
  } else {
    colon = strrchr(addr, ':');
    if (!colon || strchr(addr, ':') != colon)
      return ERR("--tp-master '%s': expected host:port (write an IPv6 address as [addr]:port)", addr);
    hl = (size_t)(colon - addr);
  }
  if (hl == 0 || hl >= cap)
    return ERR("--tp-master: the host part of '%s' is empty or longer than %zu bytes", addr, cap - 1);
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || errno || p < 1 || p > 65535)
    return ERR("--tp-master '%s': the port must be a number in 1..65535", addr);
  memcpy(host, addr, hl);
  host[hl] = '\0';
  *port = (int)p;
  return 0;
}

static struct addrinfo *resolve(const char *master, int passive) {
  char host[256], port_s[16];
  int port = 0;
  if (rdv_parse_address(master, host, sizeof host, &port))
    return NULL;
  snprintf(port_s, sizeof port_s, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
  struct addrinfo *ai = NULL;
  int rc = getaddrinfo(host, port_s, &hints, &ai);
  if (rc != 0) {
    ERR("--tp-master %s: cannot resolve '%s': %s", master, host, gai_strerror(rc));
    return NULL;
  }
  return ai;
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0's listening socket on MASTER. */
static int listen_on(const char *master) {
  struct addrinfo *ai = resolve(master, 1);
  if (!ai)
    return -1;
  int fd = -1, err = 0;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  if (fd < 0)
    ERR("--tp-master %s: rank 0 cannot listen there: %s (is another group using the port? pick "
        "another --tp-master port)", master, strerror(err));
  return fd;
}

/* A rank > 0's connection to MASTER, retried until DEADLINE (rank 0 may not listen yet). */
static int connect_to(const char *master, int rank, double deadline) {
  int last = 0;
  for (;;) {
    struct addrinfo *ai = resolve(master, 0);
    if (!ai)
      return -1;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last = errno;
        continue;
      }
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        freeaddrinfo(ai);
        set_nodelay(fd);
        return fd;
      }
      last = errno;
      close(fd);
    }
    freeaddrinfo(ai);
    if (now_s() >= deadline)
      break;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return ERR("--tp-rank %d: cannot reach rank 0 at --tp-master %s before the timeout: %s (is rank 0 "
             "running, and the address reachable from this host?)", rank, master, strerror(last));
}

static int send_reply(int fd, uint32_t status, const void *data, size_t len) {
  unsigned char h[8];
  put_u32(h, status);
  put_u32(h + 4, (uint32_t)len);
  return write_full(fd, h, 8) || write_full(fd, data, len) ? -1 : 0;
}

static void rdv_free(struct rdv *r) {
  if (!r)
    return;
  int n = r->rank == 0 ? r->world : 1;
  for (int i = 0; i < n; i++)
    if (r->fds[i] >= 0)
      close(r->fds[i]);
  free(r->fds);
  free(r);
}

/* Rank 0: accepts HELLOs until every rank is in, then replies. */
static int join_master(struct rdv *r, uint64_t hash, const void *payload, size_t len, double deadline) {
  int lfd = listen_on(r->master);
  if (lfd < 0)
    return -1;
  int joined = 0, rc = 0;
  char why[1024] = "";
  while (joined < r->world - 1) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    int prc = poll(&p, 1, ms_left(deadline));
    if (prc < 0 && errno == EINTR)
      continue;
    if (prc <= 0) {
      char missing[256] = "";
      size_t off = 0;
      for (int i = 1; i < r->world && off + 12 < sizeof missing; i++)
        if (r->fds[i] < 0)
          off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d", off ? ", " : "", i);
      snprintf(why, sizeof why, "rank(s) %s did not join --tp-master %s before the timeout (%d of %d ranks in)",
               missing, r->master, joined + 1, r->world);
      rc = -1;
      break;
    }
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
      continue;
    set_nodelay(fd);
    unsigned char h[RDV_HELLO_BYTES];
    /* a stray connection gets a short grace period to speak, then is dropped */
    double hd = now_s() + 5.0 < deadline ? now_s() + 5.0 : deadline;
    if (read_full(fd, h, sizeof h, hd) || memcmp(h, RDV_MAGIC, 4) != 0 || get_u32(h + 4) != RDV_VERSION) {
      log_warn("--tp-master %s: ignored a connection that did not speak the rendezvous protocol", r->master);
      close(fd);
      continue;
    }
    uint32_t rank = get_u32(h + 8), world = get_u32(h + 12);
    uint64_t their = get_u64(h + 16);
    if ((int)world != r->world)
      snprintf(why, sizeof why, "rank %u was started with --tp-world %u, rank 0 with %d", rank, world, r->world);
    else if (rank == 0 || rank >= world)
      snprintf(why, sizeof why, "a process joined with --tp-rank %u, outside 1..%d", rank, r->world - 1);
    else if (r->fds[rank] >= 0)
      snprintf(why, sizeof why, "two processes joined as --tp-rank %u", rank);
    else if (their != hash)
      snprintf(why, sizeof why, "rank %u runs another model or other engine flags than rank 0 (configuration "
               "hash %016llx, rank 0 %016llx)", rank, (unsigned long long)their, (unsigned long long)hash);
    if (why[0]) {
      send_reply(fd, 1, why, strlen(why));
      close(fd);
      rc = -1;
      break;
    }
    r->fds[rank] = fd;
    joined++;
  }
  close(lfd);
  for (int i = 1; i < r->world; i++) {
    if (r->fds[i] < 0)
      continue;
    /* a rank already answered when a later send fails learns it at its first barrier or
     * rdv_dead_peer: rank 0 closes every socket when it fails */
    int bad = rc ? send_reply(r->fds[i], 1, why, strlen(why)) : send_reply(r->fds[i], 0, payload, len);
    if (bad && !rc) {
      snprintf(why, sizeof why, "cannot send to rank %d: %s", i, strerror(errno));
      rc = -1;
    }
  }
  return rc ? ERR("tensor-parallel rendezvous failed: %s", why) : 0;
}

/* Rank > 0: HELLO, then the reply. */
static int join_worker(struct rdv *r, uint64_t hash, void *payload, size_t len, double deadline) {
  int fd = connect_to(r->master, r->rank, deadline);
  if (fd < 0)
    return -1;
  r->fds[0] = fd;
  unsigned char h[RDV_HELLO_BYTES];
  memcpy(h, RDV_MAGIC, 4);
  put_u32(h + 4, RDV_VERSION);
  put_u32(h + 8, (uint32_t)r->rank);
  put_u32(h + 12, (uint32_t)r->world);
  put_u64(h + 16, hash);
  if (write_full(fd, h, sizeof h))
    return ERR("--tp-rank %d: cannot send to rank 0 at %s: %s", r->rank, r->master, strerror(errno));
  for (;;) { /* a barrier byte of a previous group cannot come before the reply; read the header */
    unsigned char rh[8];
    if (read_full(fd, rh, 8, deadline))
      return ERR("--tp-rank %d: no answer from rank 0 at %s: %s (did every rank start?)", r->rank, r->master,
                 io_reason());
    uint32_t status = get_u32(rh), n = get_u32(rh + 4);
    if (n > RDV_MAX_PAYLOAD + 1024)
      return ERR("--tp-rank %d: rank 0 at %s sent a malformed reply (%u bytes)", r->rank, r->master, n);
    char buf[RDV_MAX_PAYLOAD + 1025];
    if (read_full(fd, buf, n, deadline))
      return ERR("--tp-rank %d: reply from rank 0 cut short: %s", r->rank, io_reason());
    if (status != 0) {
      buf[n] = '\0';
      return ERR("tensor-parallel rendezvous failed: %s", buf);
    }
    if (n != len)
      return ERR("--tp-rank %d: rank 0 sent %u bytes of payload, expected %zu (mismatched builds?)", r->rank, n, len);
    memcpy(payload, buf, len);
    return 0;
  }
}

int rdv_join(const char *master, int rank, int world, uint64_t config_hash, void *payload, size_t payload_len,
             double timeout_s, struct rdv **out) {
  *out = NULL;
  if (world < 1 || world > 1024)
    return ERR("--tp-world %d: must be in 1..1024", world);
  if (rank < 0 || rank >= world)
    return ERR("--tp-rank %d: must be in 0..%d for --tp-world %d", rank, world - 1, world);
  if (payload_len > RDV_MAX_PAYLOAD)
    return ERR("rendezvous payload of %zu bytes is above %d", payload_len, RDV_MAX_PAYLOAD);
  if (!master || strlen(master) >= sizeof((struct rdv *)0)->master)
    return ERR("--tp-master: missing or too long");
  struct rdv *r = calloc(1, sizeof *r);
  int n = rank == 0 ? world : 1;
  if (!r || !(r->fds = malloc(sizeof(int) * (size_t)n))) {
    free(r);
    return ERR("out of memory");
  }
  for (int i = 0; i < n; i++)
    r->fds[i] = -1;
  r->rank = rank;
  r->world = world;
  atomic_init(&r->lost, -1);
  snprintf(r->master, sizeof r->master, "%s", master);
  double deadline = now_s() + timeout_s;
  int rc = world == 1 ? 0
           : rank == 0 ? join_master(r, config_hash, payload, payload_len, deadline)
                       : join_worker(r, config_hash, payload, payload_len, deadline);
  if (rc) {
    rdv_free(r);
    return -1;
  }
  *out = r;
  return 0;
}

int rdv_barrier(struct rdv *r, double timeout_s) {
  if (r->world == 1)
    return 0;
  double deadline = now_s() + timeout_s;
  unsigned char b = RDV_BARRIER_BYTE;
  if (r->rank != 0) {
    if (write_full(r->fds[0], &b, 1) || read_full(r->fds[0], &b, 1, deadline) || b != RDV_BARRIER_BYTE)
      return ERR("--tp-rank %d: barrier with rank 0 failed: %s (rank 0 exited?)", r->rank, io_reason());
    return 0;
  }
  for (int i = 1; i < r->world; i++)
    if (read_full(r->fds[i], &b, 1, deadline) || b != RDV_BARRIER_BYTE)
      return ERR("barrier: rank %d did not arrive: %s (did it exit?)", i, io_reason());
  for (int i = 1; i < r->world; i++)
    if (write_full(r->fds[i], &b, 1))
      return ERR("barrier: cannot release rank %d: %s", i, strerror(errno));
  return 0;
}

/* The rank a failed transfer with rank K names: the rank whose loss made someone abort the group
 * (rdv_abort_lost), when that is known, since the abort breaks the transfers with the live ranks
 * too; else K. */
static int culprit(struct rdv *r, int k) {
  int lost = atomic_load(&r->lost);
  return lost >= 0 ? lost : k;
}

int rdv_dead_peer(struct rdv *r, int wait_ms) {
  if (r->world == 1)
    return -1;
  int n = r->rank == 0 ? r->world - 1 : 1;
  struct pollfd p[1024];
  if (n < 1 || n > 1024)
    return -1;
  for (int i = 0; i < n; i++)
    p[i] = (struct pollfd){.fd = r->rank == 0 ? r->fds[i + 1] : r->fds[0], .events = POLLIN};
  int rc = poll(p, (nfds_t)n, wait_ms);
  if (rc <= 0)
    return -1;
  for (int i = 0; i < n; i++) {
    if (!p[i].revents)
      continue;
    char c;
    ssize_t k = recv(p[i].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) || (p[i].revents & (POLLERR | POLLHUP)))
      return r->rank == 0 ? i + 1 : 0;
  }
  return -1;
}

/* Chunks of the gather / scatter: bounded so a large tensor never needs a second full copy. */
#define RDV_CHUNK_FLOATS 16384

int rdv_all_reduce_sum(struct rdv *r, float *x, size_t n, double timeout_s) {
  if (r->world == 1 || n == 0)
    return 0;
  double deadline = now_s() + timeout_s;
  if (r->rank != 0) {
    if (write_full(r->fds[0], x, n * sizeof(float)))
      return ERR("--tp-rank %d: all-reduce: cannot send to rank 0: %s (rank 0 exited?)", r->rank, strerror(errno));
    if (read_full(r->fds[0], x, n * sizeof(float), deadline))
      return ERR("--tp-rank %d: all-reduce: no result from rank 0: %s (rank 0 exited?)", r->rank, io_reason());
    return 0;
  }
  float *tmp = malloc(sizeof(float) * RDV_CHUNK_FLOATS);
  if (!tmp)
    return ERR("out of memory");
  int rc = 0;
  for (size_t lo = 0; lo < n && !rc; lo += RDV_CHUNK_FLOATS) {
    size_t m = n - lo < RDV_CHUNK_FLOATS ? n - lo : RDV_CHUNK_FLOATS;
    for (int k = 1; k < r->world; k++) { /* rank order: x = ((x0 + x1) + x2) + ... as cpu_comm.c */
      if (read_full(r->fds[k], tmp, m * sizeof(float), deadline)) {
        rc = ERR("all-reduce: tensor-parallel rank %d lost: %s (did it exit?)", culprit(r, k), io_reason());
        break;
      }
      for (size_t i = 0; i < m; i++)
        x[lo + i] += tmp[i];
    }
  }
  free(tmp);
  for (int k = 1; k < r->world && !rc; k++)
    if (write_full(r->fds[k], x, n * sizeof(float)))
      rc = ERR("all-reduce: cannot send the sum to tensor-parallel rank %d: %s", k, strerror(errno));
  return rc;
}

int rdv_broadcast(struct rdv *r, void *buf, size_t n, double timeout_s) {
  if (r->world == 1 || n == 0)
    return 0;
  if (r->rank != 0) {
    if (read_full(r->fds[0], buf, n, now_s() + timeout_s))
      return ERR("--tp-rank %d: broadcast: nothing from rank 0: %s (rank 0 exited?)", r->rank, io_reason());
    return 0;
  }
  for (int k = 1; k < r->world; k++)
    if (write_full(r->fds[k], buf, n))
      return ERR("broadcast: tensor-parallel rank %d lost: %s (did it exit?)", culprit(r, k), strerror(errno));
  return 0;
}

int rdv_gather(struct rdv *r, const void *mine, void *all, size_t n, double timeout_s) {
  if (r->rank == 0 && all && n)
    memcpy(all, mine, n);
  if (r->world == 1 || n == 0)
    return 0;
  double deadline = now_s() + timeout_s;
  if (r->rank != 0) {
    if (write_full(r->fds[0], mine, n))
      return ERR("--tp-rank %d: cannot send to rank 0: %s (rank 0 exited?)", r->rank, strerror(errno));
    return 0;
  }
  for (int k = 1; k < r->world; k++)
    if (read_full(r->fds[k], (char *)all + (size_t)k * n, n, deadline))
      return ERR("tensor-parallel rank %d lost: %s (did it exit?)", culprit(r, k), io_reason());
  return 0;
}

int rdv_wait_message(struct rdv *r, int wait_ms) {
  if (r->rank == 0 || r->world == 1)
    return ERR("rdv_wait_message: only a rank > 0 waits for rank 0");
  struct pollfd p = {.fd = r->fds[0], .events = POLLIN};
  int rc = poll(&p, 1, wait_ms);
  if (rc == 0 || (rc < 0 && errno == EINTR))
    return 0;
  if (rc < 0)
    return ERR("--tp-rank %d: waiting for rank 0: %s", r->rank, strerror(errno));
  char c;
  ssize_t k = recv(r->fds[0], &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (k == 1)
    return 1;
  if (k < 0 && (errno == EAGAIN || errno == EINTR))
    return 0;
  return ERR("--tp-rank %d: rank 0 at %s is gone: %s (it exited, or the group was stopped)", r->rank, r->master,
             k == 0 ? "connection closed" : strerror(errno));
}

int rdv_rank(const struct rdv *r) { return r->rank; }
int rdv_world(const struct rdv *r) { return r->world; }

void rdv_abort(struct rdv *r) { rdv_abort_lost(r, -1); }

void rdv_abort_lost(struct rdv *r, int lost_rank) {
  if (!r)
    return;
  if (lost_rank >= 0) {
    int none = -1;
    atomic_compare_exchange_strong(&r->lost, &none, lost_rank);
  }
  int n = r->rank == 0 ? r->world : 1;
  for (int i = 0; i < n; i++)
    if (r->fds[i] >= 0)
      shutdown(r->fds[i], SHUT_RDWR);
}

void rdv_close(struct rdv *r) { rdv_free(r); }
