/* test_model_forward.c - the forward pass on stories260K.gguf: paging and batching do not change
 * the logits, decoding step by step equals one prefill, and greedy generation matches llama.cpp. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/gguf.h"
#include "model/model.h"
#include "test_util.h"
#include "util/log.h"

#define MAX_BLOCKS 32 /* per sequence: 256 tokens at block size 8 */
#define POOL 96       /* blocks in the pool, block 0 reserved */

/* Every comparison of logits below is between computations that the CPU backend performs with the
 * same operations in the same order for each token (per-token matmul rows, per-(token, head)
 * attention walking keys in position order), so they agree to the last bit; 1e-6 would still
 * catch any paging or batching bug (those change logits by O(1)). */
#define SAME_TOL 1e-6

struct tseq {
  const int32_t *tokens; /* all tokens of the sequence */
  int n_cached;          /* tokens already in the cache */
  int32_t table[MAX_BLOCKS];
};

struct pool {
  int32_t free_ids[POOL];
  int n_free;
  uint64_t rng;
};

static void pool_init(struct pool *p, uint64_t seed) {
  p->n_free = POOL - 1;
  p->rng = seed;
  for (int i = 0; i < POOL - 1; i++)
    p->free_ids[i] = i + 1;
  for (int i = POOL - 2; i > 0; i--) { /* shuffled: physical order must not matter */
    int j = (int)(test_rand(&p->rng) % (uint64_t)(i + 1));
    int32_t t = p->free_ids[i];
    p->free_ids[i] = p->free_ids[j];
    p->free_ids[j] = t;
  }
}

/* Runs one step: N_NEW[i] next tokens of each sequence SEQS[i]. LOGITS gets (T, vocab): the logits
 * of every token of the step, in batch order. Returns 0 or -1. */
static int step(struct model *m, struct tseq **seqs, const int *n_new, int B, int bs, struct pool *p,
                float *logits) {
  int T = 0;
  for (int s = 0; s < B; s++)
    T += n_new[s];
  int32_t *ids = malloc(sizeof(int32_t) * T * 4), *pos = ids + T, *slots = pos + T, *lidx = slots + T;
  int32_t qs[9], lens[8], tables[8 * MAX_BLOCKS];
  qs[0] = 0;
  for (int s = 0, t = 0; s < B; s++) {
    struct tseq *q = seqs[s];
    int len = q->n_cached + n_new[s];
    for (int b = (q->n_cached + bs - 1) / bs; b < (len + bs - 1) / bs; b++)
      q->table[b] = p->free_ids[--p->n_free];
    for (int i = q->n_cached; i < len; i++, t++) {
      ids[t] = q->tokens[i];
      pos[t] = i;
      slots[t] = q->table[i / bs] * bs + i % bs;
      lidx[t] = t;
    }
    qs[s + 1] = t;
    lens[s] = len;
    memcpy(tables + s * MAX_BLOCKS, q->table, sizeof q->table);
  }
  struct batch b = {0};
  b.num_tokens = T;
  b.num_seqs = B;
  b.max_blocks_per_seq = MAX_BLOCKS;
  b.input_ids = ids;
  b.positions = pos;
  b.slot_mapping = slots;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_tables = tables;
  b.num_logits = T;
  b.logits_idx = lidx;
  for (int s = 0; s < B; s++) {
    if (lens[s] > b.max_seq_len)
      b.max_seq_len = lens[s];
    if (n_new[s] > b.max_query_len)
      b.max_query_len = n_new[s];
  }
  int rc = model_forward(m, &b, logits);
  CHECK(rc == 0, "model_forward: %s", err_last_where());
  for (int s = 0; s < B; s++)
    seqs[s]->n_cached += n_new[s];
  free(ids);
  return rc;
}

/* Logits (n, vocab) of TOKENS[0..n) run alone in one prefill. */
static int prefill_alone(struct model *m, const int32_t *tokens, int n, int bs, float *logits) {
  struct pool p;
  pool_init(&p, 99);
  struct tseq s = {tokens, 0, {0}};
  struct tseq *sp = &s;
  return step(m, &sp, &n, 1, bs, &p, logits);
}

static int argmax(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best])
      best = i;
  return best;
}

/* SentencePiece-BPE tokenization of TEXT with the GGUF vocabulary (merge the adjacent pair whose
 * joined piece has the highest score), with BOS and the leading space marker, as llama.cpp's
 * llama-spm tokenizer does; enough for the plain ASCII prompts of the greedy reference. */
static int spm_tokenize(const struct gguf_file *g, const char *text, int32_t *out, int max) {
  const struct gguf_kv *tok = gguf_find(g, "tokenizer.ggml.tokens");
  const struct gguf_kv *sc = gguf_find(g, "tokenizer.ggml.scores");
  if (!tok || !sc)
    return -1;
  char sym[256][64];
  int n = 0;
  char buf[512] = "\xe2\x96\x81"; /* U+2581: the leading space */
  size_t bl = strlen(buf);
  for (const char *c = text; *c && bl + 4 < sizeof buf; c++) {
    if (*c == ' ') {
      memcpy(buf + bl, "\xe2\x96\x81", 3);
      bl += 3;
    } else {
      buf[bl++] = *c;
    }
  }
  buf[bl] = 0;
  for (size_t i = 0; i < bl && n < 256;) { /* one symbol per UTF-8 character */
    size_t cl = ((unsigned char)buf[i] >= 0xe0) ? 3 : 1;
    memcpy(sym[n], buf + i, cl);
    sym[n++][cl] = 0;
    i += cl;
  }
  for (;;) {
    int best = -1;
    double best_score = -INFINITY;
    for (int i = 0; i + 1 < n; i++) {
      char joined[128];
      size_t l0 = strlen(sym[i]), l1 = strlen(sym[i + 1]);
      if (l0 + l1 >= sizeof sym[0])
        continue;
      memcpy(joined, sym[i], l0);
      memcpy(joined + l0, sym[i + 1], l1 + 1);
      for (uint64_t id = 0; id < tok->len; id++) {
        size_t len;
        const char *s = gguf_arr_str(g, tok, id, &len);
        if (s && len == strlen(joined) && !memcmp(s, joined, len)) {
          double score = -INFINITY;
          gguf_arr_float(sc, id, &score);
          if (score > best_score) {
            best_score = score;
            best = i;
          }
          break;
        }
      }
    }
    if (best < 0)
      break;
    size_t l0 = strlen(sym[best]), l1 = strlen(sym[best + 1]);
    memcpy(sym[best] + l0, sym[best + 1], l1 + 1);
    memmove(sym[best + 1], sym[best + 2], sizeof sym[0] * (size_t)(n - best - 2));
    n--;
  }
  int k = 0;
  out[k++] = 1; /* BOS */
  for (int i = 0; i < n && k < max; i++) {
    int found = -1;
    for (uint64_t id = 0; id < tok->len && found < 0; id++) {
      size_t len;
      const char *s = gguf_arr_str(g, tok, id, &len);
      if (s && len == strlen(sym[i]) && !memcmp(s, sym[i], len))
        found = (int)id;
    }
    if (found < 0)
      return -1;
    out[k++] = found;
  }
  return k;
}

/* Appends the text of token ID (SentencePiece piece: U+2581 is a space, <0xNN> a byte). */
static void spm_append(const struct gguf_file *g, int id, char *text, size_t cap) {
  const struct gguf_kv *tok = gguf_find(g, "tokenizer.ggml.tokens");
  size_t len, tl = strlen(text);
  const char *s = gguf_arr_str(g, tok, (uint64_t)id, &len);
  unsigned byte;
  char piece[64];
  if (!s || len >= sizeof piece)
    return;
  memcpy(piece, s, len);
  piece[len] = 0;
  if (len == 6 && sscanf(piece, "<0x%02X>", &byte) == 1) {
    if (tl + 1 < cap) {
      text[tl] = (char)byte;
      text[tl + 1] = 0;
    }
    return;
  }
  for (size_t i = 0; i < len && tl + 1 < cap;) {
    if (i + 3 <= len && !memcmp(piece + i, "\xe2\x96\x81", 3)) {
      text[tl++] = ' ';
      i += 3;
    } else {
      text[tl++] = piece[i++];
    }
  }
  text[tl] = 0;
}

int main(void) {
  const char *path = test_shared_path("models/stories260K.gguf");
  if (!path)
    return test_skip("stories260K.gguf not found (set PAGODA_TESTDATA)");
  struct backend *be = backend_cpu_create(2);
  REQUIRE(be, "backend: %s", err_last());
  struct model *m = model_load(path, be);
  REQUIRE(m, "model_load: %s", err_last_where());
  const struct model_config *c = model_get_config(m);
  const int V = c->vocab_size;
  CHECK(V == 512 && c->n_layers == 5 && c->dim == 64, "stories260K config");

  /* fixed token ids: BOS then a spread over the vocabulary */
  enum { NA = 30, NB = 17, NC = 26 };
  int32_t ta[NA], tb[NB], tc[NC];
  for (int i = 0; i < NA; i++)
    ta[i] = i ? (i * 37 + 11) % V : 1;
  for (int i = 0; i < NB; i++)
    tb[i] = i ? (i * 101 + 7) % V : 1;
  for (int i = 0; i < NC; i++)
    tc[i] = i ? (i * 13 + 300) % V : 1;
  float *ref_a = malloc(sizeof(float) * NA * V), *ref_b = malloc(sizeof(float) * NB * V);
  float *ref_c = malloc(sizeof(float) * NC * V), *out = malloc(sizeof(float) * 256 * V);

  /* 1. block sizes 8, 16, 32 give the same logits for every position */
  const int bss[3] = {8, 16, 32};
  for (int bi = 0; bi < 3; bi++) {
    REQUIRE(model_alloc_cache(m, POOL, bss[bi], DTYPE_F32, 128, 4, MAX_BLOCKS) == 0, "alloc: %s",
            err_last());
    REQUIRE(prefill_alone(m, ta, NA, bss[bi], bi ? out : ref_a) == 0, "prefill");
    if (bi) {
      double e = test_rel_l2(out, ref_a, (size_t)NA * V);
      CHECK(e < SAME_TOL, "block size %d vs 8: rel L2 %g", bss[bi], e);
    }
  }
  for (int i = 0; i < NA * V; i++)
    if (!isfinite(ref_a[i])) {
      CHECK(0, "non-finite logit at %d", i);
      break;
    }

  /* 2. three sequences in one batch, A split in two prefill chunks and C finishing with a decode
   * token, give each sequence's logits of running it alone */
  REQUIRE(model_alloc_cache(m, POOL, 16, DTYPE_F32, 128, 4, MAX_BLOCKS) == 0, "alloc");
  prefill_alone(m, ta, NA, 16, ref_a);
  prefill_alone(m, tb, NB, 16, ref_b);
  prefill_alone(m, tc, NC, 16, ref_c);
  {
    struct pool p;
    pool_init(&p, 7);
    struct tseq a = {ta, 0, {0}}, b = {tb, 0, {0}}, cc = {tc, 0, {0}};
    struct tseq *s1[3] = {&a, &b, &cc}, *s2[2] = {&a, &cc};
    int n1[3] = {12, NB, NC - 1}, n2[2] = {NA - 12, 1};
    REQUIRE(step(m, s1, n1, 3, 16, &p, out) == 0, "step 1");
    double ea = test_rel_l2(out, ref_a, (size_t)12 * V);
    double eb = test_rel_l2(out + (size_t)12 * V, ref_b, (size_t)NB * V);
    double ec = test_rel_l2(out + (size_t)(12 + NB) * V, ref_c, (size_t)(NC - 1) * V);
    CHECK(ea < SAME_TOL && eb < SAME_TOL && ec < SAME_TOL, "batched step 1: %g %g %g", ea, eb, ec);
    REQUIRE(step(m, s2, n2, 2, 16, &p, out) == 0, "step 2");
    ea = test_rel_l2(out, ref_a + (size_t)12 * V, (size_t)(NA - 12) * V);
    ec = test_rel_l2(out + (size_t)(NA - 12) * V, ref_c + (size_t)(NC - 1) * V, V);
    CHECK(ea < SAME_TOL && ec < SAME_TOL, "batched step 2 (second chunk, decode): %g %g", ea, ec);
  }

  /* 3. greedy decoding token by token equals the argmax of one big prefill over the result */
  {
    enum { NP = 6, NG = 40 };
    int32_t toks[NP + NG];
    for (int i = 0; i < NP; i++)
      toks[i] = i ? (i * 59 + 3) % V : 1;
    struct pool p;
    pool_init(&p, 11);
    struct tseq s = {toks, 0, {0}};
    struct tseq *sp = &s;
    int n = NP;
    float *dec = malloc(sizeof(float) * NG * V);
    REQUIRE(step(m, &sp, &n, 1, 16, &p, out) == 0, "prompt");
    memcpy(dec, out + (size_t)(NP - 1) * V, sizeof(float) * V);
    toks[NP] = argmax(dec, V);
    for (int g = 1; g < NG; g++) {
      n = 1;
      REQUIRE(step(m, &sp, &n, 1, 16, &p, dec + (size_t)g * V) == 0, "decode %d", g);
      toks[NP + g] = argmax(dec + (size_t)g * V, V);
    }
    REQUIRE(prefill_alone(m, toks, NP + NG - 1, 16, out) == 0, "big prefill");
    int same = 1;
    for (int g = 0; g < NG; g++)
      same &= argmax(out + (size_t)(NP - 1 + g) * V, V) == toks[NP + g];
    CHECK(same, "greedy decode differs from the prefill's argmax");
    double e = test_rel_l2(dec, out + (size_t)(NP - 1) * V, (size_t)NG * V);
    CHECK(e < SAME_TOL, "decode logits vs prefill logits: rel L2 %g", e);
    free(dec);
  }

  /* 4. greedy continuations made by llama.cpp (shared testdata) */
  const char *jl = test_shared_path("models/stories260K.greedy.jsonl");
  struct gguf_file *g = gguf_open(path);
  char *text = jl ? test_read_file(jl, NULL) : NULL;
  int n_cases = 0;
  for (char *line = text; g && line && *line; n_cases++) {
    char *nl = strchr(line, '\n');
    if (nl)
      *nl = 0;
    /* fields are plain ASCII with \n and \" escapes only: enough to pull them out by hand */
    char prompt[256] = "", want[1024] = "";
    char *pp = strstr(line, "\"prompt\": \""), *cp = strstr(line, "\"continuation\": \"");
    if (!pp || !cp)
      break;
    char *fields[2] = {pp + 11, cp + 17};
    char *dsts[2] = {prompt, want};
    size_t caps[2] = {sizeof prompt, sizeof want};
    for (int f = 0; f < 2; f++) {
      size_t k = 0;
      for (char *q = fields[f]; *q && *q != '"' && k + 1 < caps[f]; q++) {
        if (*q == '\\') {
          q++;
          dsts[f][k++] = *q == 'n' ? '\n' : *q;
        } else {
          dsts[f][k++] = *q;
        }
      }
      dsts[f][k] = 0;
    }
    int32_t toks[128];
    int np = spm_tokenize(g, prompt, toks, 64);
    REQUIRE(np > 1, "tokenize '%s'", prompt);
    struct pool p;
    pool_init(&p, 5);
    struct tseq s = {toks, 0, {0}};
    struct tseq *sp = &s;
    int n = np, nt = np;
    char got[1024] = "";
    REQUIRE(step(m, &sp, &n, 1, 16, &p, out) == 0, "prompt");
    int next = argmax(out + (size_t)(np - 1) * V, V);
    for (int k = 0; k < 64 && next != c->eos_id; k++) {
      spm_append(g, next, got, sizeof got);
      toks[nt++] = next;
      if (k == 63)
        break;
      n = 1;
      REQUIRE(step(m, &sp, &n, 1, 16, &p, out) == 0, "decode");
      next = argmax(out, V);
    }
    CHECK(strcmp(got, want) == 0, "greedy continuation of '%s':\n  got  '%s'\n  want '%s'", prompt, got, want);
    line = nl ? nl + 1 : NULL;
  }
  CHECK(!jl || n_cases == 3, "3 greedy reference cases read, got %d", n_cases);
  free(text);
  gguf_close(g);

  /* 5. bad batches are refused with a message, and the model keeps working */
  {
    int32_t id = V, pos = 0, slot = 16, qs[2] = {0, 1}, len = 1, tab[MAX_BLOCKS] = {1}, li = 0;
    struct batch b = {1, 1, MAX_BLOCKS, 1, 1, &id, &pos, &slot, qs, &len, tab, 1, &li};
    CHECK(model_forward(m, &b, out) != 0 && strstr(err_last(), "out of range"), "token id %d: %s", V,
          err_last());
    id = 3;
    tab[0] = POOL;
    CHECK(model_forward(m, &b, out) != 0, "block id beyond the pool refused");
    tab[0] = 1;
    pos = 1;
    CHECK(model_forward(m, &b, out) != 0, "position beyond seq_len refused");
    pos = 0;
    CHECK(model_forward(m, &b, out) == 0, "valid batch after bad ones: %s", err_last());
  }
  CHECK(model_alloc_cache(m, POOL, 12, DTYPE_F32, 128, 4, MAX_BLOCKS) != 0 && strstr(err_last(), "8, 16 or 32"),
        "block size 12 refused: %s", err_last());
  CHECK(model_alloc_cache(m, POOL, 16, DTYPE_BF16, 128, 4, MAX_BLOCKS) != 0 && strstr(err_last(), "--pa-cache-type"),
        "bf16 cache refused on cpu: %s", err_last());
  CHECK(model_kv_block_bytes(c, 16, DTYPE_F8E4M3) == (size_t)2 * 5 * 4 * 16 * 8, "f8 kv block bytes: a quarter of f32");
  CHECK(model_kv_block_bytes(c, 16, DTYPE_F32) == (size_t)2 * 5 * 4 * 16 * 8 * 4, "kv block bytes");

  free(ref_a), free(ref_b), free(ref_c), free(out);
  model_free(m);
  be->ops->destroy(be);
  return test_finish("test_model_forward");
}
