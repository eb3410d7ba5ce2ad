/* kv_manager.c - block tables: prefix matching, allocation with copy-on-write, fork and release. */
#include "core/kv_manager.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int kv_manager_init(struct kv_manager *m, const struct kv_manager_params *p) {
  memset(m, 0, sizeof *m);
  if (p->block_size != 8 && p->block_size != 16 && p->block_size != 32)
    return ERR("block size must be 8, 16 or 32 (--pa-block-size), got %d", p->block_size);
  if (p->max_blocks_per_seq < 1)
    return ERR("max_blocks_per_seq must be positive");
  m->p = *p;
  if (p->contiguous)
    m->p.enable_prefix_cache = 0; /* no block hashes: the cache is per sequence */
  if (block_pool_init(&m->pool, p->num_blocks))
    return -1;
  if (m->p.enable_prefix_cache && prefix_cache_init(&m->cache, p->num_blocks, p->block_size)) {
    block_pool_free(&m->pool);
    return -1;
  }
  if (p->contiguous) {
    m->num_regions = (p->num_blocks - 1) / p->max_blocks_per_seq;
    m->regions = calloc((size_t)(m->num_regions > 0 ? m->num_regions : 1), sizeof *m->regions);
    m->region_tokens = malloc((size_t)m->num_regions * p->max_blocks_per_seq * p->block_size * sizeof(int32_t) + 1);
    if (m->num_regions < 1 || !m->regions || !m->region_tokens) {
      kv_manager_free(m);
      return ERR("the contiguous KV cache needs room for one sequence of %d blocks", p->max_blocks_per_seq);
    }
    m->cached_head = m->cached_tail = -1;
  }
  return 0;
}

/* --- contiguous mode (--paged-attn off) ------------------------------------------------------ */

static void region_unlink(struct kv_manager *m, int r) {
  struct kv_region *g = &m->regions[r];
  if (g->prev >= 0)
    m->regions[g->prev].next = g->next;
  else
    m->cached_head = g->next;
  if (g->next >= 0)
    m->regions[g->next].prev = g->prev;
  else
    m->cached_tail = g->prev;
  m->num_cached--;
}

static void region_take(struct kv_manager *m, struct kv_seq *s, int r, int len) {
  if (m->regions[r].state == REGION_CACHED)
    region_unlink(m, r);
  m->regions[r].state = REGION_USED;
  m->regions[r].len = len;
  m->pool.num_free -= m->p.max_blocks_per_seq;
  s->region = r;
  for (int i = 0; i < m->p.max_blocks_per_seq; i++)
    s->blocks[i] = 1 + r * m->p.max_blocks_per_seq + i;
  s->num_tokens = len;
  s->num_blocks = (len + m->p.block_size - 1) / m->p.block_size;
}

/* Sequence-level prefix cache: the cached region sharing the longest prefix with TOKENS. */
static int region_match(struct kv_manager *m, struct kv_seq *s, const int32_t *tokens, int n) {
  if (m->p.prefix_cache_n <= 0)
    return 0;
  int best = -1, best_len = 0, stride = m->p.max_blocks_per_seq * m->p.block_size;
  for (int r = m->cached_head; r >= 0; r = m->regions[r].next) {
    const int32_t *t = m->region_tokens + (size_t)r * stride;
    int lim = m->regions[r].len < n - 1 ? m->regions[r].len : n - 1, k = 0;
    while (k < lim && t[k] == tokens[k])
      k++;
    if (k > best_len) {
      best_len = k;
      best = r;
    }
  }
  if (best < 0)
    return 0;
  region_take(m, s, best, best_len);
  return best_len;
}

static int region_allocate(struct kv_manager *m, struct kv_seq *s, int n) {
  if (s->region < 0) {
    int r = 0;
    while (r < m->num_regions && m->regions[r].state != REGION_FREE)
      r++;
    if (r == m->num_regions) {
      r = m->cached_head; /* evict the least recently finished sequence */
      if (r < 0)
        return 1;
      m->cache.stats.evictions++;
    }
    region_take(m, s, r, 0);
  }
  s->num_tokens += n;
  s->num_blocks = (s->num_tokens + m->p.block_size - 1) / m->p.block_size;
  return 0;
}

static void region_release(struct kv_manager *m, struct kv_seq *s) {
  int r = s->region;
  if (r < 0)
    return;
  struct kv_region *g = &m->regions[r];
  m->pool.num_free += m->p.max_blocks_per_seq;
  g->state = REGION_FREE;
  if (m->p.prefix_cache_n > 0 && g->len > 0) {
    g->state = REGION_CACHED;
    g->next = -1;
    g->prev = m->cached_tail;
    if (m->cached_tail >= 0)
      m->regions[m->cached_tail].next = r;
    else
      m->cached_head = r;
    m->cached_tail = r;
    if (++m->num_cached > m->p.prefix_cache_n) {
      int old = m->cached_head;
      region_unlink(m, old);
      m->regions[old].state = REGION_FREE;
      m->cache.stats.evictions++;
    }
  }
  s->region = -1;
}

void kv_manager_free(struct kv_manager *m) {
  block_pool_free(&m->pool);
  if (m->p.enable_prefix_cache)
    prefix_cache_free(&m->cache);
  free(m->regions);
  free(m->region_tokens);
  m->regions = NULL;
  m->region_tokens = NULL;
}

void kv_manager_set_window(struct kv_manager *m, int window) {
  m->window = window > 0 && !m->p.contiguous ? window : 0;
}

int kv_seq_init(struct kv_seq *s, const struct kv_manager *m) {
  memset(s, 0, sizeof *s);
  s->region = -1;
  s->blocks = malloc((size_t)m->p.max_blocks_per_seq * sizeof *s->blocks);
  return s->blocks ? 0 : ERR("out of memory for a block table");
}

void kv_seq_free(struct kv_seq *s) {
  free(s->blocks);
  s->blocks = NULL;
}

/* Takes one more reference to block ID, reviving it from the free queue when unreferenced. */
static void take_ref(struct kv_manager *m, int32_t id) {
  if (m->pool.blocks[id].ref_count++ == 0)
    block_pool_remove(&m->pool, id);
}

/* A fresh block for new content; a cached block popped for reuse loses its hash (eviction). */
static int32_t fresh_block(struct kv_manager *m) {
  int32_t id = block_pool_pop(&m->pool);
  if (id >= 0 && m->pool.blocks[id].has_hash)
    prefix_cache_evict(&m->cache, &m->pool, id);
  return id;
}

int kv_manager_match_prefix(struct kv_manager *m, struct kv_seq *s, const int32_t *tokens, int n) {
  if (m->p.contiguous)
    return s->region < 0 ? region_match(m, s, tokens, n) : 0;
  if (!m->p.enable_prefix_cache || s->num_blocks)
    return 0;
  int bs = m->p.block_size;
  uint8_t h[BLOCK_HASH_BYTES];
  /* (i + 1) * bs <= n - 1: the last prompt token is always recomputed, since its logits are
   * needed to sample the first output token. */
  for (int i = 0; (i + 1) * bs <= n - 1 && i < m->p.max_blocks_per_seq; i++) {
    prefix_cache_hash(&m->cache, i ? s->chain : NULL, tokens + (size_t)i * bs, h);
    int32_t id = prefix_cache_lookup(&m->cache, h, tokens + (size_t)i * bs);
    if (id < 0)
      break;
    take_ref(m, id);
    s->blocks[s->num_blocks++] = id;
    memcpy(s->chain, h, sizeof h);
    s->num_hashed++;
  }
  s->num_tokens = s->num_blocks * bs;
  return s->num_tokens;
}

void kv_manager_record_prefix(struct kv_manager *m, int queried, int hit) {
  if (!m->p.enable_prefix_cache && !(m->p.contiguous && m->p.prefix_cache_n > 0))
    return;
  m->cache.stats.queries += queried;
  m->cache.stats.hits += hit;
}

/* 1 when S's next write lands in a partial block that another table also holds. */
static int needs_cow(const struct kv_manager *m, const struct kv_seq *s) {
  return s->num_tokens % m->p.block_size != 0 &&
         m->pool.blocks[s->blocks[s->num_blocks - 1]].ref_count > 1;
}

int kv_manager_blocks_needed(const struct kv_manager *m, const struct kv_seq *s, int n) {
  if (m->p.contiguous)
    return s->region < 0 && n > 0 ? m->p.max_blocks_per_seq : 0;
  int bs = m->p.block_size;
  int total = (s->num_tokens + n + bs - 1) / bs;
  int need = total - s->num_blocks + (n > 0 && needs_cow(m, s));
  if (m->window > 0 && n > 0) { /* blocks the window trim returns first (unshared ones) */
    int first_seen = s->num_tokens - m->window + 1;
    for (int i = s->num_trimmed; i < s->num_blocks && (i + 1) * bs <= first_seen; i++)
      need -= m->pool.blocks[s->blocks[i]].ref_count == 1;
    if (need < 0)
      need = 0;
  }
  return need;
}

/* Drops S's reference to block ID. */
static void drop_ref(struct kv_manager *m, int32_t id) {
  if (--m->pool.blocks[id].ref_count == 0)
    block_pool_append(&m->pool, id);
}

/* Sliding window: releases S's leading blocks whose positions are all before
 * num_tokens - window + 1, which no query at position >= num_tokens sees. */
static void trim_window(struct kv_manager *m, struct kv_seq *s) {
  int first_seen = s->num_tokens - m->window + 1, bs = m->p.block_size;
  while (s->num_trimmed < s->num_blocks && (s->num_trimmed + 1) * bs <= first_seen) {
    drop_ref(m, s->blocks[s->num_trimmed]);
    s->blocks[s->num_trimmed++] = 0;
  }
}

int kv_manager_allocate(struct kv_manager *m, struct kv_seq *s, int n, struct kv_copy *copy) {
  copy->src = copy->dst = -1;
  if (m->window > 0 && n > 0)
    trim_window(m, s);
  int bs = m->p.block_size;
  int total = (s->num_tokens + n + bs - 1) / bs;
  if (total > m->p.max_blocks_per_seq)
    return ERR("a sequence of %d tokens exceeds its block table (%d blocks of %d)",
               s->num_tokens + n, m->p.max_blocks_per_seq, bs);
  if (n <= 0)
    return 0;
  if (m->p.contiguous)
    return region_allocate(m, s, n);
  int cow = needs_cow(m, s);
  if (total - s->num_blocks + cow > m->pool.num_free)
    return 1;
  if (cow) {
    int32_t old = s->blocks[s->num_blocks - 1];
    int32_t id = fresh_block(m);
    m->pool.blocks[old].ref_count--; /* still >= 1: it was shared */
    s->blocks[s->num_blocks - 1] = id;
    copy->src = old;
    copy->dst = id;
  }
  while (s->num_blocks < total)
    s->blocks[s->num_blocks++] = fresh_block(m);
  s->num_tokens += n;
  return 0;
}

int kv_manager_append(struct kv_manager *m, struct kv_seq *s, struct kv_copy *copy) {
  return kv_manager_allocate(m, s, 1, copy);
}

void kv_manager_fork(struct kv_manager *m, const struct kv_seq *parent, struct kv_seq *child) {
  for (int i = 0; i < parent->num_blocks; i++) {
    child->blocks[i] = parent->blocks[i];
    if (i >= parent->num_trimmed)
      m->pool.blocks[parent->blocks[i]].ref_count++;
  }
  child->num_trimmed = parent->num_trimmed;
  child->num_blocks = parent->num_blocks;
  child->num_tokens = parent->num_tokens;
  child->num_hashed = parent->num_hashed;
  memcpy(child->chain, parent->chain, sizeof child->chain);
}

void kv_manager_cache_full_blocks(struct kv_manager *m, struct kv_seq *s, const int32_t *tokens,
                                  int num_computed) {
  if (m->p.contiguous && s->region >= 0) { /* remember the tokens whose KV the region holds */
    struct kv_region *g = &m->regions[s->region];
    int32_t *t = m->region_tokens + (size_t)s->region * m->p.max_blocks_per_seq * m->p.block_size;
    if (num_computed > g->len)
      memcpy(t + g->len, tokens + g->len, (size_t)(num_computed - g->len) * sizeof *t);
    g->len = num_computed;
    return;
  }
  if (!m->p.enable_prefix_cache)
    return;
  int bs = m->p.block_size;
  uint8_t h[BLOCK_HASH_BYTES];
  while ((s->num_hashed + 1) * bs <= num_computed && s->num_hashed < s->num_blocks) {
    int i = s->num_hashed;
    const uint8_t *parent = i ? s->chain : NULL;
    prefix_cache_hash(&m->cache, parent, tokens + (size_t)i * bs, h);
    int32_t id = s->blocks[i];
    if (i < s->num_trimmed)
      break; /* released before it was hashed: the chain ends here for this sequence */
    if (!m->pool.blocks[id].has_hash)
      prefix_cache_insert(&m->cache, &m->pool, id, h, parent, tokens + (size_t)i * bs);
    memcpy(s->chain, h, sizeof h);
    s->num_hashed++;
  }
}

void kv_manager_release(struct kv_manager *m, struct kv_seq *s) {
  if (m->p.contiguous) {
    region_release(m, s);
    s->num_blocks = s->num_tokens = s->num_hashed = 0;
    return;
  }
  for (int i = s->num_blocks - 1; i >= s->num_trimmed; i--)
    drop_ref(m, s->blocks[i]);
  s->num_blocks = s->num_tokens = s->num_hashed = s->num_trimmed = 0;
}

int kv_manager_check(const struct kv_manager *m, struct kv_seq *const *seqs, int num_seqs) {
  if (m->p.contiguous)
    return 0; /* regions are fixed: nothing is shared or counted per block */
  const struct block_pool *p = &m->pool;
  int nb = p->num_blocks, bs = m->p.block_size;
  int32_t *refs = calloc((size_t)nb, sizeof *refs);
  int32_t *last_seen = malloc((size_t)nb * sizeof *last_seen);
  int rc = -1;
  if (!refs || !last_seen) {
    rc = ERR("out of memory");
    goto out;
  }
  for (int i = 0; i < nb; i++)
    last_seen[i] = -1;
  for (int q = 0; q < num_seqs; q++) {
    const struct kv_seq *s = seqs[q];
    if (s->num_blocks != (s->num_tokens + bs - 1) / bs) {
      ERR("seq %d: %d blocks for %d tokens", q, s->num_blocks, s->num_tokens);
      goto out;
    }
    if (s->num_hashed > s->num_blocks || s->num_hashed * bs > s->num_tokens) {
      ERR("seq %d: %d hashed blocks of %d", q, s->num_hashed, s->num_blocks);
      goto out;
    }
    if (s->num_trimmed < 0 || s->num_trimmed > s->num_blocks ||
        (s->num_trimmed && m->window <= 0)) {
      ERR("seq %d: %d blocks trimmed of %d (window %d)", q, s->num_trimmed, s->num_blocks,
          m->window);
      goto out;
    }
    for (int i = 0; i < s->num_blocks; i++) {
      int32_t id = s->blocks[i];
      if (i < s->num_trimmed) {
        if (id != 0) {
          ERR("seq %d block %d: trimmed but maps to %d, not the null block", q, i, id);
          goto out;
        }
        continue;
      }
      if (id <= 0 || id >= nb) {
        ERR("seq %d block %d: bad id %d", q, i, id);
        goto out;
      }
      if (last_seen[id] == q) {
        ERR("block %d twice in seq %d", id, q);
        goto out;
      }
      last_seen[id] = q;
      refs[id]++;
    }
  }
  int used = 0, has_hash = 0;
  for (int i = 1; i < nb; i++) {
    const struct block *b = &p->blocks[i];
    if (b->ref_count != refs[i]) {
      ERR("block %d: ref_count %d but %d tables hold it", i, b->ref_count, refs[i]);
      goto out;
    }
    if ((b->ref_count == 0) != block_pool_is_free(p, i)) {
      ERR("block %d: ref_count %d but %s the free queue", i, b->ref_count,
          block_pool_is_free(p, i) ? "in" : "not in");
      goto out;
    }
    used += b->ref_count > 0;
    has_hash += b->has_hash;
  }
  if (p->blocks[0].ref_count != 1 || block_pool_is_free(p, 0)) {
    ERR("the null block was handed out");
    goto out;
  }
  int walked = 0;
  for (int32_t i = p->blocks[nb].next; i != nb; i = p->blocks[i].next) {
    if (i <= 0 || i >= nb || p->blocks[i].ref_count != 0 || ++walked > p->num_free) {
      ERR("free queue corrupt at block %d", i);
      goto out;
    }
    if (p->blocks[p->blocks[i].next].prev != i) {
      ERR("free queue links broken at %d", i);
      goto out;
    }
  }
  if (walked != p->num_free || p->num_free + used != nb - 1) {
    ERR("free %d (walked %d) + used %d != %d blocks", p->num_free, walked, used, nb - 1);
    goto out;
  }
  if (m->p.enable_prefix_cache) {
    const struct prefix_cache *c = &m->cache;
    int entries = 0;
    for (uint32_t i = 0; i <= c->cap_mask; i++) {
      const struct prefix_cache_entry *e = &c->table[i];
      if (e->block < 0)
        continue;
      entries++;
      const struct block *b = &p->blocks[e->block];
      if (!b->has_hash || memcmp(b->hash, e->hash, BLOCK_HASH_BYTES)) {
        ERR("cache entry %u -> block %d whose hash differs", i, e->block);
        goto out;
      }
      static const uint8_t zero[BLOCK_HASH_BYTES];
      const uint8_t *par = c->parent + (size_t)e->block * BLOCK_HASH_BYTES;
      uint8_t h[BLOCK_HASH_BYTES];
      prefix_cache_hash(c, memcmp(par, zero, sizeof zero) ? par : NULL,
                        c->tokens + (size_t)e->block * bs, h);
      if (memcmp(h, e->hash, sizeof h)) {
        ERR("block %d: hash does not match its tokens", e->block);
        goto out;
      }
      if (prefix_cache_lookup(c, e->hash, c->tokens + (size_t)e->block * bs) != e->block) {
        ERR("block %d: cached but not found by lookup", e->block);
        goto out;
      }
    }
    if (entries != has_hash || entries != c->num_cached) {
      ERR("%d cache entries, %d hashed blocks, num_cached %d", entries, has_hash, c->num_cached);
      goto out;
    }
  } else if (has_hash) {
    ERR("%d blocks hashed with prefix caching off", has_hash);
    goto out;
  }
  rc = 0;
out:
  free(refs);
  free(last_seen);
  return rc;
}
