/* prefix_cache.c - keyed BLAKE2b block hashes and the open-addressing hash -> block table. */
#include "core/prefix_cache.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* One key per process: every cache in the process shares it (hashes stay comparable). */
static uint8_t g_key[crypto_generichash_KEYBYTES];
static int g_key_ready;

int prefix_cache_init(struct prefix_cache *c, int num_blocks, int block_size) {
  memset(c, 0, sizeof *c);
  if (!g_key_ready) {
    if (sodium_init() < 0)
      return ERR("libsodium failed to initialize");
    randombytes_buf(g_key, sizeof g_key);
    g_key_ready = 1;
  }
  uint32_t cap = 16;
  while (cap < 2u * (uint32_t)num_blocks)
    cap <<= 1;
  c->table = malloc(cap * sizeof *c->table);
  c->tokens = malloc((size_t)num_blocks * block_size * sizeof *c->tokens);
  c->parent = malloc((size_t)num_blocks * BLOCK_HASH_BYTES);
  if (!c->table || !c->tokens || !c->parent) {
    prefix_cache_free(c);
    return ERR("out of memory for the prefix cache of %d blocks", num_blocks);
  }
  for (uint32_t i = 0; i < cap; i++)
    c->table[i].block = -1;
  c->cap_mask = cap - 1;
  c->num_blocks = num_blocks;
  c->block_size = block_size;
  return 0;
}

void prefix_cache_free(struct prefix_cache *c) {
  free(c->table);
  free(c->tokens);
  free(c->parent);
  memset(c, 0, sizeof *c);
}

void prefix_cache_hash(const struct prefix_cache *c, const uint8_t *parent, const int32_t *tokens,
                       uint8_t out[BLOCK_HASH_BYTES]) {
  static const uint8_t zero[BLOCK_HASH_BYTES];
  crypto_generichash_state st;
  crypto_generichash_init(&st, g_key, sizeof g_key, BLOCK_HASH_BYTES);
  crypto_generichash_update(&st, parent ? parent : zero, BLOCK_HASH_BYTES);
  crypto_generichash_update(&st, (const unsigned char *)tokens, (size_t)c->block_size * sizeof *tokens);
  crypto_generichash_final(&st, out, BLOCK_HASH_BYTES);
}

static uint32_t slot_of(const struct prefix_cache *c, const uint8_t *hash) {
  uint32_t h;
  memcpy(&h, hash, sizeof h); /* the hash is uniformly random: any 32 bits index well */
  return h & c->cap_mask;
}

/* The slot holding HASH, or the empty slot that ends its probe run. */
static uint32_t find(const struct prefix_cache *c, const uint8_t *hash) {
  uint32_t i = slot_of(c, hash);
  while (c->table[i].block >= 0 && memcmp(c->table[i].hash, hash, BLOCK_HASH_BYTES))
    i = (i + 1) & c->cap_mask;
  return i;
}

int32_t prefix_cache_lookup(const struct prefix_cache *c, const uint8_t hash[BLOCK_HASH_BYTES],
                            const int32_t *tokens) {
  const struct prefix_cache_entry *e = &c->table[find(c, hash)];
  if (e->block < 0)
    return -1;
  if (memcmp(c->tokens + (size_t)e->block * c->block_size, tokens, (size_t)c->block_size * sizeof *tokens))
    return -1;
  return e->block;
}

int prefix_cache_insert(struct prefix_cache *c, struct block_pool *pool, int32_t id,
                        const uint8_t hash[BLOCK_HASH_BYTES], const uint8_t *parent,
                        const int32_t *tokens) {
  uint32_t i = find(c, hash);
  if (c->table[i].block >= 0)
    return 0;
  memcpy(c->table[i].hash, hash, BLOCK_HASH_BYTES);
  c->table[i].block = id;
  memcpy(c->tokens + (size_t)id * c->block_size, tokens, (size_t)c->block_size * sizeof *tokens);
  if (parent)
    memcpy(c->parent + (size_t)id * BLOCK_HASH_BYTES, parent, BLOCK_HASH_BYTES);
  else
    memset(c->parent + (size_t)id * BLOCK_HASH_BYTES, 0, BLOCK_HASH_BYTES);
  struct block *b = &pool->blocks[id];
  memcpy(b->hash, hash, BLOCK_HASH_BYTES);
  b->has_hash = 1;
  c->num_cached++;
  return 1;
}

void prefix_cache_evict(struct prefix_cache *c, struct block_pool *pool, int32_t id) {
  struct block *b = &pool->blocks[id];
  if (!b->has_hash)
    return;
  uint32_t i = find(c, b->hash);
  b->has_hash = 0;
  if (c->table[i].block != id)
    return; /* not reachable when the invariants hold; keep the table untouched */
  /* Backward-shift deletion: pull later entries of the probe run into the hole so that every
   * entry stays reachable from its home slot without tombstones. */
  uint32_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & c->cap_mask;
    if (c->table[j].block < 0)
      break;
    uint32_t home = slot_of(c, c->table[j].hash);
    /* Entry j may move to the hole iff its home is not cyclically within (hole, j]. */
    int movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      c->table[hole] = c->table[j];
      hole = j;
    }
  }
  c->table[hole].block = -1;
  c->num_cached--;
  c->stats.evictions++;
}
