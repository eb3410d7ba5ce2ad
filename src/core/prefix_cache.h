/* prefix_cache.h - block-level prefix cache: keyed 128-bit hash chain over full blocks -> block id. */
#ifndef PAGODA_PREFIX_CACHE_H
#define PAGODA_PREFIX_CACHE_H

#include <stdint.h>

#include "core/block_pool.h"

/* hash(block) = BLAKE2b-128(key, parent_hash || token_ids), key random per process, so no
 * client can predict (and so craft collisions with) another client's block hashes. A lookup
 * also compares the stored tokens, so even a collision could never serve wrong KV. */
struct prefix_cache_entry {
  uint8_t hash[BLOCK_HASH_BYTES];
  int32_t block; /* -1: empty slot */
};

struct prefix_cache_stats {
  int64_t queries;   /* prompt tokens looked up */
  int64_t hits;      /* of those, tokens served from cached blocks */
  int64_t evictions; /* cached blocks whose hash was dropped because the block was reused */
};

struct prefix_cache {
  struct prefix_cache_entry *table; /* (cap) open addressing, linear probing, no tombstones */
  uint32_t cap_mask;                /* cap - 1; cap is a power of two >= 2 * num_blocks */
  int32_t *tokens;                  /* (num_blocks, block_size) the tokens of each cached block */
  uint8_t *parent;                  /* (num_blocks, BLOCK_HASH_BYTES) each cached block's parent hash */
  int num_blocks, block_size, num_cached;
  struct prefix_cache_stats stats;
};

/* Sizes the cache for a pool of NUM_BLOCKS blocks of BLOCK_SIZE tokens and draws its key.
 * Returns 0, or -1 with err_last() set. Release with prefix_cache_free. */
int prefix_cache_init(struct prefix_cache *c, int num_blocks, int block_size);
void prefix_cache_free(struct prefix_cache *c);

/* The hash of a full block of TOKENS (block_size ids) whose predecessor has hash PARENT (NULL
 * for the first block of a sequence). */
void prefix_cache_hash(const struct prefix_cache *c, const uint8_t *parent, const int32_t *tokens,
                       uint8_t out[BLOCK_HASH_BYTES]);
/* The block cached under HASH whose tokens equal TOKENS, or -1. */
int32_t prefix_cache_lookup(const struct prefix_cache *c, const uint8_t hash[BLOCK_HASH_BYTES],
                            const int32_t *tokens);
/* Registers full block ID (not yet cached) under HASH with its TOKENS and PARENT hash (NULL:
 * first block). Returns 1 when cached, 0 when another block already holds that hash (ID then
 * stays a plain block). */
int prefix_cache_insert(struct prefix_cache *c, struct block_pool *pool, int32_t id,
                        const uint8_t hash[BLOCK_HASH_BYTES], const uint8_t *parent,
                        const int32_t *tokens);
/* Drops block ID's hash (it is being reused for other content). */
void prefix_cache_evict(struct prefix_cache *c, struct block_pool *pool, int32_t id);

#endif
