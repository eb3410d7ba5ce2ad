/* vocab.c - token table with an open-addressing (linear probing) text -> id index. */
#include "text/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

uint64_t vocab_hash(const char *s, size_t len) {
  /* FNV-1a then a final avalanche, so that the low bits used for the slot index are mixed. */
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < len; i++) {
    h ^= (uint8_t)s[i];
    h *= 1099511628211ULL;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

int vocab_init(struct vocab *v, int n) {
  memset(v, 0, sizeof *v);
  if (n <= 0 || n > (1 << 26))
    return ERR("vocabulary size %d out of range", n);
  v->n = n;
  uint32_t cap = 16;
  while (cap < (uint32_t)n * 2u)
    cap <<= 1;
  v->mask = cap - 1;
  v->text_off = malloc((size_t)n * sizeof *v->text_off);
  v->text_len = calloc((size_t)n, sizeof *v->text_len);
  v->type = calloc((size_t)n, 1);
  v->score = calloc((size_t)n, sizeof *v->score);
  v->slots = malloc((size_t)cap * sizeof *v->slots);
  v->arena_cap = (size_t)n * 8 + 64;
  v->arena = malloc(v->arena_cap);
  if (!v->text_off || !v->text_len || !v->type || !v->score || !v->slots || !v->arena) {
    vocab_free(v);
    return ERR("out of memory for a vocabulary of %d tokens", n);
  }
  for (int i = 0; i < n; i++)
    v->text_off[i] = UINT32_MAX;
  memset(v->slots, 0xff, (size_t)cap * sizeof *v->slots);
  return 0;
}

void vocab_free(struct vocab *v) {
  free(v->arena);
  free(v->text_off);
  free(v->text_len);
  free(v->type);
  free(v->score);
  free(v->slots);
  memset(v, 0, sizeof *v);
}

static int text_eq(const struct vocab *v, int32_t id, const char *s, size_t len) {
  return v->text_off[id] != UINT32_MAX && v->text_len[id] == len &&
         memcmp(v->arena + v->text_off[id], s, len) == 0;
}

int32_t vocab_find(const struct vocab *v, const char *s, size_t len) {
  uint32_t i = (uint32_t)vocab_hash(s, len) & v->mask;
  for (;;) {
    int32_t id = v->slots[i];
    if (id < 0)
      return -1;
    if (text_eq(v, id, s, len))
      return id;
    i = (i + 1) & v->mask;
  }
}

int vocab_set(struct vocab *v, int32_t id, const char *s, size_t len) {
  if (id < 0 || id >= v->n)
    return ERR("token id %d out of range (vocabulary of %d)", id, v->n);
  if (v->text_off[id] != UINT32_MAX)
    return ERR("token id %d given two texts", id);
  if (len >= UINT32_MAX / 2 || v->arena_len + len + 1 >= UINT32_MAX)
    return ERR("vocabulary texts too large");
  if (v->arena_len + len + 1 > v->arena_cap) {
    size_t cap = v->arena_cap * 2 + len + 1;
    char *a = realloc(v->arena, cap);
    if (!a)
      return ERR("out of memory");
    v->arena = a;
    v->arena_cap = cap;
  }
  memcpy(v->arena + v->arena_len, s, len);
  v->arena[v->arena_len + len] = 0;
  v->text_off[id] = (uint32_t)v->arena_len;
  v->text_len[id] = (uint32_t)len;
  v->arena_len += len + 1;
  uint32_t i = (uint32_t)vocab_hash(s, len) & v->mask;
  for (;;) {
    int32_t cur = v->slots[i];
    if (cur < 0 || text_eq(v, cur, s, len)) {
      v->slots[i] = id;
      return 0;
    }
    i = (i + 1) & v->mask;
  }
}

const char *vocab_text(const struct vocab *v, int32_t id, size_t *len) {
  if (id < 0 || id >= v->n || v->text_off[id] == UINT32_MAX) {
    if (len)
      *len = 0;
    return NULL;
  }
  if (len)
    *len = v->text_len[id];
  return v->arena + v->text_off[id];
}
