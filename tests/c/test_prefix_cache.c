/* test_prefix_cache.c - keyed hash chain, verified lookups, insertion and backward-shift eviction. */
#include <sodium.h>
#include <string.h>

#include "core/prefix_cache.h"
#include "test_util.h"

#define BS 16

int main(void) {
  struct block_pool pool;
  struct prefix_cache c;
  REQUIRE(block_pool_init(&pool, 64) == 0, "pool");
  REQUIRE(prefix_cache_init(&c, 64, BS) == 0, "cache");
  int32_t t1[BS], t2[BS];
  for (int i = 0; i < BS; i++) {
    t1[i] = i;
    t2[i] = i + 100;
  }
  uint8_t h1[16], h1b[16], h2[16], h2p[16];
  prefix_cache_hash(&c, NULL, t1, h1);
  prefix_cache_hash(&c, NULL, t1, h1b);
  CHECK(!memcmp(h1, h1b, 16), "deterministic within the process");
  prefix_cache_hash(&c, h1, t2, h2);
  prefix_cache_hash(&c, NULL, t2, h2p);
  CHECK(memcmp(h2, h2p, 16), "the parent is part of the hash");

  /* It is BLAKE2b-128 keyed with a secret: the unkeyed hash of the same input differs. */
  uint8_t in[16 + BS * 4] = {0}, plain[16];
  memcpy(in + 16, t1, sizeof t1);
  crypto_generichash(plain, 16, in, sizeof in, NULL, 0);
  CHECK(memcmp(plain, h1, 16), "keyed: not the public unkeyed hash");

  CHECK(prefix_cache_lookup(&c, h1, t1) == -1, "empty cache misses");
  CHECK(prefix_cache_insert(&c, &pool, 5, h1, NULL, t1) == 1, "insert");
  CHECK(pool.blocks[5].has_hash && !memcmp(pool.blocks[5].hash, h1, 16), "block carries its hash");
  CHECK(prefix_cache_lookup(&c, h1, t1) == 5, "hit");
  CHECK(prefix_cache_insert(&c, &pool, 6, h1, NULL, t1) == 0, "a duplicate hash is not cached twice");
  /* A hit is verified against the tokens: the same hash with other tokens misses. */
  CHECK(prefix_cache_lookup(&c, h1, t2) == -1, "token mismatch misses");

  /* Many entries whose home slots collide: eviction in any order keeps the rest reachable. */
  uint8_t hs[40][16];
  int32_t toks[40][BS];
  for (int k = 0; k < 40; k++) {
    for (int i = 0; i < BS; i++)
      toks[k][i] = k * 1000 + i;
    prefix_cache_hash(&c, NULL, toks[k], hs[k]);
    hs[k][0] = (uint8_t)(k % 3); /* force clusters: only 3 home slots (low byte of the index) */
    hs[k][1] = hs[k][2] = hs[k][3] = 0;
    CHECK(prefix_cache_insert(&c, &pool, 10 + k, hs[k], h1, toks[k]) == 1, "insert %d", k);
  }
  uint64_t rng = 7;
  int gone[40] = {0};
  for (int round = 0; round < 40; round++) {
    int k;
    do
      k = (int)(test_rand(&rng) % 40);
    while (gone[k]);
    prefix_cache_evict(&c, &pool, 10 + k);
    gone[k] = 1;
    CHECK(!pool.blocks[10 + k].has_hash, "evicted block loses its hash");
    for (int j = 0; j < 40; j++)
      CHECK(prefix_cache_lookup(&c, hs[j], toks[j]) == (gone[j] ? -1 : 10 + j), "after evicting %d: %d",
            k, j);
  }
  CHECK(c.stats.evictions == 40 && c.num_cached == 1, "eviction count %lld, cached %d",
        (long long)c.stats.evictions, c.num_cached);
  CHECK(prefix_cache_lookup(&c, h1, t1) == 5, "unrelated entry survives");
  prefix_cache_free(&c);
  block_pool_free(&pool);
  return test_finish("test_prefix_cache");
}
