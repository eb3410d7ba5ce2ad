/* block_pool.c - the fixed block array and its intrusive doubly linked free queue. */
#include "core/block_pool.h"

#include <stdlib.h>

#include "util/log.h"

int block_pool_init(struct block_pool *p, int num_blocks) {
  p->blocks = NULL;
  if (num_blocks < 2)
    return ERR("the KV pool needs at least 2 blocks (block 0 is reserved), got %d", num_blocks);
  p->blocks = calloc((size_t)num_blocks + 1, sizeof *p->blocks);
  if (!p->blocks)
    return ERR("out of memory for %d KV block descriptors", num_blocks);
  p->num_blocks = num_blocks;
  int32_t s = num_blocks; /* sentinel */
  p->blocks[s].prev = p->blocks[s].next = s;
  p->blocks[0].prev = p->blocks[0].next = -1;
  p->blocks[0].ref_count = 1; /* pinned: the null block is never handed out */
  p->num_free = 0;
  for (int32_t i = 1; i < num_blocks; i++) {
    p->blocks[i].prev = p->blocks[i].next = -1;
    block_pool_append(p, i);
  }
  return 0;
}

void block_pool_free(struct block_pool *p) {
  free(p->blocks);
  p->blocks = NULL;
  p->num_blocks = p->num_free = 0;
}

void block_pool_remove(struct block_pool *p, int32_t id) {
  struct block *b = &p->blocks[id];
  p->blocks[b->prev].next = b->next;
  p->blocks[b->next].prev = b->prev;
  b->prev = b->next = -1;
  p->num_free--;
}

void block_pool_append(struct block_pool *p, int32_t id) {
  int32_t s = p->num_blocks;
  struct block *b = &p->blocks[id];
  b->prev = p->blocks[s].prev;
  b->next = s;
  p->blocks[b->prev].next = id;
  p->blocks[s].prev = id;
  p->num_free++;
}

int32_t block_pool_pop(struct block_pool *p) {
  int32_t id = p->blocks[p->num_blocks].next;
  if (id == p->num_blocks)
    return -1;
  block_pool_remove(p, id);
  p->blocks[id].ref_count = 1;
  return id;
}
