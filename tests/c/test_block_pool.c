/* test_block_pool.c - the free queue: LRU order, O(1) remove from the middle, exact counts. */
#include "core/block_pool.h"
#include "test_util.h"

/* The ids in the free queue from head (next evicted) to tail. */
static int queue(const struct block_pool *p, int32_t *out, int cap) {
  int n = 0;
  for (int32_t i = p->blocks[p->num_blocks].next; i != p->num_blocks && n < cap; i = p->blocks[i].next)
    out[n++] = i;
  return n;
}

int main(void) {
  struct block_pool p;
  CHECK(block_pool_init(&p, 1) != 0, "a pool needs the null block plus one");
  REQUIRE(block_pool_init(&p, 6) == 0, "init");
  int32_t q[8];
  CHECK(p.num_free == 5, "blocks 1..5 free, got %d", p.num_free);
  int n = queue(&p, q, 8);
  CHECK(n == 5 && q[0] == 1 && q[4] == 5, "id order at start");
  CHECK(p.blocks[0].ref_count == 1 && !block_pool_is_free(&p, 0), "null block pinned");

  int32_t a = block_pool_pop(&p), b = block_pool_pop(&p), c = block_pool_pop(&p);
  CHECK(a == 1 && b == 2 && c == 3, "pops take the head: %d %d %d", a, b, c);
  CHECK(p.blocks[a].ref_count == 1 && p.num_free == 2, "popped block referenced once");
  /* A sequence [a b c] is freed last block first: c, b, a join the tail in that order. */
  p.blocks[c].ref_count = p.blocks[b].ref_count = p.blocks[a].ref_count = 0;
  block_pool_append(&p, c);
  block_pool_append(&p, b);
  block_pool_append(&p, a);
  n = queue(&p, q, 8);
  CHECK(n == 5 && q[0] == 4 && q[1] == 5 && q[2] == 3 && q[3] == 2 && q[4] == 1,
        "LRU: never-used first, then the freed tail before its head");
  /* Reviving b (a prefix hit) unlinks it from the middle. */
  block_pool_remove(&p, b);
  p.blocks[b].ref_count = 1;
  n = queue(&p, q, 8);
  CHECK(n == 4 && q[2] == 3 && q[3] == 1 && p.num_free == 4, "remove from the middle");
  CHECK(!block_pool_is_free(&p, b), "revived block not free");
  for (int i = 0; i < 4; i++)
    CHECK(block_pool_pop(&p) == q[i], "pop order %d", i);
  CHECK(block_pool_pop(&p) == -1 && p.num_free == 0, "empty queue pops -1");
  /* Hashes survive the free queue (so freed blocks can still be hit). */
  p.blocks[b].has_hash = 1;
  p.blocks[b].ref_count = 0;
  block_pool_append(&p, b);
  CHECK(p.blocks[b].has_hash == 1 && p.num_free == 1, "hash kept while free");
  block_pool_free(&p);
  return test_finish("test_block_pool");
}
