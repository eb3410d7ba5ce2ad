/* watchdog.h - notices a lost rank of a multi-process tensor-parallel group.
 *
 * One thread per process polls rdv_dead_peer (and, when given, the backend's comm_check) every
 * PERIOD_MS. On the first lost rank it records "tensor-parallel rank R lost (...)" , calls
 * ON_LOST(rank, USER) once (the engine passes ops->comm_abort there, so NCCL collectives stop),
 * then rdv_abort's the group's sockets, so every call blocked in the TCP transport returns -1 at
 * once instead of hanging. It then stops polling. Invariant: ON_LOST runs at most once, on the
 * watchdog's thread, before watchdog_lost_rank reports the rank. */
#ifndef PAGODA_WATCHDOG_H
#define PAGODA_WATCHDOG_H

struct rdv;
struct watchdog;

/* COMM_CHECK (may be NULL) returns 0 while the communicator is healthy, else -1 with err_last()
 * set; its failure is reported as rank -2 ("the communicator"). NULL with err_last() set. */
struct watchdog *watchdog_start(struct rdv *r, int period_ms, int (*comm_check)(void *user),
                                void (*on_lost)(int rank, void *user), void *user);
/* -1 while all ranks are alive; else the lost rank (-2: comm_check failed). */
int watchdog_lost_rank(struct watchdog *w);
/* The sentence recorded when a rank was lost ("" before). */
const char *watchdog_message(struct watchdog *w);
/* Stops the thread (within PERIOD_MS) and frees W; the rdv stays the caller's. NULL: nothing. */
void watchdog_stop(struct watchdog *w);

#endif
