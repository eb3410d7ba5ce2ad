/* tokenizer.c - loading dispatch, accessors, and encoding: added-token splitting, then per
 * segment normalize -> pre-tokenize -> BPE, plus BOS/EOS. */
#include "text/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/unicode.h"
#include "util/file.h"
#include "util/log.h"

#define WS_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

/* End of the chunk of S[start, len) that merges cannot leave: up to the next U+2581 that
 * follows another character (see ws_chunks). */
static size_t chunk_end(const char *s, size_t len, size_t start) {
  for (size_t i = start + 1; i + 3 <= len; i++) {
    if (s[i] != WS_MARK[0] || memcmp(s + i, WS_MARK, 3))
      continue;
    /* A character before it in this chunk that is not U+2581 itself: a boundary. */
    if (i - start < 3 || memcmp(s + i - 3, WS_MARK, 3))
      return i;
  }
  return len;
}

static int has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && !strcmp(s + n - m, suf);
}

static int file_is_gguf(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return 0;
  char magic[4] = {0};
  size_t n = fread(magic, 1, 4, f);
  fclose(f);
  return n == 4 && !memcmp(magic, "GGUF", 4);
}

struct tokenizer *tokenizer_load(const char *path) {
  if (!path || !*path) {
    ERR("no tokenizer path given");
    return NULL;
  }
  if (!file_exists(path)) {
    ERR("%s: no such file or directory", path);
    return NULL;
  }
  struct tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    ERR("out of memory");
    return NULL;
  }
  t->bos_id = t->eos_id = t->unk_id = -1;
  int rc;
  if (file_is_dir(path)) {
    size_t n = strlen(path) + 32;
    char *jp = malloc(n);
    if (!jp) {
      free(t);
      ERR("out of memory");
      return NULL;
    }
    snprintf(jp, n, "%s/tokenizer.json", path);
    if (file_exists(jp))
      rc = tokenizer_load_json(t, jp, path);
    else
      rc = ERR("%s: no tokenizer.json in this directory (give a tokenizer.json or a .gguf)", path);
    free(jp);
  } else if (has_suffix(path, ".gguf") || file_is_gguf(path)) {
    rc = tokenizer_load_gguf(t, path);
  } else {
    /* A tokenizer.json: its directory may hold tokenizer_config.json. */
    char *dir = strdup(path);
    if (!dir) {
      free(t);
      ERR("out of memory");
      return NULL;
    }
    char *slash = strrchr(dir, '/');
    if (slash)
      *slash = 0;
    else
      strcpy(dir, ".");
    rc = tokenizer_load_json(t, path, dir);
    free(dir);
  }
  if (rc == 0)
    rc = tokenizer_finish(t);
  static atomic_uint next_serial = 1;
  t->serial = atomic_fetch_add(&next_serial, 1);
  if (rc) {
    tokenizer_free(t);
    return NULL;
  }
  return t;
}

void tokenizer_free(struct tokenizer *t) {
  if (!t)
    return;
  vocab_free(&t->vocab);
  bpe_merges_free(&t->merges);
  normalizer_free(&t->norm);
  pretokenizer_free(&t->pre);
  for (int i = 0; i < t->num_added; i++)
    free(t->added[i].text);
  free(t->added);
  free(t->added_index);
  for (int i = 0; i < t->num_dec; i++) {
    free(t->dec[i].a);
    free(t->dec[i].b);
  }
  free(t->dec);
  free(t->special);
  free(t->eog);
  free(t->norm_added);
  free(t->added_only);
  free(t->norm_by_id);
  free(t->chat_template);
  free(t);
}

int tokenizer_add_added(struct tokenizer *t, int32_t id, const char *text, size_t len, int special,
                        int lstrip, int rstrip, int single_word, int normalized) {
  if (!len)
    return 0; /* an empty pattern would match everywhere */
  if (id < 0 || id >= t->vocab.n)
    return ERR("added token id %d out of range", id);
  struct added_token *a = realloc(t->added, (size_t)(t->num_added + 1) * sizeof *a);
  if (!a)
    return ERR("out of memory");
  t->added = a;
  char *s = malloc(len + 1);
  if (!s)
    return ERR("out of memory");
  memcpy(s, text, len);
  s[len] = 0;
  t->added[t->num_added++] = (struct added_token){id, s, (uint32_t)len, (uint8_t)!!special,
                                                (uint8_t)!!lstrip, (uint8_t)!!rstrip,
                                                (uint8_t)!!single_word, (uint8_t)!!normalized};
  t->num_added_normalized += !!normalized;
  return 0;
}

int tokenizer_add_decode(struct tokenizer *t, struct decode_step step) {
  struct decode_step *d = realloc(t->dec, (size_t)(t->num_dec + 1) * sizeof *d);
  if (!d) {
    free(step.a);
    free(step.b);
    return ERR("out of memory");
  }
  t->dec = d;
  t->dec[t->num_dec++] = step;
  return 0;
}

void tokenizer_mark_eog_by_text(struct tokenizer *t) {
  static const char *const names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                      "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>",
                                      "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = vocab_find(&t->vocab, names[i], strlen(names[i]));
    if (id >= 0 && t->special[id])
      t->eog[id] = 1;
  }
}

static int cmp_added_id(const void *a, const void *b, void *ctx) {
  const struct tokenizer *t = ctx;
  int32_t x = t->added[*(const int32_t *)a].id, y = t->added[*(const int32_t *)b].id;
  return x < y ? -1 : x > y;
}

const char *tokenizer_decode_text(const struct tokenizer *t, int32_t id, size_t *len) {
  if (t->norm_added && t->norm_added[id]) {
    int lo = 0, hi = t->num_norm_by_id - 1;
    while (lo <= hi) {
      int mid = (lo + hi) / 2;
      const struct added_token *a = &t->added[t->norm_by_id[mid]];
      if (a->id == id) {
        *len = a->len;
        return a->text;
      }
      if (a->id < id)
        lo = mid + 1;
      else
        hi = mid - 1;
    }
  }
  return vocab_text(&t->vocab, id, len);
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
  const struct tokenizer *t = ctx;
  const struct added_token *x = &t->added[*(const int32_t *)a], *y = &t->added[*(const int32_t *)b];
  if (x->text[0] != y->text[0])
    return (uint8_t)x->text[0] - (uint8_t)y->text[0];
  if (x->len != y->len)
    return x->len > y->len ? -1 : 1;
  return *(const int32_t *)a - *(const int32_t *)b;
}

int tokenizer_finish(struct tokenizer *t) {
  int n = t->vocab.n;
  if (!t->special)
    t->special = calloc((size_t)n, 1);
  if (!t->eog)
    t->eog = calloc((size_t)n, 1);
  if (!t->special || !t->eog)
    return ERR("out of memory");
  for (int i = 0; i < t->num_added; i++)
    if (t->added[i].special)
      t->special[t->added[i].id] = 1;
  if (t->eos_id >= n || t->bos_id >= n || t->unk_id >= n)
    return ERR("special token id out of range (vocabulary of %d)", n);
  if (t->eos_id >= 0)
    t->eog[t->eos_id] = 1;
  tokenizer_mark_eog_by_text(t);

  /* HF matches a `normalized` added token by its content passed through the normalizer. */
  int num_norm = 0;
  if (t->num_added_normalized && t->norm.n) {
    t->norm_added = calloc((size_t)n, 1);
    t->norm_by_id = malloc((size_t)t->num_added_normalized * sizeof *t->norm_by_id);
    if (!t->norm_added || !t->norm_by_id)
      return ERR("out of memory");
    struct regex_ctx *rc = regex_ctx_create();
    struct text_buf out = {0}, tmp = {0};
    int bad = !rc;
    for (int i = 0; i < t->num_added && !bad; i++) {
      struct added_token *a = &t->added[i];
      if (!a->normalized)
        continue;
      if (normalizer_apply(&t->norm, rc, a->text, a->len, &out, &tmp) || !out.len) {
        bad = 1;
        break;
      }
      char *m = malloc(out.len + 1);
      if (!m) {
        bad = 1;
        break;
      }
      memcpy(m, out.data, out.len);
      m[out.len] = 0;
      if (!vocab_text(&t->vocab, a->id, NULL) && vocab_set(&t->vocab, a->id, m, out.len)) {
        free(m);
        bad = 1;
        break;
      }
      t->norm_added[a->id] = 1;
      t->norm_by_id[num_norm++] = i;
      free(a->text);
      a->text = m;
      a->len = (uint32_t)out.len;
    }
    regex_ctx_free(rc);
    text_buf_free(&out);
    text_buf_free(&tmp);
    if (bad)
      return ERR("cannot normalize the added tokens");
    qsort_r(t->norm_by_id, (size_t)num_norm, sizeof *t->norm_by_id, cmp_added_id, t);
    t->num_norm_by_id = num_norm;
  }

  /* Added tokens grouped by first byte, longest first: the first hit at a position is the
   * leftmost-longest match HF's Aho-Corasick finds. */
  t->added_index = malloc((size_t)(t->num_added ? t->num_added : 1) * sizeof *t->added_index);
  if (!t->added_index)
    return ERR("out of memory");
  for (int i = 0; i < t->num_added; i++)
    t->added_index[i] = i;
  qsort_r(t->added_index, (size_t)t->num_added, sizeof *t->added_index, cmp_added_len, t);
  memset(t->added_start, 0, sizeof t->added_start);
  for (int i = 0; i < t->num_added; i++)
    t->added_start[(uint8_t)t->added[i].text[0] + 1]++;
  for (int b = 0; b < 256; b++)
    t->added_start[b + 1] += t->added_start[b];
  memset(t->added_second, 0, sizeof t->added_second);
  for (int i = 0; i < t->num_added; i++) {
    const struct added_token *a = &t->added[i];
    uint8_t b0 = (uint8_t)a->text[0];
    if (a->len == 1)
      memset(t->added_second[b0], 0xff, 32);
    else
      t->added_second[b0][(uint8_t)a->text[1] >> 3] |= (uint8_t)(1u << ((uint8_t)a->text[1] & 7));
  }

  /* (U+2581 itself must be a token, or unknown-character fusing could cross a boundary.) */
  t->ws_chunks = !t->byte_level && vocab_find(&t->vocab, WS_MARK, 3) >= 0;
  for (int32_t id = 0; id < n && t->ws_chunks; id++) {
    size_t len;
    const char *s = vocab_text(&t->vocab, id, &len);
    for (size_t i = 3; s && i + 3 <= len; i++)
      if (!memcmp(s + i, WS_MARK, 3) && memcmp(s + i - 3, WS_MARK, 3)) {
        t->ws_chunks = 0;
        break;
      }
  }
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_token[b] = vocab_find(&t->vocab, name, 6);
  }
  return 0;
}

int tokenizer_vocab_size(const struct tokenizer *t) { return t->vocab.n; }
int tokenizer_bos_id(const struct tokenizer *t) { return t->bos_id; }
int tokenizer_eos_id(const struct tokenizer *t) { return t->eos_id; }
int tokenizer_is_eog(const struct tokenizer *t, int32_t id) {
  return id >= 0 && id < t->vocab.n && t->eog[id];
}
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id, size_t *len) {
  const char *s = vocab_text(&t->vocab, id, len);
  if (!s && id >= 0 && id < t->vocab.n) {
    if (len)
      *len = 0;
    return "";
  }
  return s;
}
const char *tokenizer_chat_template(const struct tokenizer *t) { return t->chat_template; }

/* ---- encoding ---- */

/* Scratch space of encoding; every buffer grows to the largest word and is reused. One per
 * thread (a pthread key), so steady-state encoding allocates nothing and the tokenizer itself
 * stays read-only and shareable between threads. */
/* Direct-mapped cache of word -> ids: English text repeats its words, and a hit skips the
 * merge loop. Keyed by (tokenizer serial, word bytes); a collision just overwrites. */
#define CACHE_SLOTS 16384
#define CACHE_WORD 46
#define CACHE_IDS 14

struct cache_entry {
  uint32_t serial; /* 0 = empty */
  uint8_t len, num_ids;
  char word[CACHE_WORD];
  int32_t ids[CACHE_IDS];
};

struct encode_ws {
  struct cache_entry *cache; /* (CACHE_SLOTS) */
  struct regex_ctx *rc;
  struct text_buf norm, tmp, word;
  struct piece_list pieces, pieces_tmp;
  struct pretokenize_scratch pre;
  struct bpe_work bw;
  int32_t *ids; /* (cap) */
  int n, cap;
};

static void ws_free(void *p) {
  struct encode_ws *w = p;
  if (!w)
    return;
  free(w->cache);
  regex_ctx_free(w->rc);
  text_buf_free(&w->norm);
  text_buf_free(&w->tmp);
  text_buf_free(&w->word);
  piece_list_free(&w->pieces);
  piece_list_free(&w->pieces_tmp);
  pretokenize_scratch_free(&w->pre);
  bpe_work_free(&w->bw);
  free(w->ids);
  free(w);
}

static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static int ws_key_ok;

static void ws_key_init(void) { ws_key_ok = pthread_key_create(&ws_key, ws_free) == 0; }

/* This thread's workspace, or NULL on allocation failure. */
static struct encode_ws *ws_get(void) {
  pthread_once(&ws_once, ws_key_init);
  struct encode_ws *w = ws_key_ok ? pthread_getspecific(ws_key) : NULL;
  if (w)
    return w;
  w = calloc(1, sizeof *w);
  if (!w)
    return NULL;
  w->rc = regex_ctx_create();
  w->cache = calloc(CACHE_SLOTS, sizeof *w->cache);
  if (!w->rc || !w->cache || (ws_key_ok && pthread_setspecific(ws_key, w))) {
    ws_free(w);
    return NULL;
  }
  return w;
}

/* After a call: a workspace grown past 16 MiB by one huge text is released, not kept. */
static void ws_release(struct encode_ws *w) {
  size_t big = (size_t)16 << 20;
  if (!ws_key_ok || w->norm.cap > big || w->tmp.cap > big || w->word.cap > big || w->pieces.buf.cap > big ||
      w->pieces_tmp.buf.cap > big || (size_t)w->cap * 4 > big || (size_t)w->bw.cap * sizeof *w->bw.sym > big) {
    if (ws_key_ok)
      pthread_setspecific(ws_key, NULL);
    ws_free(w);
  }
}

static int emit(struct encode_ws *w, int32_t id) {
  if (w->n == w->cap) {
    int cap = w->cap ? w->cap * 2 : 256;
    int32_t *ids = realloc(w->ids, (size_t)cap * sizeof *ids);
    if (!ids)
      return ERR("out of memory");
    w->ids = ids;
    w->cap = cap;
  }
  w->ids[w->n++] = id;
  return 0;
}

static int emit_symbols(struct encode_ws *w) {
  for (int i = 0; i >= 0 && w->bw.num_syms > 0; i = w->bw.sym[i].next)
    if (emit(w, w->bw.sym[i].id))
      return -1;
  return 0;
}

static void link_symbols(struct bpe_work *bw) {
  for (int i = 0; i < bw->num_syms; i++) {
    bw->sym[i].prev = i - 1;
    bw->sym[i].next = i + 1 < bw->num_syms ? i + 1 : -1;
  }
}

static int add_symbol(struct bpe_work *bw, int32_t id, uint32_t start, uint32_t len) {
  if (bpe_work_reserve(bw, bw->num_syms + 1))
    return -1;
  bw->sym[bw->num_syms++] = (struct bpe_symbol){id, start, len, 0, 0};
  return 0;
}

/* Rank BPE on one pre-tokenized word (or one chunk of it). */
static int encode_chunk_bpe(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len) {
  const uint8_t *p = (const uint8_t *)s;
  struct bpe_work *bw = &w->bw;
  bw->num_syms = 0;
  if (t->ignore_merges) {
    int32_t id = vocab_find(&t->vocab, s, len);
    if (id >= 0 && !(t->added_only && t->added_only[id]))
      return emit(w, id);
  }
  int prev_unk = 0;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    int l = unicode_utf8_decode(p + i, len - i, &cp);
    if (!l)
      l = 1;
    int32_t id = vocab_find(&t->vocab, s + i, (size_t)l);
    if (id >= 0 && t->added_only && t->added_only[id])
      id = -1; /* an added token is matched before the model or not at all */
    if (id >= 0) {
      if (add_symbol(bw, id, (uint32_t)i, (uint32_t)l))
        return -1;
      prev_unk = 0;
    } else {
      int all = t->byte_fallback;
      for (int k = 0; all && k < l; k++)
        all = t->byte_token[p[i + (size_t)k]] >= 0;
      if (all) {
        for (int k = 0; k < l; k++)
          if (add_symbol(bw, t->byte_token[p[i + (size_t)k]], (uint32_t)i + (uint32_t)k, 1))
            return -1;
        prev_unk = 0;
      } else if (t->unk_id >= 0) {
        if (t->fuse_unk && prev_unk) {
          bw->sym[bw->num_syms - 1].len += (uint32_t)l;
        } else if (add_symbol(bw, t->unk_id, (uint32_t)i, (uint32_t)l)) {
          return -1;
        }
        prev_unk = 1;
      }
    }
    i += (size_t)l;
  }
  link_symbols(bw);
  if (bpe_merge_by_rank(&t->merges, bw))
    return -1;
  return emit_symbols(w);
}

static struct cache_entry *cache_slot(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len) {
  return &w->cache[(vocab_hash(s, len) ^ t->serial) & (CACHE_SLOTS - 1)];
}

/* Emits the cached ids of word S if present; 1 on a hit. */
static int cache_lookup(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len, int *rc) {
  if (len > CACHE_WORD)
    return 0;
  struct cache_entry *e = cache_slot(t, w, s, len);
  if (e->serial != t->serial || e->len != len || memcmp(e->word, s, len))
    return 0;
  *rc = 0;
  for (int i = 0; i < e->num_ids && !*rc; i++)
    *rc = emit(w, e->ids[i]);
  return 1;
}

/* Remembers the ids emitted since FIRST for word S. */
static void cache_store(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len, int first) {
  int n = w->n - first;
  if (len > CACHE_WORD || n > CACHE_IDS)
    return;
  struct cache_entry *e = cache_slot(t, w, s, len);
  e->serial = t->serial;
  e->len = (uint8_t)len;
  e->num_ids = (uint8_t)n;
  memcpy(e->word, s, len);
  memcpy(e->ids, w->ids + first, (size_t)n * sizeof *e->ids);
}

/* Rank BPE of one unit (a word, or a chunk of one) through the cache. */
static int encode_cached_bpe(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len) {
  int rc, first = w->n;
  if (cache_lookup(t, w, s, len, &rc))
    return rc;
  rc = encode_chunk_bpe(t, w, s, len);
  if (!rc)
    cache_store(t, w, s, len, first);
  return rc;
}

static int encode_word_bpe(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len) {
  if (!t->ws_chunks || t->ignore_merges)
    return encode_cached_bpe(t, w, s, len);
  for (size_t start = 0; start < len;) {
    size_t end = chunk_end(s, len, start);
    if (encode_cached_bpe(t, w, s + start, end - start))
      return -1;
    start = end;
  }
  return 0;
}

/* Score merges over one chunk WORD (N bytes); characters left that are no token become byte
 * tokens (or unk). */
static int encode_chunk_spm(const struct tokenizer *t, struct encode_ws *w, const char *word, size_t n) {
  const uint8_t *p = (const uint8_t *)word;
  struct bpe_work *bw = &w->bw;
  bw->num_syms = 0;
  if (bpe_work_reserve(bw, (int)n + 1))
    return -1;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int l = unicode_utf8_decode(p + i, n - i, &cp);
    if (!l)
      l = 1;
    bw->sym[bw->num_syms++] = (struct bpe_symbol){vocab_find(&t->vocab, word + i, (size_t)l), (uint32_t)i,
                                               (uint32_t)l, 0, 0};
    i += (size_t)l;
  }
  link_symbols(bw);
  if (bpe_merge_by_score(&t->vocab, word, bw))
    return -1;
  for (int i = 0; i >= 0 && bw->num_syms > 0; i = bw->sym[i].next) {
    struct bpe_symbol *sy = &bw->sym[i];
    if (sy->id >= 0) {
      if (emit(w, sy->id))
        return -1;
      continue;
    }
    for (uint32_t k = 0; k < sy->len; k++) {
      int32_t id = t->byte_token[p[sy->start + k]];
      if (id < 0)
        id = t->unk_id;
      if (id >= 0 && emit(w, id))
        return -1;
    }
  }
  return 0;
}

/* SentencePiece BPE (GGUF "llama") on one segment: ' ' -> U+2581, an optional leading one,
 * merges by score, then characters that are no token become byte tokens. */
static int encode_segment_spm(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len) {
  w->word.len = 0;
  if (t->spm_add_space && text_buf_append(&w->word, WS_MARK, 3))
    return ERR("out of memory");
  for (size_t i = 0; i < len; i++) {
    int rc = s[i] == ' ' ? text_buf_append(&w->word, WS_MARK, 3) : text_buf_append(&w->word, s + i, 1);
    if (rc)
      return ERR("out of memory");
  }
  if (!t->ws_chunks)
    return encode_chunk_spm(t, w, w->word.data, w->word.len);
  for (size_t start = 0; start < w->word.len;) {
    size_t end = chunk_end(w->word.data, w->word.len, start);
    const char *c = w->word.data + start;
    int rc, first = w->n;
    if (!cache_lookup(t, w, c, end - start, &rc)) {
      rc = encode_chunk_spm(t, w, c, end - start);
      if (!rc)
        cache_store(t, w, c, end - start, first);
    }
    if (rc)
      return -1;
    start = end;
  }
  return 0;
}

static int encode_normalized(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len,
                             int at_origin) {
  if (pretokenizer_apply(&t->pre, w->rc, s, len, at_origin, &w->pieces, &w->pieces_tmp, &w->pre))
    return -1;
  for (int i = 0; i < w->pieces.n; i++)
    if (encode_word_bpe(t, w, w->pieces.buf.data + w->pieces.p[i].off, w->pieces.p[i].len))
      return -1;
  return 0;
}

static int find_added(const struct tokenizer *t, const char *s, size_t len, size_t from, int parse_special,
                      int normalized, size_t *ms, size_t *me);

static int encode_segment(const struct tokenizer *t, struct encode_ws *w, const char *s, size_t len,
                          int at_origin, int parse_special) {
  if (!len)
    return 0;
  if (t->model == TOKENIZER_MODEL_SPM)
    return encode_segment_spm(t, w, s, len);
  if (normalizer_apply(&t->norm, w->rc, s, len, &w->norm, &w->tmp))
    return -1;
  if (!t->num_added_normalized)
    return encode_normalized(t, w, w->norm.data, w->norm.len, at_origin);
  /* HF's second pass: added tokens with `normalized` are found in the normalized text. */
  const char *n = w->norm.data;
  size_t nl = w->norm.len;
  for (size_t seg = 0; seg <= nl;) {
    size_t ms = nl, me = nl;
    int k = find_added(t, n, nl, seg, parse_special, 1, &ms, &me);
    if (ms > seg && encode_normalized(t, w, n + seg, ms - seg, at_origin && seg == 0))
      return -1;
    if (k < 0)
      break;
    if (emit(w, t->added[k].id))
      return -1;
    seg = me;
  }
  return 0;
}

static uint32_t cp_before(const char *s, size_t pos, size_t lo, size_t *start) {
  size_t b = pos - 1;
  while (b > lo && ((uint8_t)s[b] & 0xC0) == 0x80)
    b--;
  uint32_t cp = UNICODE_REPLACEMENT;
  if (!unicode_utf8_decode((const uint8_t *)s + b, pos - b, &cp))
    cp = UNICODE_REPLACEMENT;
  *start = b;
  return cp;
}

/* Finds the leftmost-longest added token in S[from, len) that may match (among those matched
 * in raw text, or with NORMALIZED among those matched in normalized text). Returns its index in
 * t->added and the matched span (widened by lstrip/rstrip), or -1. */
static int find_added(const struct tokenizer *t, const char *s, size_t len, size_t from, int parse_special,
                      int normalized, size_t *ms, size_t *me) {
  for (size_t pos = from; pos < len; pos++) {
    uint8_t b = (uint8_t)s[pos];
    if (t->added_start[b] == t->added_start[b + 1])
      continue;
    if (pos + 1 < len && !(t->added_second[b][(uint8_t)s[pos + 1] >> 3] & (1u << ((uint8_t)s[pos + 1] & 7))))
      continue;
    for (int k = t->added_start[b]; k < t->added_start[b + 1]; k++) {
      const struct added_token *a = &t->added[t->added_index[k]];
      if ((a->special && !parse_special) || a->normalized != normalized)
        continue;
      if (a->len > len - pos || (a->len > 1 && s[pos + 1] != a->text[1]) || memcmp(s + pos, a->text, a->len))
        continue;
      size_t e = pos + a->len, st = pos;
      if (a->single_word) {
        size_t dummy;
        uint32_t cp;
        if (pos > 0 && unicode_is_word(cp_before(s, pos, 0, &dummy)))
          continue;
        if (e < len && unicode_utf8_decode((const uint8_t *)s + e, len - e, &cp) && unicode_is_word(cp))
          continue;
      }
      if (a->lstrip) {
        while (st > from) {
          size_t b0;
          if (!unicode_is_whitespace(cp_before(s, st, from, &b0)))
            break;
          st = b0;
        }
      }
      if (a->rstrip) {
        while (e < len) {
          uint32_t cp;
          int l = unicode_utf8_decode((const uint8_t *)s + e, len - e, &cp);
          if (!l || !unicode_is_whitespace(cp))
            break;
          e += (size_t)l;
        }
      }
      *ms = st;
      *me = e;
      return t->added_index[k];
    }
  }
  return -1;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *ids, int max_ids) {
  if (!t || (!text && len))
    return ERR("tokenizer_encode: bad arguments");
  /* Offsets and counts inside are 32-bit; a text this large is refused, not truncated. */
  if (len > (size_t)1 << 29)
    return ERR("text too long to tokenize (%zu bytes; the limit is 512 MiB)", len);
  struct encode_ws *w = ws_get();
  if (!w)
    return ERR("out of memory");
  w->n = 0;
  char *fixed = NULL;
  int rc = 0;
  if (len && !unicode_utf8_valid(text, len)) {
    /* Invalid UTF-8 is read as HF's Python callers would after errors="replace". */
    fixed = malloc(len * 3);
    if (!fixed) {
      rc = ERR("out of memory");
      goto done;
    }
    len = unicode_utf8_repair(text, len, fixed);
    text = fixed;
  }
  if (add_special && t->add_bos && t->bos_id >= 0 && (rc = emit(w, t->bos_id)))
    goto done;
  size_t seg = 0;
  while (seg <= len) {
    size_t ms = len, me = len;
    int k = t->num_added ? find_added(t, text, len, seg, parse_special, 0, &ms, &me) : -1;
    if ((rc = encode_segment(t, w, text + seg, ms - seg, seg == 0, parse_special)))
      goto done;
    if (k < 0)
      break;
    if ((rc = emit(w, t->added[k].id)))
      goto done;
    seg = me;
  }
  if (add_special && t->add_eos && t->eos_id >= 0 && (rc = emit(w, t->eos_id)))
    goto done;
  if (w->n > 0 && ids && max_ids > 0)
    memcpy(ids, w->ids, (size_t)(w->n < max_ids ? w->n : max_ids) * sizeof *ids);
  rc = w->n;
done:
  ws_release(w);
  free(fixed);
  return rc;
}
