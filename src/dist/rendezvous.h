/* rendezvous.h - the TCP rendezvous of a multi-process tensor-parallel group.
 *
 * One process per GPU, possibly on several hosts, started with --tp-rank R --tp-world W
 * --tp-master HOST:PORT (as torchrun's RANK / WORLD_SIZE / MASTER_ADDR:MASTER_PORT). Before NCCL
 * can build its communicator every rank needs the same opaque unique id, made by rank 0; this
 * module carries it. Afterwards the same sockets carry the CPU backend's cross-process all-reduce
 * and rank 0's broadcasts (rdv_all_reduce_sum, rdv_broadcast), and liveness.
 *
 * Protocol (all integers little-endian; version 1):
 *   rank r > 0 connects to HOST:PORT (retrying until the deadline: rank 0 may start later) and
 *   sends HELLO = "PGTP" u32 version, u32 rank, u32 world, u64 config_hash;
 *   rank 0 listens on HOST:PORT and collects one HELLO from each rank 1 .. W-1. It checks that
 *   every rank is in range and arrives once, and that world and config_hash (what the ranks must
 *   agree on: model, flags) equal its own; any disagreement ends the rendezvous on every rank with
 *   the same message. Then it answers each rank with REPLY = u32 status (0 ok), u32 length, and
 *   that many bytes: the payload when ok, else the error message.
 *   A connection whose first bytes are not a HELLO (a port scanner, a stray client) is closed
 *   and ignored; it does not take a rank's place.
 * Afterwards the sockets stay open: a rank that exits or dies closes its end, so the other side
 * sees end-of-file (rdv_dead_peer), which is how a group notices a lost rank without waiting on
 * a collective forever.
 *
 * Every call returns 0 or -1 with err_last() set to a sentence naming the rank, the address and
 * the flag to check. */
#ifndef PAGODA_RENDEZVOUS_H
#define PAGODA_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#define RDV_MAX_PAYLOAD 4096

struct rdv;

/* Joins the group as RANK of WORLD (1 <= WORLD <= 1024, 0 <= RANK < WORLD) through MASTER
 * ("host:port", "[v6addr]:port"). Rank 0 provides PAYLOAD (payload_len <= RDV_MAX_PAYLOAD bytes);
 * the other ranks receive it into PAYLOAD, which must hold payload_len bytes, and must pass the
 * same payload_len. TIMEOUT_S bounds the whole exchange. WORLD 1 returns at once. */
int rdv_join(const char *master, int rank, int world, uint64_t config_hash, void *payload, size_t payload_len,
             double timeout_s, struct rdv **out);

/* Waits until every rank has called rdv_barrier (or TIMEOUT_S passes, or a rank is lost). */
int rdv_barrier(struct rdv *r, double timeout_s);

/* Checks, without blocking longer than WAIT_MS, whether a peer is gone: returns the rank of a
 * peer whose socket reached end-of-file or failed (for a rank > 0 the only peer is rank 0), or -1
 * when all are alive. */
int rdv_dead_peer(struct rdv *r, int wait_ms);

/* The CPU backend's collective across processes (multi-process TP without NCCL), over the
 * rendezvous sockets: every rank passes its N floats; rank 0 gathers them, sums in rank order
 * (x0 + x1 + ... + x(W-1), element by element, exactly as the in-process cpu_all_reduce_sum, so the
 * results are bitwise equal) and sends the sum back; every rank ends with the sum in X. All ranks
 * must call it with the same N, in the same order relative to rdv_broadcast / rdv_barrier. A lost
 * rank (or rdv_abort) makes it return -1 naming the rank instead of waiting past TIMEOUT_S. */
int rdv_all_reduce_sum(struct rdv *r, float *x, size_t n, double timeout_s);

/* Rank 0 sends N bytes of BUF to every rank; the others receive them into BUF (the channel that
 * carries each step's batch to the workers). Same ordering rule and errors as above. */
int rdv_broadcast(struct rdv *r, void *buf, size_t n, double timeout_s);

/* Every rank > 0 sends N bytes of MINE to rank 0, which gets rank k's bytes at ALL + k * N
 * (its own MINE copied to ALL); ALL is only written on rank 0 (it may be NULL elsewhere). The
 * workers' status after a model call (src/dist/mp.c). Same ordering rule and errors as above. */
int rdv_gather(struct rdv *r, const void *mine, void *all, size_t n, double timeout_s);

/* A rank > 0, between messages: waits up to WAIT_MS for rank 0 to send something. 1: bytes are
 * waiting; 0: nothing yet; -1 with err_last() set: rank 0's socket reached end-of-file or failed
 * (it exited, or the group was aborted). Rank 0 and world 1: -1. */
int rdv_wait_message(struct rdv *r, int wait_ms);

int rdv_rank(const struct rdv *r);
int rdv_world(const struct rdv *r);

/* Shuts down every socket of R (safe from another thread, e.g. the watchdog): calls blocked in
 * R return -1 at once, and the peers see end-of-file. R must still be closed with rdv_close. */
void rdv_abort(struct rdv *r);
/* rdv_abort after LOST_RANK was found lost (the watchdog): calls that the abort breaks then name
 * LOST_RANK, not the live peer whose socket they were using. */
void rdv_abort_lost(struct rdv *r, int lost_rank);

void rdv_close(struct rdv *r);

/* Splits "host:port" / "[v6]:port" into HOST (cap bytes) and PORT; -1 with err_last() set when
 * it is not of that form or the port is not in 1..65535. */
int rdv_parse_address(const char *addr, char *host, size_t cap, int *port);

#endif
