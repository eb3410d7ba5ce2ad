/* bpe.h - byte-pair merging of one pre-tokenized word: by merge rank (HF BPE models, GGUF
 * "gpt2") or by SentencePiece score (GGUF "llama": a pair merges when the joined text is a
 * token, highest score first). Both keep a linked list of symbols and a binary heap of
 * candidate pairs, so a word of n symbols costs O(n log n). */
#ifndef PAGODA_BPE_H
#define PAGODA_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "text/vocab.h"

/* Merge table: (left id, right id) -> (rank, merged id), open addressing on a 64-bit key. */
struct bpe_merges {
  int n;
  uint64_t *keys;   /* (mask + 1) left << 32 | right; UINT64_MAX = empty */
  int32_t *rank;    /* (mask + 1) */
  int32_t *merged;  /* (mask + 1) */
  uint32_t mask;
};

/* Room for CAPACITY merges. Returns 0 or -1 (err_last). Release with bpe_merges_free. */
int bpe_merges_init(struct bpe_merges *m, int capacity);
void bpe_merges_free(struct bpe_merges *m);
/* Adds the next merge (its rank is the number added before); a repeated pair keeps its first
 * rank. Returns 0 or -1 when full. */
int bpe_merges_add(struct bpe_merges *m, int32_t left, int32_t right, int32_t merged);
/* Rank of (LEFT, RIGHT) and the merged id, or -1. */
int bpe_merges_find(const struct bpe_merges *m, int32_t left, int32_t right, int32_t *merged);

struct bpe_symbol {
  int32_t id;          /* token id, -1 when the text is not a token (score mode) */
  uint32_t start, len; /* byte span in the word */
  int32_t prev, next;  /* neighbours in the list, -1 at the ends */
};

struct bpe_candidate {
  float key;            /* lower merges first: the rank, or minus the score */
  int32_t left;         /* index of the left symbol */
  uint32_t left_len;    /* lengths when pushed: a changed length means the pair is stale */
  uint32_t right_len;
  int32_t merged;       /* id of the merged symbol */
};

/* Per-call scratch space, grown on demand and reused for every word (no per-word malloc). */
struct bpe_work {
  struct bpe_symbol *sym;    /* (cap) */
  struct bpe_candidate *heap; /* (heap_cap) */
  int num_syms, cap, num_heap, heap_cap;
};

void bpe_work_free(struct bpe_work *w);
/* Ensures room for N symbols; returns 0 or -1. Call before filling w->sym. */
int bpe_work_reserve(struct bpe_work *w, int n);

/* Merges the N_SYM symbols in w->sym (ids set, prev/next linked in order) by rank. */
int bpe_merge_by_rank(const struct bpe_merges *m, struct bpe_work *w);
/* Merges the symbols (spans of WORD; ids may be -1) whenever the joined text is in V, highest
 * score first, ties to the left; sets each final symbol's id (-1 if its text is no token). */
int bpe_merge_by_score(const struct vocab *v, const char *word, struct bpe_work *w);

#endif
