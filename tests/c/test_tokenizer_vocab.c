/* test_tokenizer_vocab.c - pagoda's tokenizers against HF tokenizers' ids for llama.cpp's
 * vocabulary test strings: the GGUF vocabularies (llama-spm, phi-3, gpt-2), Phi-3-mini's
 * tokenizer.json (same cases) and Phi-2's tokenizer.json (the gpt-2 strings, ids from HF
 * tokenizers 0.23). Also round trips, the streaming detokenizer, add/parse/skip special. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "text/tokenizer.h"
#include "util/log.h"

#define SEP "\n__ggml_vocab_test__\n"
#define MAX_CASES 256

struct cases {
  char *inp, *out;            /* owned file contents, cut in place */
  const char *text[MAX_CASES];
  size_t len[MAX_CASES];
  const char *ids[MAX_CASES]; /* the expected line: " 1 2 3" */
  int n;
};

/* Takes ownership of OUT_PATH (may be NULL). */
static int load_cases(struct cases *c, const char *inp_rel, char *out_path) {
  memset(c, 0, sizeof *c);
  const char *ip = out_path ? test_shared_path(inp_rel) : NULL;
  if (!ip) {
    free(out_path);
    return -1;
  }
  size_t n;
  c->out = test_read_file(out_path, &n);
  free(out_path);
  c->inp = test_read_file(ip, &n);
  if (!c->inp || !c->out)
    return -1;
  char *p = c->inp;
  for (char *s; (s = strstr(p, SEP)) && c->n < MAX_CASES; p = s + strlen(SEP)) {
    *s = 0;
    c->text[c->n] = p;
    c->len[c->n] = (size_t)(s - p);
    c->n++;
  }
  char *q = c->out;
  for (int i = 0; i < c->n; i++) {
    char *nl = strchr(q, '\n');
    if (!nl && i + 1 < c->n)
      return -1;
    if (nl)
      *nl = 0;
    c->ids[i] = q;
    q = nl ? nl + 1 : q + strlen(q);
  }
  return 0;
}

static void free_cases(struct cases *c) {
  free(c->inp);
  free(c->out);
}

static int parse_line(const char *line, int32_t *ids, int max) {
  int n = 0;
  char *end;
  for (const char *p = line; n < max;) {
    long v = strtol(p, &end, 10);
    if (end == p)
      break;
    ids[n++] = (int32_t)v;
    p = end;
  }
  return n;
}

/* Streams IDS with a tiny output buffer (CAP bytes): what does not fit is carried to the next
 * call, and repeated flushes drain it. */
static void check_stream_small(const struct tokenizer *t, const int32_t *ids, int n, const char *full,
                               size_t full_len, size_t cap, const char *what) {
  struct detokenizer *d = detokenizer_create(t, 0);
  char *acc = malloc(full_len + 64), delta[64];
  size_t len = 0;
  int ok = d && acc && cap <= sizeof delta;
  for (int i = 0; ok && i <= n + 64; i++) {
    int k = i < n ? detokenizer_push(d, ids[i], delta, cap) : detokenizer_flush(d, delta, cap);
    if (k < 0 || len + (size_t)k > full_len) {
      ok = 0;
      break;
    }
    memcpy(acc + len, delta, (size_t)k);
    len += (size_t)k;
    if (i >= n && k == 0)
      break;
  }
  CHECK(ok && len == full_len && !memcmp(acc, full, len), "%s: deltas through a %zu-byte buffer differ", what, cap);
  free(acc);
  detokenizer_free(d);
}

/* Streams IDS through a detokenizer and checks that the deltas concatenate to FULL. */
static void check_stream(const struct tokenizer *t, const int32_t *ids, int n, const char *full, size_t full_len,
                         const char *what) {
  check_stream_small(t, ids, n, full, full_len, 5, what);
  struct detokenizer *d = detokenizer_create(t, 0);
  CHECK(d != NULL, "%s: detokenizer_create: %s", what, err_last());
  if (!d)
    return;
  size_t cap = full_len * 3 + 1024, len = 0;
  char *acc = malloc(cap);
  char delta[256];
  int ok = 1;
  for (int i = 0; i < n && ok; i++) {
    int k = detokenizer_push(d, ids[i], delta, sizeof delta);
    if (k < 0 || len + (size_t)k >= cap) {
      ok = 0;
      break;
    }
    memcpy(acc + len, delta, (size_t)k);
    len += (size_t)k;
  }
  int k = ok ? detokenizer_flush(d, delta, sizeof delta) : -1;
  if (k >= 0) {
    memcpy(acc + len, delta, (size_t)k);
    len += (size_t)k;
  }
  CHECK(ok && k >= 0 && len == full_len && !memcmp(acc, full, len), "%s: streamed deltas differ from the full decode",
        what);
  free(acc);
  detokenizer_free(d);
}

/* Every case: exact ids, streamed decode == decode, decode(encode(s)) == s. */
static void run_cases(const struct tokenizer *t, const struct cases *c, const char *name, int lossless) {
  int32_t got[4096], want[4096];
  int failed = 0;
  for (int i = 0; i < c->n; i++) {
    int n = tokenizer_encode(t, c->text[i], c->len[i], 0, 0, got, 4096);
    int m = parse_line(c->ids[i], want, 4096);
    int same = n == m && !memcmp(got, want, (size_t)n * sizeof *got);
    if (!same)
      failed++;
    CHECK(same, "%s case %d (\"%.40s\"): %d ids, expected %d", name, i, c->text[i], n, m);
    if (n < 0)
      continue;
    int dl = tokenizer_decode(t, got, n, 0, NULL, 0);
    CHECK(dl >= 0, "%s case %d: decode failed: %s", name, i, err_last());
    if (dl < 0)
      continue;
    char *dec = malloc((size_t)dl + 1);
    tokenizer_decode(t, got, n, 0, dec, (size_t)dl + 1);
    if (lossless)
      CHECK((size_t)dl == c->len[i] && !memcmp(dec, c->text[i], c->len[i]),
            "%s case %d: decode(encode(s)) != s (\"%.40s\" -> \"%.40s\")", name, i, c->text[i], dec);
    check_stream(t, got, n, dec, (size_t)dl, name);
    free(dec);
  }
  printf("%s: %d cases, %d differ from HF\n", name, c->n, failed);
}

static int vocab_suite(const char *gguf_rel, const char *name) {
  char inp[256], out[256];
  snprintf(inp, sizeof inp, "%s.inp", gguf_rel);
  snprintf(out, sizeof out, "%s.out", gguf_rel);
  struct cases c;
  const char *op = test_shared_path(out);
  if (load_cases(&c, inp, op ? strdup(op) : NULL)) {
    free_cases(&c);
    return -1;
  }
  struct tokenizer *t = tokenizer_load(test_shared_path(gguf_rel));
  CHECK(t != NULL, "%s: %s", name, err_last());
  if (t)
    run_cases(t, &c, name, 1);
  tokenizer_free(t);
  free_cases(&c);
  return 0;
}

/* Byte-level BPE splits a 4-byte character over several tokens: nothing is emitted until the
 * character is complete. */
static void byte_level_stream_check(void) {
  const char *p = test_shared_path("vocab/ggml-vocab-gpt-2.gguf");
  struct tokenizer *t = p ? tokenizer_load(p) : NULL;
  if (!t)
    return;
  const char *s = "\xf0\x9f\xa6\x99!";
  int32_t ids[16];
  int n = tokenizer_encode(t, s, strlen(s), 0, 0, ids, 16);
  CHECK(n >= 3, "gpt-2: U+1F999 should take several byte-level tokens (%d ids)", n);
  struct detokenizer *d = detokenizer_create(t, 0);
  char out[256], all[64] = {0};
  size_t len = 0;
  for (int i = 0; i < n && i < 16; i++) {
    int k = detokenizer_push(d, ids[i], out, sizeof out);
    CHECK(k >= 0, "push failed");
    if (k > 0) {
      if (len == 0)
        CHECK(k >= 4 && !memcmp(out, s, 4), "first delta (token %d) is not the whole character", i);
      memcpy(all + len, out, (size_t)k);
      len += (size_t)k;
    }
  }
  CHECK(len == strlen(s) && !memcmp(all, s, len), "byte-level stream gave %zu bytes", len);
  detokenizer_free(d);
  tokenizer_free(t);
}

/* Special-token handling on the SPM GGUF (BOS from its metadata) and Phi-3's tokenizer.json. */
static void special_checks(void) {
  const char *spm = test_shared_path("vocab/ggml-vocab-llama-spm.gguf");
  struct tokenizer *t = spm ? tokenizer_load(spm) : NULL;
  if (t) {
    int32_t ids[64];
    /* llama.cpp's SPM default: BOS (id 1) added, no EOS. */
    CHECK(tokenizer_bos_id(t) == 1 && tokenizer_eos_id(t) == 2, "llama-spm bos/eos %d/%d", tokenizer_bos_id(t),
          tokenizer_eos_id(t));
    int n0 = tokenizer_encode(t, "Hello", 5, 0, 0, ids, 64);
    int n1 = tokenizer_encode(t, "Hello", 5, 1, 0, ids, 64);
    CHECK(n1 == n0 + 1 && ids[0] == 1, "add_special adds BOS: %d vs %d ids, first %d", n1, n0, ids[0]);
    CHECK(tokenizer_is_eog(t, 2), "</s> ends generation");
    /* "<s>" in user text stays text; with parse_special it is BOS. */
    int a = tokenizer_encode(t, "<s>hi", 5, 0, 0, ids, 64);
    CHECK(a > 1 && ids[0] != 1, "<s> parsed without parse_special");
    int b = tokenizer_encode(t, "<s>hi", 5, 0, 1, ids, 64);
    CHECK(b >= 2 && ids[0] == 1, "<s> not parsed with parse_special (%d ids, first %d)", b, ids[0]);
    /* Byte-fallback: U+1F999 is no SPM token. A run of byte tokens is held until it ends (a
     * later byte could make the whole run invalid, and HF then gives one U+FFFD per byte). */
    int n = tokenizer_encode(t, "\xf0\x9f\xa6\x99", 4, 0, 0, ids, 64);
    CHECK(n == 5, "llama emoji: %d ids (expected the space and 4 bytes)", n);
    struct detokenizer *d = detokenizer_create(t, 0);
    char out[256];
    int lens[8] = {0};
    for (int i = 0; i < n && i < 8; i++)
      lens[i] = detokenizer_push(d, ids[i], out, sizeof out);
    int fl = detokenizer_flush(d, out, sizeof out);
    CHECK(n == 5 && lens[1] == 0 && lens[2] == 0 && lens[3] == 0 && lens[4] == 0 && fl == 4 &&
              !memcmp(out, "\xf0\x9f\xa6\x99", 4),
          "byte run held to its end: %d %d %d %d, flush %d", lens[1], lens[2], lens[3], lens[4], fl);
    /* A run ends at the next non-byte token: "Hello" after the emoji releases it. */
    detokenizer_reset(d);
    for (int i = 1; i < 5; i++)
      detokenizer_push(d, ids[i], out, sizeof out);
    int h = detokenizer_push(d, 15043, out, sizeof out);
    CHECK(h == 10 && !memcmp(out, "\xf0\x9f\xa6\x99 Hello", 10), "run released by a text token (%d)", h);
    /* A prompt's held run is not output after set_continuation (the server primes the
     * detokenizer with the prompt's tail and discards that text)... */
    detokenizer_reset(d);
    for (int i = 0; i < 5; i++)
      detokenizer_push(d, ids[i], out, sizeof out);
    detokenizer_set_continuation(d);
    h = detokenizer_push(d, 15043, out, sizeof out);
    CHECK(h == 6 && !memcmp(out, " Hello", 6), "prompt run leaked into the continuation (%d)", h);
    /* ...but an unfinished character at the prompt's end is completed by the continuation. */
    detokenizer_reset(d);
    detokenizer_push(d, ids[1], out, sizeof out);
    detokenizer_push(d, ids[2], out, sizeof out);
    detokenizer_set_continuation(d);
    detokenizer_push(d, ids[3], out, sizeof out);
    detokenizer_push(d, ids[4], out, sizeof out);
    fl = detokenizer_flush(d, out, sizeof out);
    CHECK(fl == 4 && !memcmp(out, "\xf0\x9f\xa6\x99", 4), "character split at the prompt's end: %d bytes", fl);
    /* An incomplete run becomes one U+FFFD per byte, as HF's ByteFallback decoder gives. */
    detokenizer_reset(d);
    detokenizer_push(d, ids[1], out, sizeof out);
    detokenizer_push(d, ids[2], out, sizeof out);
    int f = detokenizer_flush(d, out, sizeof out);
    CHECK(f == 6 && !memcmp(out, "\xef\xbf\xbd\xef\xbf\xbd", 6), "flush of an incomplete run: %d bytes", f);
    int32_t bad = tokenizer_vocab_size(t);
    CHECK(detokenizer_push(d, bad, out, sizeof out) < 0, "out-of-range id accepted by the detokenizer");
    CHECK(tokenizer_decode(t, &bad, 1, 0, out, sizeof out) < 0, "out-of-range id accepted by decode");
    int32_t neg = -1;
    CHECK(tokenizer_decode(t, &neg, 1, 0, out, sizeof out) < 0, "negative id accepted by decode");
    detokenizer_free(d);
    /* skip_special drops BOS. */
    int32_t two[2] = {1, 15043};
    char with[64], without[64];
    tokenizer_decode(t, two, 2, 0, with, sizeof with);
    tokenizer_decode(t, two, 2, 1, without, sizeof without);
    CHECK(!strcmp(with, "<s> Hello") && !strcmp(without, "Hello"), "skip_special: '%s' / '%s'", with, without);
  }
  tokenizer_free(t);

  const char *phi3 = test_shared_path("tokenizers/phi-3-mini/tokenizer.json");
  t = phi3 ? tokenizer_load(phi3) : NULL;
  CHECK(!phi3 || t, "phi-3 tokenizer.json: %s", err_last());
  if (t) {
    int32_t ids[64];
    /* tokenizer_config.json: add_bos_token false, so nothing is added. */
    int n0 = tokenizer_encode(t, "Hi", 2, 0, 0, ids, 64);
    int n1 = tokenizer_encode(t, "Hi", 2, 1, 0, ids, 64);
    CHECK(n0 == n1, "phi-3 add_special added tokens despite add_bos_token=false");
    /* <|user|> is id 32010 in its added_tokens (special, rstrip). */
    const char *s = "<|user|>\nHi";
    int a = tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64);
    CHECK(a >= 2 && ids[0] == 32010 && ids[1] != 13, "parse_special: <|user|> then rstrip'ed newline (%d ids)", a);
    int b = tokenizer_encode(t, s, strlen(s), 0, 0, ids, 64);
    CHECK(b > 3 && ids[0] != 32010, "<|user|> parsed without parse_special");
    CHECK(tokenizer_is_eog(t, 32007) && tokenizer_is_eog(t, 32000), "<|end|> and <|endoftext|> end generation");
    CHECK(tokenizer_chat_template(t) != NULL, "phi-3 chat template missing");
    /* The GGUF of the same vocabulary gives the same ids for a chat prompt (its token flags
     * come from llama.cpp's Phi-3 rules, those of the JSON from its added_tokens). */
    const char *g = test_shared_path("vocab/ggml-vocab-phi-3.gguf");
    struct tokenizer *tg = g ? tokenizer_load(g) : NULL;
    const char *chat = "<|system|>\nBe brief.<|end|>\n<|user|>\n  Hi</s> there<|end|>\n<|assistant|>\n";
    for (int parse = 0; tg && parse < 2; parse++) {
      int32_t a2[128], b2[128];
      int na = tokenizer_encode(t, chat, strlen(chat), 0, parse, a2, 128);
      int nb = tokenizer_encode(tg, chat, strlen(chat), 0, parse, b2, 128);
      CHECK(na > 0 && na == nb && !memcmp(a2, b2, (size_t)na * sizeof *a2),
            "phi-3 chat prompt (parse_special=%d): json %d ids, gguf %d ids", parse, na, nb);
    }
    tokenizer_free(tg);
  }
  tokenizer_free(t);
}

/* A continuation after a prompt that decodes to nothing keeps its leading space once the
 * detokenizer is marked as mid-text (llama.cpp prints " Once" after a lone BOS on stories260K;
 * tests/fixtures/stories260K.llamacpp_greedy.jsonl, prompt ""), while the full decode strips
 * it as HF does. Ids from llama.cpp: BOS 1, "\u2581Once" 403, "\u2581upon" 407. */
static void continuation_check(void) {
  const char *path = test_shared_path("models/stories260K.gguf");
  if (!path)
    return;
  struct tokenizer *t = tokenizer_load(path);
  CHECK(t != NULL, "stories260K: %s", err_last());
  if (!t)
    return;
  const int32_t ids[3] = {1, 403, 407};
  char full[64], a[64], b[64], c[64];
  CHECK(tokenizer_decode(t, ids, 3, 1, full, sizeof full) == 9 && !strcmp(full, "Once upon"), "%s", full);
  struct detokenizer *d = detokenizer_create(t, 1);
  CHECK(d != NULL, "%s", err_last());
  if (!d) {
    tokenizer_free(t);
    return;
  }
  int na = detokenizer_push(d, ids[0], a, sizeof a);
  detokenizer_set_continuation(d);
  int nb = detokenizer_push(d, ids[1], b, sizeof b);
  int nc = detokenizer_push(d, ids[2], c, sizeof c);
  CHECK(na == 0 && nb == 5 && !strcmp(b, " Once") && nc == 5 && !strcmp(c, " upon"), "'%s' '%s'", b, c);
  /* Marking after text was decoded changes nothing. */
  detokenizer_reset(d);
  detokenizer_push(d, ids[1], b, sizeof b);
  detokenizer_set_continuation(d);
  nc = detokenizer_push(d, ids[2], c, sizeof c);
  CHECK(!strcmp(b, "Once") && nc == 5 && !strcmp(c, " upon"), "'%s' '%s'", b, c);
  detokenizer_free(d);
  tokenizer_free(t);
}

int main(void) {
  if (!test_shared_path("vocab/ggml-vocab-gpt-2.gguf"))
    return test_skip("shared test data absent");
  vocab_suite("vocab/ggml-vocab-llama-spm.gguf", "llama-spm.gguf");
  vocab_suite("vocab/ggml-vocab-phi-3.gguf", "phi-3.gguf");
  vocab_suite("vocab/ggml-vocab-gpt-2.gguf", "gpt-2.gguf");

  /* The same phi-3 cases through its tokenizer.json. */
  struct cases c;
  const char *op = test_shared_path("vocab/ggml-vocab-phi-3.gguf.out");
  if (!load_cases(&c, "vocab/ggml-vocab-phi-3.gguf.inp", op ? strdup(op) : NULL)) {
    struct tokenizer *t = tokenizer_load(test_shared_path("tokenizers/phi-3-mini/tokenizer.json"));
    CHECK(t != NULL, "phi-3 tokenizer.json: %s", err_last());
    if (t)
      run_cases(t, &c, "phi-3 tokenizer.json", 1);
    tokenizer_free(t);
  }
  free_cases(&c);

  /* Phi-2's tokenizer.json on the gpt-2 strings, against HF's ids in vocab-test.out. */
  op = test_shared_path("tokenizers/phi-2/vocab-test.out");
  if (!load_cases(&c, "vocab/ggml-vocab-gpt-2.gguf.inp", op ? strdup(op) : NULL)) {
    struct tokenizer *t = tokenizer_load(test_shared_path("tokenizers/phi-2"));
    CHECK(t != NULL, "phi-2 directory: %s", err_last());
    if (t)
      run_cases(t, &c, "phi-2 tokenizer.json", 1);
    tokenizer_free(t);
  }
  free_cases(&c);

  special_checks();
  byte_level_stream_check();
  continuation_check();
  return test_finish("test_tokenizer_vocab");
}
