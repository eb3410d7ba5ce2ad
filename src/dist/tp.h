/* tp.h - the host threads of single-process tensor parallelism: one thread per rank (GPU).
 *
 * Rank 0 is the calling thread (the engine's: scheduler, KV manager, prefix cache and sampling
 * all stay there); ranks 1 .. world-1 are worker threads made once by tp_group_create, each
 * bound for life to its rank (so its backend's device stays current on it). tp_group_run posts
 * one function to every rank at once and returns when all have finished it: the model fans a
 * step out this way (model_forward -> each rank enqueues its shard's ops on its own stream; the
 * collectives inside join the GPUs). See docs/distributed.md. */
#ifndef PAGODA_TP_H
#define PAGODA_TP_H

#define TP_MAX_WORLD 64

struct tp_group;

/* WORLD ranks (1 .. TP_MAX_WORLD); NULL with err_last() set. */
struct tp_group *tp_group_create(int world);
int tp_group_world(const struct tp_group *g);
/* Runs FN(rank, CTX) for every rank, rank 0 on the calling thread, the others on their workers,
 * and waits for all. 0 when every rank returned 0; else -1 with err_last() = "tensor-parallel
 * rank R: <that rank's error>" of the lowest failing rank. Not reentrant. */
int tp_group_run(struct tp_group *g, int (*fn)(int rank, void *ctx), void *ctx);
/* Ends the workers (after their current function). NULL: nothing. */
void tp_group_destroy(struct tp_group *g);

#endif
