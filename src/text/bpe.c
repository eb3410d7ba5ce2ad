/* bpe.c - merge table and the heap-driven merge loop shared by rank and score BPE. */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static uint32_t key_slot(uint64_t k, uint32_t mask) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return (uint32_t)k & mask;
}

int bpe_merges_init(struct bpe_merges *m, int capacity) {
  memset(m, 0, sizeof *m);
  if (capacity < 0 || capacity > (1 << 26))
    return ERR("merge count %d out of range", capacity);
  uint32_t cap = 16;
  while (cap < (uint32_t)capacity * 2u + 2u)
    cap <<= 1;
  m->mask = cap - 1;
  m->keys = malloc((size_t)cap * sizeof *m->keys);
  m->rank = malloc((size_t)cap * sizeof *m->rank);
  m->merged = malloc((size_t)cap * sizeof *m->merged);
  if (!m->keys || !m->rank || !m->merged) {
    bpe_merges_free(m);
    return ERR("out of memory for %d merges", capacity);
  }
  memset(m->keys, 0xff, (size_t)cap * sizeof *m->keys);
  return 0;
}

void bpe_merges_free(struct bpe_merges *m) {
  free(m->keys);
  free(m->rank);
  free(m->merged);
  memset(m, 0, sizeof *m);
}

int bpe_merges_add(struct bpe_merges *m, int32_t left, int32_t right, int32_t merged) {
  if ((uint32_t)(m->n + 1) * 2u > m->mask + 1)
    return ERR("merge table full");
  uint64_t k = pair_key(left, right);
  uint32_t i = key_slot(k, m->mask);
  while (m->keys[i] != UINT64_MAX) {
    if (m->keys[i] == k) {
      m->n++; /* the rank counter still advances, as ranks are positions in the list */
      return 0;
    }
    i = (i + 1) & m->mask;
  }
  m->keys[i] = k;
  m->rank[i] = m->n++;
  m->merged[i] = merged;
  return 0;
}

int bpe_merges_find(const struct bpe_merges *m, int32_t left, int32_t right, int32_t *merged) {
  if (!m->keys)
    return -1;
  uint64_t k = pair_key(left, right);
  uint32_t i = key_slot(k, m->mask);
  while (m->keys[i] != UINT64_MAX) {
    if (m->keys[i] == k) {
      *merged = m->merged[i];
      return m->rank[i];
    }
    i = (i + 1) & m->mask;
  }
  return -1;
}

void bpe_work_free(struct bpe_work *w) {
  free(w->sym);
  free(w->heap);
  memset(w, 0, sizeof *w);
}

int bpe_work_reserve(struct bpe_work *w, int n) {
  if (n <= w->cap)
    return 0;
  int cap = w->cap ? w->cap : 64;
  while (cap < n)
    cap *= 2;
  struct bpe_symbol *s = realloc(w->sym, (size_t)cap * sizeof *s);
  if (!s)
    return ERR("out of memory");
  w->sym = s;
  w->cap = cap;
  return 0;
}

static int cand_less(const struct bpe_candidate *a, const struct bpe_candidate *b) {
  return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(struct bpe_work *w, struct bpe_candidate c) {
  if (w->num_heap == w->heap_cap) {
    int cap = w->heap_cap ? w->heap_cap * 2 : 128;
    struct bpe_candidate *h = realloc(w->heap, (size_t)cap * sizeof *h);
    if (!h)
      return ERR("out of memory");
    w->heap = h;
    w->heap_cap = cap;
  }
  int i = w->num_heap++;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (!cand_less(&c, &w->heap[p]))
      break;
    w->heap[i] = w->heap[p];
    i = p;
  }
  w->heap[i] = c;
  return 0;
}

static struct bpe_candidate heap_pop(struct bpe_work *w) {
  struct bpe_candidate top = w->heap[0];
  struct bpe_candidate last = w->heap[--w->num_heap];
  int n = w->num_heap, i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n)
      break;
    if (c + 1 < n && cand_less(&w->heap[c + 1], &w->heap[c]))
      c++;
    if (!cand_less(&w->heap[c], &last))
      break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (n > 0)
    w->heap[i] = last;
  return top;
}

/* Queues the pair starting at symbol L (if it has a right neighbour that it can merge with). */
static int push_rank(const struct bpe_merges *m, struct bpe_work *w, int32_t l) {
  if (l < 0)
    return 0;
  int32_t r = w->sym[l].next;
  if (r < 0 || w->sym[l].id < 0 || w->sym[r].id < 0)
    return 0;
  int32_t merged;
  int rank = bpe_merges_find(m, w->sym[l].id, w->sym[r].id, &merged);
  if (rank < 0)
    return 0;
  struct bpe_candidate c = {(float)rank, l, w->sym[l].len, w->sym[r].len, merged};
  return heap_push(w, c);
}

static int push_score(const struct vocab *v, const char *word, struct bpe_work *w, int32_t l) {
  if (l < 0)
    return 0;
  int32_t r = w->sym[l].next;
  if (r < 0)
    return 0;
  int32_t id = vocab_find(v, word + w->sym[l].start, w->sym[l].len + w->sym[r].len);
  /* Only ordinary pieces are merge results: SentencePiece never spells a control, unknown,
   * unused or byte piece out of text (llama.cpp's SPM would, HF's ids do not). */
  if (id < 0 || (v->type[id] != VOCAB_TYPE_NORMAL && v->type[id] != VOCAB_TYPE_UNDEFINED &&
                 v->type[id] != VOCAB_TYPE_USER_DEFINED))
    return 0;
  struct bpe_candidate c = {-v->score[id], l, w->sym[l].len, w->sym[r].len, id};
  return heap_push(w, c);
}

/* Applies candidate C if it is still current; returns 1 when merged. */
static int apply(struct bpe_work *w, const struct bpe_candidate *c) {
  struct bpe_symbol *l = &w->sym[c->left];
  if (l->len != c->left_len || l->next < 0)
    return 0;
  struct bpe_symbol *r = &w->sym[l->next];
  if (r->len != c->right_len)
    return 0;
  l->len += r->len;
  l->id = c->merged;
  l->next = r->next;
  if (r->next >= 0)
    w->sym[r->next].prev = c->left;
  r->len = 0; /* dead: stale candidates that name it fail the length check */
  return 1;
}

int bpe_merge_by_rank(const struct bpe_merges *m, struct bpe_work *w) {
  w->num_heap = 0;
  for (int i = 0; i + 1 < w->num_syms; i++)
    if (push_rank(m, w, i))
      return -1;
  while (w->num_heap) {
    struct bpe_candidate c = heap_pop(w);
    if (!apply(w, &c))
      continue;
    if (push_rank(m, w, w->sym[c.left].prev) || push_rank(m, w, c.left))
      return -1;
  }
  return 0;
}

int bpe_merge_by_score(const struct vocab *v, const char *word, struct bpe_work *w) {
  w->num_heap = 0;
  for (int i = 0; i + 1 < w->num_syms; i++)
    if (push_score(v, word, w, i))
      return -1;
  while (w->num_heap) {
    struct bpe_candidate c = heap_pop(w);
    if (!apply(w, &c))
      continue;
    if (push_score(v, word, w, w->sym[c.left].prev) || push_score(v, word, w, c.left))
      return -1;
  }
  return 0;
}

