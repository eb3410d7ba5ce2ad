/* mp.h - multi-process tensor parallelism: one process per rank (GPU), joined by the TCP
 * rendezvous (rendezvous.h), as torchrun's RANK / WORLD_SIZE / MASTER_ADDR:MASTER_PORT.
 *
 * Every process loads its own shard (model_load_rank), then tp_mp_join:
 *   - the rendezvous checks world, ranks and a configuration hash (tp_mp_config_hash: the shard
 *     shapes, so a rank started with another model or --isq is refused) and hands every rank
 *     rank 0's communicator id;
 *   - the communicator: on the CPU backend the all-reduce goes over the rendezvous sockets
 *     (cpu_comm_attach_rdv, rdv_all_reduce_sum); on others ops->comm_init with the id (NCCL,
 *     whose own transport then carries the collectives);
 *   - a watchdog thread (watchdog.h, every TP_MP_WATCHDOG_MS) notices a lost peer or a failed
 *     communicator, logs it naming the rank, aborts the communicator (ops->comm_abort) and shuts
 *     the sockets, so nothing waits on a dead rank;
 *   - on rank 0 the model's public calls are mirrored (model_set_mirror): each is encoded
 *     (step_wire.h) and sent to every worker, then run on rank 0's shard. After a call other
 *     than a forward each worker answers with its status, so a worker's failure (out of memory
 *     for its KV pool) is rank 0's error naming the rank. A forward has no answer: its
 *     collectives join the ranks, and a worker whose forward fails exits.
 * Ranks > 0 run tp_mp_worker_loop: receive a call, run it on the shard (model_run_call), until
 * rank 0 sends STEP_QUIT (tp_mp_stop). Any failure ends the group: the failing side aborts,
 * the others see end-of-file and fail naming the rank (docs/distributed.md). */
#ifndef PAGODA_MP_H
#define PAGODA_MP_H

#include <stdint.h>

#include "backend/backend.h"

struct model;
struct model_config;
struct tp_mp;

#define TP_MP_WATCHDOG_MS 100

/* FNV-1a over what every rank must agree on: the shard's shapes and dtypes, ISQ (NULL: none),
 * the backend's name and WORLD. */
uint64_t tp_mp_config_hash(const struct model_config *c, const char *isq, const char *backend_name, int world);

/* Joins the group as RANK of WORLD through MASTER (host:port) with BE: the rendezvous (TIMEOUT_S
 * bounds it) checks world, ranks and CONFIG_HASH before anything is loaded and hands out rank
 * 0's communicator id. NULL with err_last() set. */
struct tp_mp *tp_mp_join(struct backend *be, const char *master, int rank, int world, uint64_t config_hash,
                         double timeout_s);

/* Then every rank loads its shard and calls tp_mp_start with it (M, or NULL after a failed load
 * with err_last() set): the ranks agree first, so that one rank's failure is every rank's error
 * naming it ("tensor-parallel rank R: ..."); then the communicator, the watchdog, and on rank 0
 * the model's mirror. 0, or -1 with err_last() set (the group is then stopped). */
int tp_mp_start(struct tp_mp *mp, struct model *m);

/* A rank > 0: runs rank 0's calls until it says quit (0), or until the group fails (-1 with
 * err_last() naming the rank or the reason). */
int tp_mp_worker_loop(struct tp_mp *mp);

/* 0 while the group works; -1 with err_last() set once it failed (a lost rank, a failed call). */
int tp_mp_check(struct tp_mp *mp);

/* Every rank, before its model and backend are freed (the watchdog uses the backend): stops the
 * watchdog; on rank 0, when the group still works, also tells the workers to quit and waits
 * (briefly) until they have. NULL: nothing. */
void tp_mp_stop(struct tp_mp *mp);

/* Frees MP and closes its sockets; after the backend that borrowed them (the CPU backend's
 * all-reduce) is destroyed. NULL: nothing. */
void tp_mp_free(struct tp_mp *mp);

#endif
