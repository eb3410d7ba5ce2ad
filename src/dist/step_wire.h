/* step_wire.h - the message rank 0 of a multi-process tensor-parallel group sends its workers for
 * every model call (the worker channel of docs/distributed.md): which call (model_forward,
 * model_copy_blocks, the workspace / cache allocations, free), its scalar arguments, and for a
 * forward the step's whole batch (struct batch, host arrays), so that a worker can run the same
 * call on its shard. It travels over the rendezvous sockets (rdv_broadcast, length first).
 *
 * Format (little-endian, version 1): "PGSW" u32 version, u32 op, i32 args[7], u32 num_ints, then
 * num_ints i32: for STEP_FORWARD the batch header (num_tokens T, num_seqs B, max_blocks_per_seq M,
 * max_seq_len, max_query_len, num_logits L) then input_ids (T), positions (T), slot_mapping (T),
 * query_start (B+1), seq_lens (B), block_tables (B*M), logits_idx (L); for STEP_COPY_BLOCKS
 * src (args[0]) then dst (args[0]); none for the others. step_decode checks every count against
 * the message length, so a malformed message is an error, never an out-of-bounds read. */
#ifndef PAGODA_STEP_WIRE_H
#define PAGODA_STEP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

struct rdv;

enum step_op {
  STEP_FORWARD = 1,
  STEP_COPY_BLOCKS,
  STEP_ALLOC_WORKSPACE,
  STEP_PROFILE,
  STEP_ALLOC_KV,
  STEP_ALLOC_CACHE,
  STEP_LOGITS_ROWS, /* a split vocabulary on a device: rows args[0] .. args[0] + args[1] (model_logits_rows) */
  STEP_QUIT,
  STEP_OP_END
};

#define STEP_NARGS 7

/* A decoded message; batch / src / dst point into the message's own storage. */
struct step_msg {
  enum step_op op;
  int32_t args[STEP_NARGS];
  struct batch batch;        /* STEP_FORWARD */
  const int32_t *src, *dst;  /* STEP_COPY_BLOCKS: args[0] pairs */
  int32_t *ints;             /* owned */
};

/* Encodes OP with ARGS (STEP_NARGS values; NULL: zeros) and, for STEP_FORWARD, BATCH, or for
 * STEP_COPY_BLOCKS, SRC / DST (args[0] each), into a malloc'ed buffer *OUT of *LEN bytes. */
int step_encode(enum step_op op, const int32_t *args, const struct batch *batch, const int32_t *src,
                const int32_t *dst, unsigned char **out, size_t *len);
/* Decodes BUF (LEN bytes) into *M (free with step_msg_free); -1 with err_last() naming what is
 * wrong. */
int step_decode(const unsigned char *buf, size_t len, struct step_msg *m);
void step_msg_free(struct step_msg *m);

/* Rank 0: sends LEN bytes of BUF to every worker, length first. */
int step_send(struct rdv *r, const unsigned char *buf, size_t len, double timeout_s);
/* A worker: receives one message into *M (at most STEP_MAX_BYTES); TIMEOUT_S bounds it. */
#define STEP_MAX_BYTES ((size_t)1 << 30)
int step_recv(struct rdv *r, struct step_msg *m, double timeout_s);

#endif
