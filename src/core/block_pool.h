/* block_pool.h - the fixed array of KV blocks: ref counts, content hashes and the LRU free queue. */
#ifndef PAGODA_BLOCK_POOL_H
#define PAGODA_BLOCK_POOL_H

#include <stdint.h>

#define BLOCK_HASH_BYTES 16 /* 128-bit content hash */

/* One KV block's bookkeeping (its K/V data live in the model's per-layer caches at the same id).
 * Invariant: ref_count == 0 <=> the block is linked in the free queue (prev/next >= 0),
 * except the null block 0, which is never free and never handed out. */
struct block {
  int32_t ref_count;              /* number of block tables holding this block */
  int32_t prev, next;             /* free-queue links (indices into blocks[]); -1 when not queued */
  int32_t has_hash;               /* 1 when registered in the prefix cache */
  uint8_t hash[BLOCK_HASH_BYTES]; /* valid when has_hash */
};

/* The pool. blocks[num_blocks] is the free queue's sentinel: the queue is circular through it,
 * head = blocks[sentinel].next (least recently freed: evicted first), tail = blocks[sentinel].prev. */
struct block_pool {
  struct block *blocks; /* (num_blocks + 1): block 0 is the reserved null block, the last the sentinel */
  int num_blocks;       /* blocks including the null block */
  int num_free;         /* blocks in the free queue (cached-but-unreferenced ones included) */
};

/* Builds a pool of NUM_BLOCKS (>= 2; block 0 is reserved) with every other block free, in id
 * order. Returns 0, or -1 with err_last() set. Release with block_pool_free. */
int block_pool_init(struct block_pool *p, int num_blocks);
void block_pool_free(struct block_pool *p);

/* Takes the head of the free queue (the least recently freed block), sets its ref_count to 1
 * and returns its id; -1 when the queue is empty. The block keeps its hash: the caller evicts it
 * from the prefix cache (see kv_manager). O(1). */
int32_t block_pool_pop(struct block_pool *p);
/* Unlinks free block ID from anywhere in the queue (a prefix-cache hit revives it). O(1). */
void block_pool_remove(struct block_pool *p, int32_t id);
/* Links block ID (ref_count just reached 0) at the tail of the queue. O(1). */
void block_pool_append(struct block_pool *p, int32_t id);

static inline int block_pool_is_free(const struct block_pool *p, int32_t id) {
  return p->blocks[id].prev >= 0;
}

#endif
