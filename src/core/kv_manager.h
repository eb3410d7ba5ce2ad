/* kv_manager.h - per-sequence block tables over the block pool and the prefix cache. */
#ifndef PAGODA_KV_MANAGER_H
#define PAGODA_KV_MANAGER_H

#include <stdint.h>

#include "core/block_pool.h"
#include "core/prefix_cache.h"

struct kv_manager_params {
  int num_blocks;          /* pool size, null block included */
  int block_size;          /* tokens per block: 8, 16 or 32 */
  int max_blocks_per_seq;  /* length of every block table */
  int enable_prefix_cache; /* 0: blocks are never hashed nor shared through the cache */
  int contiguous;          /* 1 (--paged-attn off): one fixed region of max_blocks_per_seq
                              consecutive blocks per sequence, sequence-level prefix cache */
  int prefix_cache_n;      /* contiguous: finished sequences kept for prefix reuse */
};

/* One sequence's view of the cache. Tokens [0, num_tokens) have slots; the KV of the first
 * num_hashed * block_size tokens is complete and its hash chain known. */
struct kv_seq {
  int32_t *blocks;  /* (max_blocks_per_seq) logical block -> physical block id */
  int num_blocks;   /* == ceil(num_tokens / block_size) */
  int num_tokens;   /* token slots allocated */
  int num_hashed;   /* leading full blocks whose hash is in `chain` order (cached or not) */
  int num_trimmed;  /* leading blocks returned to the pool by the sliding window: their entries
                       are the null block 0 (attention never reads them) */
  uint8_t chain[BLOCK_HASH_BYTES]; /* hash of block num_hashed - 1 */
  int region;       /* contiguous mode: the region held, -1 none */
};

/* A pending copy-on-write: the caller copies block src to dst in every layer before the step. */
struct kv_copy {
  int32_t src, dst;
};

/* Contiguous mode: a region is FREE, USED by one sequence, or CACHED (a finished sequence's KV
 * kept for reuse, in LRU order). */
enum region_state { REGION_FREE, REGION_USED, REGION_CACHED };
struct kv_region {
  int32_t state;
  int32_t len;        /* tokens whose KV the region holds */
  int32_t prev, next; /* LRU list of cached regions */
};

struct kv_manager {
  struct kv_manager_params p;
  struct block_pool pool;
  struct prefix_cache cache; /* block-level; its stats also count sequence-level hits */
  struct kv_region *regions; /* (num_regions) contiguous mode only */
  int32_t *region_tokens;    /* (num_regions, max_blocks_per_seq * block_size) */
  int num_regions, num_cached, cached_head, cached_tail;
  int window;                /* kv_manager_set_window; 0: none */
};

/* Returns 0, or -1 with err_last() set. Release with kv_manager_free. */
int kv_manager_init(struct kv_manager *m, const struct kv_manager_params *p);
void kv_manager_free(struct kv_manager *m);
/* The sliding window every layer attends within (tokens; 0, the default: none), after which
 * kv_manager_allocate returns blocks no future query can see to the pool (paged mode only;
 * ignored in contiguous mode). A model with any global-attention layer passes 0: the layers
 * share block ids. Set it before the first allocation. */
void kv_manager_set_window(struct kv_manager *m, int window);

/* A sequence with an empty table. Returns 0 or -1. Release with kv_seq_free (after
 * kv_manager_release). */
int kv_seq_init(struct kv_seq *s, const struct kv_manager *m);
void kv_seq_free(struct kv_seq *s);

/* On an empty sequence: takes (by reference) the longest run of cached full blocks that match
 * TOKENS[0, n), keeping at least the last token to recompute. Returns the tokens covered
 * (a multiple of block_size; 0 when prefix caching is off). Stats are recorded separately by
 * kv_manager_record_prefix so that a retried admission is not counted twice. */
int kv_manager_match_prefix(struct kv_manager *m, struct kv_seq *s, const int32_t *tokens, int n);
void kv_manager_record_prefix(struct kv_manager *m, int queried, int hit);

/* New blocks that reserving N more slots for S would take from the pool (copy-on-write
 * included, net of what the window trim returns first; never negative). */
int kv_manager_blocks_needed(const struct kv_manager *m, const struct kv_seq *s, int n);
/* Reserves slots for N more tokens. Returns 0; 1 when the pool lacks the blocks (S unchanged
 * but for the window trim below); -1 when S would outgrow its table. When the write would land
 * in a block shared with another sequence, S gets a private copy and *COPY names it (src = -1
 * otherwise).
 * With a window W (kv_manager_set_window), it first releases S's leading blocks wholly before position
 * num_tokens - W + 1 (the first key the next query, at position >= num_tokens, can see): their
 * table entries become the null block and S->num_trimmed counts them. So a sequence decoding
 * one token a step holds at most W / block_size + 2 blocks, however long it grows. A released
 * block keeps its prefix-cache hash while it waits in the free queue (its KV is still valid for
 * a request with the same prefix); once reused it is evicted, so it is never a hit for other
 * content. */
int kv_manager_allocate(struct kv_manager *m, struct kv_seq *s, int n, struct kv_copy *copy);
/* kv_manager_allocate for one token (decode). */
int kv_manager_append(struct kv_manager *m, struct kv_seq *s, struct kv_copy *copy);
/* CHILD (empty) shares every block of PARENT by reference. Paged mode only (see kv_manager_can_fork). */
static inline int kv_manager_can_fork(const struct kv_manager *m) { return !m->p.contiguous; }
void kv_manager_fork(struct kv_manager *m, const struct kv_seq *parent, struct kv_seq *child);
/* Registers the blocks of S that became full now that NUM_COMPUTED tokens (TOKENS) have KV. */
void kv_manager_cache_full_blocks(struct kv_manager *m, struct kv_seq *s, const int32_t *tokens,
                                  int num_computed);
/* Drops S's references, last block first (so its tail is evicted before its head); S is empty. */
void kv_manager_release(struct kv_manager *m, struct kv_seq *s);

static inline int kv_manager_num_free(const struct kv_manager *m) { return m->pool.num_free; }
/* Blocks usable by sequences (the null block excluded). */
static inline int kv_manager_capacity(const struct kv_manager *m) { return m->pool.num_blocks - 1; }

/* Checks every structural invariant against the sequences SEQS (all live tables): ref counts equal
 * the number of tables holding each block, free + used = total, the free queue holds exactly the
 * unreferenced blocks, every cached hash maps to a block hashed with its stored parent and tokens.
 * O(blocks + slots); for tests. Paged mode only (contiguous mode has nothing to check: returns 0). Returns 0, or -1 with err_last() describing the first violation. */
int kv_manager_check(const struct kv_manager *m, struct kv_seq *const *seqs, int num_seqs);

#endif
