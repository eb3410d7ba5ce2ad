/* step_wire.c - see step_wire.h. */
#include "dist/step_wire.h"

#include <stdlib.h>
#include <string.h>

#include "dist/rendezvous.h"
#include "util/log.h"

#define STEP_MAGIC "PGSW"
#define STEP_VERSION 2u /* 2: STEP_LOGITS_ROWS */
#define STEP_HEADER_BYTES (4 + 4 + 4 + 4 * STEP_NARGS + 4)
#define BATCH_HEADER_INTS 6

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_ints(unsigned char **p, const int32_t *v, size_t n) {
  for (size_t i = 0; i < n; i++, *p += 4)
    put_u32(*p, (uint32_t)v[i]);
}

int step_encode(enum step_op op, const int32_t *args, const struct batch *batch, const int32_t *src,
                const int32_t *dst, unsigned char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (op < STEP_FORWARD || op >= STEP_OP_END)
    return ERR("step_encode: unknown op %d", (int)op);
  int32_t a[STEP_NARGS] = {0};
  if (args)
    memcpy(a, args, sizeof a);
  size_t num_ints = 0;
  const struct batch *b = batch;
  if (op == STEP_FORWARD) {
    if (!b || b->num_tokens < 0 || b->num_seqs < 0 || b->max_blocks_per_seq < 0 || b->num_logits < 0)
      return ERR("step_encode: forward without a valid batch");
    num_ints = BATCH_HEADER_INTS + 3 * (size_t)b->num_tokens + 2 * (size_t)b->num_seqs + 1 +
             (size_t)b->num_seqs * (size_t)b->max_blocks_per_seq + (size_t)b->num_logits;
  } else if (op == STEP_COPY_BLOCKS) {
    if (a[0] < 0 || (a[0] > 0 && (!src || !dst)))
      return ERR("step_encode: copy_blocks of %d pairs without arrays", a[0]);
    num_ints = 2 * (size_t)a[0];
  }
  if (num_ints > (STEP_MAX_BYTES - STEP_HEADER_BYTES) / 4)
    return ERR("step_encode: message of %zu ints is above the limit", num_ints);
  size_t bytes = STEP_HEADER_BYTES + 4 * num_ints;
  unsigned char *buf = malloc(bytes), *p = buf;
  if (!buf)
    return ERR("out of memory");
  memcpy(p, STEP_MAGIC, 4);
  put_u32(p + 4, STEP_VERSION);
  put_u32(p + 8, (uint32_t)op);
  p += 12;
  put_ints(&p, a, STEP_NARGS);
  put_u32(p, (uint32_t)num_ints);
  p += 4;
  if (op == STEP_FORWARD) {
    int32_t h[BATCH_HEADER_INTS] = {b->num_tokens, b->num_seqs, b->max_blocks_per_seq, b->max_seq_len,
                                    b->max_query_len, b->num_logits};
    put_ints(&p, h, BATCH_HEADER_INTS);
    size_t T = (size_t)b->num_tokens, B = (size_t)b->num_seqs;
    put_ints(&p, b->input_ids, T);
    put_ints(&p, b->positions, T);
    put_ints(&p, b->slot_mapping, T);
    put_ints(&p, b->query_start, B + 1);
    put_ints(&p, b->seq_lens, B);
    put_ints(&p, b->block_tables, B * (size_t)b->max_blocks_per_seq);
    put_ints(&p, b->logits_idx, (size_t)b->num_logits);
  } else if (op == STEP_COPY_BLOCKS) {
    put_ints(&p, src, (size_t)a[0]);
    put_ints(&p, dst, (size_t)a[0]);
  }
  *out = buf;
  *len = bytes;
  return 0;
}

void step_msg_free(struct step_msg *m) {
  if (m) {
    free(m->ints);
    memset(m, 0, sizeof *m);
  }
}

int step_decode(const unsigned char *buf, size_t len, struct step_msg *m) {
  memset(m, 0, sizeof *m);
  if (len < STEP_HEADER_BYTES || memcmp(buf, STEP_MAGIC, 4) != 0)
    return ERR("tensor-parallel step message: not a step message (%zu bytes)", len);
  if (get_u32(buf + 4) != STEP_VERSION)
    return ERR("tensor-parallel step message: version %u, this build speaks %u (mixed builds across ranks?)",
               get_u32(buf + 4), STEP_VERSION);
  uint32_t op = get_u32(buf + 8);
  if (op < STEP_FORWARD || op >= STEP_OP_END)
    return ERR("tensor-parallel step message: unknown op %u", op);
  m->op = (enum step_op)op;
  for (int i = 0; i < STEP_NARGS; i++)
    m->args[i] = (int32_t)get_u32(buf + 12 + 4 * i);
  size_t num_ints = get_u32(buf + STEP_HEADER_BYTES - 4);
  if (len != STEP_HEADER_BYTES + 4 * num_ints)
    return ERR("tensor-parallel step message: %zu bytes, its header says %zu", len, STEP_HEADER_BYTES + 4 * num_ints);
  if (num_ints && !(m->ints = malloc(4 * num_ints)))
    return ERR("out of memory");
  for (size_t i = 0; i < num_ints; i++)
    m->ints[i] = (int32_t)get_u32(buf + STEP_HEADER_BYTES + 4 * i);
  const int32_t *v = m->ints;
  if (m->op == STEP_FORWARD) {
    if (num_ints < BATCH_HEADER_INTS)
      goto bad;
    int32_t T = v[0], B = v[1], M = v[2], L = v[5];
    if (T < 0 || B < 0 || M < 0 || L < 0)
      goto bad;
    size_t need = BATCH_HEADER_INTS + 3 * (size_t)T + 2 * (size_t)B + 1 + (size_t)B * (size_t)M + (size_t)L;
    if (need != num_ints)
      goto bad;
    struct batch *b = &m->batch;
    *b = (struct batch){.num_tokens = T, .num_seqs = B, .max_blocks_per_seq = M, .max_seq_len = v[3],
                        .max_query_len = v[4], .num_logits = L};
    v += BATCH_HEADER_INTS;
    b->input_ids = v, v += T;
    b->positions = v, v += T;
    b->slot_mapping = v, v += T;
    b->query_start = v, v += B + 1;
    b->seq_lens = v, v += B;
    b->block_tables = v, v += (size_t)B * M;
    b->logits_idx = v;
  } else if (m->op == STEP_COPY_BLOCKS) {
    if (m->args[0] < 0 || num_ints != 2 * (size_t)m->args[0])
      goto bad;
    m->src = v;
    m->dst = v + m->args[0];
  } else if (num_ints) {
    goto bad;
  }
  return 0;
bad:
  step_msg_free(m);
  return ERR("tensor-parallel step message: op %u: its counts do not match its %zu ints", op, num_ints);
}

int step_send(struct rdv *r, const unsigned char *buf, size_t len, double timeout_s) {
  unsigned char h[8];
  put_u32(h, (uint32_t)len);
  put_u32(h + 4, (uint32_t)((uint64_t)len >> 32));
  if (rdv_broadcast(r, h, sizeof h, timeout_s))
    return -1;
  return rdv_broadcast(r, (void *)buf, len, timeout_s);
}

int step_recv(struct rdv *r, struct step_msg *m, double timeout_s) {
  memset(m, 0, sizeof *m);
  unsigned char h[8];
  if (rdv_broadcast(r, h, sizeof h, timeout_s))
    return -1;
  uint64_t len = (uint64_t)get_u32(h) | (uint64_t)get_u32(h + 4) << 32;
  if (len > STEP_MAX_BYTES)
    return ERR("tensor-parallel step message of %llu bytes from rank 0: above %zu", (unsigned long long)len,
               STEP_MAX_BYTES);
  unsigned char *buf = malloc(len ? len : 1);
  if (!buf)
    return ERR("out of memory");
  int rc = rdv_broadcast(r, buf, len, timeout_s) ? -1 : step_decode(buf, len, m);
  free(buf);
  return rc;
}
