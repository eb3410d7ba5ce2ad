/* fuzz_tokenizer.c - fuzz target: arbitrary bytes through tokenizer_encode and arbitrary id
 * lists through tokenizer_decode and the streaming detokenizer, on two small tokenizers built
 * here (byte-level BPE with a Llama-3 regex and added tokens; SentencePiece-style BPE with
 * byte fallback) plus the shared SPM GGUF when it is present. Beyond "no crash" it checks two
 * properties: byte-level BPE is lossless (decode(encode(s)) == s for valid UTF-8), and the
 * streamed deltas always concatenate to the full decode. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

static const char *const byte_level_merges[][2] = {
    {"\xc4\xa0", "t"}, {"h", "e"}, {"\xc4\xa0t", "he"}, {"i", "n"}, {"\xc4\xa0", "a"}, {"e", "r"},
    {"o", "n"}, {"\xc4\xa0", "s"}, {"r", "e"}, {"\xc4\xa0", "w"}, {"\xc4\xa0" "a", "n"}, {"\xc4\xa0" "an", "d"},
    {"\xc4\x8a", "\xc4\x8a"}, {"\xc4\xa0", "\xc4\xa0"}, {"1", "2"}, {"\xc3\xa4", "\xc2\xbd"}};

static const char *const spm_merges[][2] = {
    {"\xe2\x96\x81", "t"}, {"h", "e"}, {"\xe2\x96\x81t", "he"}, {"i", "n"}, {"\xe2\x96\x81", "a"},
    {"e", "r"}, {"o", "n"}, {"\xe2\x96\x81", "\xe2\x96\x81"}, {"\xe2\x96\x81", "w"}, {"r", "e"}};

static void add_merges(cJSON *vocab, cJSON *merges, const char *const (*m)[2], int n, int *next) {
  for (int i = 0; i < n; i++) {
    char joined[64];
    snprintf(joined, sizeof joined, "%s%s", m[i][0], m[i][1]);
    if (!cJSON_GetObjectItemCaseSensitive(vocab, joined))
      cJSON_AddNumberToObject(vocab, joined, (*next)++);
    cJSON *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateString(m[i][0]));
    cJSON_AddItemToArray(pair, cJSON_CreateString(m[i][1]));
    cJSON_AddItemToArray(merges, pair);
  }
}

static void add_added(cJSON *arr, int id, const char *text, int special, int lstrip, int rstrip) {
  cJSON *a = cJSON_CreateObject();
  cJSON_AddNumberToObject(a, "id", id);
  cJSON_AddStringToObject(a, "content", text);
  cJSON_AddBoolToObject(a, "special", special);
  cJSON_AddBoolToObject(a, "lstrip", lstrip);
  cJSON_AddBoolToObject(a, "rstrip", rstrip);
  cJSON_AddBoolToObject(a, "single_word", 0);
  cJSON_AddBoolToObject(a, "normalized", 0);
  cJSON_AddItemToArray(arr, a);
}

static cJSON *typed(const char *type) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", type);
  return o;
}

/* Writes JSON to a temporary file, loads it, removes the file. */
static struct tokenizer *load_json(cJSON *j) {
  char *txt = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  char path[] = "/tmp/pagoda_fuzz_tok_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || !txt) {
    free(txt);
    return NULL;
  }
  size_t n = strlen(txt);
  int ok = write(fd, txt, n) == (ssize_t)n;
  close(fd);
  free(txt);
  struct tokenizer *t = ok ? tokenizer_load(path) : NULL;
  unlink(path);
  return t;
}

static struct tokenizer *make_byte_level(void) {
  cJSON *j = cJSON_CreateObject(), *model = typed("BPE"), *vocab = cJSON_CreateObject();
  cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
  int next = 0;
  for (int b = 0; b < 256; b++) {
    char enc[8] = {0};
    unicode_utf8_encode(unicode_byte_to_cp((uint8_t)b), enc);
    cJSON_AddNumberToObject(vocab, enc, next++);
  }
  add_merges(vocab, merges, byte_level_merges, (int)(sizeof byte_level_merges / sizeof byte_level_merges[0]),
             &next);
  cJSON_AddItemToObject(model, "vocab", vocab);
  cJSON_AddItemToObject(model, "merges", merges);
  cJSON_AddBoolToObject(model, "ignore_merges", 1);
  add_added(added, next, "<|im_start|>", 1, 0, 0);
  add_added(added, next + 1, "<|im_end|>", 1, 0, 1);
  add_added(added, next + 2, "<mask>", 1, 1, 0);
  add_added(added, next + 3, "\xe2\x82\xac\xe2\x82\xac", 0, 0, 0);
  cJSON *pre = typed("Sequence"), *list = cJSON_CreateArray(), *split = typed("Split");
  cJSON *pat = cJSON_CreateObject();
  cJSON_AddStringToObject(pat, "Regex",
                          "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                          "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  cJSON_AddItemToObject(split, "pattern", pat);
  cJSON_AddStringToObject(split, "behavior", "Isolated");
  cJSON_AddItemToArray(list, split);
  cJSON *bl = typed("ByteLevel");
  cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
  cJSON_AddBoolToObject(bl, "use_regex", 0);
  cJSON_AddItemToArray(list, bl);
  cJSON_AddItemToObject(pre, "pretokenizers", list);
  cJSON_AddItemToObject(j, "model", model);
  cJSON_AddItemToObject(j, "added_tokens", added);
  cJSON_AddItemToObject(j, "pre_tokenizer", pre);
  cJSON_AddItemToObject(j, "decoder", typed("ByteLevel"));
  return load_json(j);
}

static struct tokenizer *make_spm(void) {
  cJSON *j = cJSON_CreateObject(), *model = typed("BPE"), *vocab = cJSON_CreateObject();
  cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
  int next = 0;
  const char *specials[] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 3; i++)
    cJSON_AddNumberToObject(vocab, specials[i], next++);
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    cJSON_AddNumberToObject(vocab, name, next++);
  }
  cJSON_AddNumberToObject(vocab, "\xe2\x96\x81", next++);
  for (char c = 'a'; c <= 'z'; c++) {
    char s[2] = {c, 0};
    cJSON_AddNumberToObject(vocab, s, next++);
  }
  add_merges(vocab, merges, spm_merges, (int)(sizeof spm_merges / sizeof spm_merges[0]), &next);
  cJSON_AddItemToObject(model, "vocab", vocab);
  cJSON_AddItemToObject(model, "merges", merges);
  cJSON_AddBoolToObject(model, "byte_fallback", 1);
  cJSON_AddBoolToObject(model, "fuse_unk", 1);
  cJSON_AddStringToObject(model, "unk_token", "<unk>");
  add_added(added, 0, "<unk>", 1, 0, 0);
  add_added(added, 1, "<s>", 1, 0, 0);
  add_added(added, 2, "</s>", 1, 0, 0);
  cJSON *norm = typed("Sequence"), *nl = cJSON_CreateArray(), *prep = typed("Prepend"), *rep = typed("Replace");
  cJSON_AddStringToObject(prep, "prepend", "\xe2\x96\x81");
  cJSON *pat = cJSON_CreateObject();
  cJSON_AddStringToObject(pat, "String", " ");
  cJSON_AddItemToObject(rep, "pattern", pat);
  cJSON_AddStringToObject(rep, "content", "\xe2\x96\x81");
  cJSON_AddItemToArray(nl, prep);
  cJSON_AddItemToArray(nl, rep);
  cJSON_AddItemToObject(norm, "normalizers", nl);
  cJSON *dec = typed("Sequence"), *dl = cJSON_CreateArray(), *drep = typed("Replace"), *strip = typed("Strip");
  cJSON *dpat = cJSON_CreateObject();
  cJSON_AddStringToObject(dpat, "String", "\xe2\x96\x81");
  cJSON_AddItemToObject(drep, "pattern", dpat);
  cJSON_AddStringToObject(drep, "content", " ");
  cJSON_AddStringToObject(strip, "content", " ");
  cJSON_AddNumberToObject(strip, "start", 1);
  cJSON_AddNumberToObject(strip, "stop", 0);
  cJSON_AddItemToArray(dl, drep);
  cJSON_AddItemToArray(dl, typed("ByteFallback"));
  cJSON_AddItemToArray(dl, typed("Fuse"));
  cJSON_AddItemToArray(dl, strip);
  cJSON_AddItemToObject(dec, "decoders", dl);
  cJSON_AddItemToObject(j, "model", model);
  cJSON_AddItemToObject(j, "added_tokens", added);
  cJSON_AddItemToObject(j, "normalizer", norm);
  cJSON_AddItemToObject(j, "decoder", dec);
  return load_json(j);
}

static struct tokenizer *toks[3];
static int n_toks;

static void setup(void) {
  if (n_toks)
    return;
  toks[n_toks++] = make_byte_level();
  toks[n_toks++] = make_spm();
  const char *g = getenv("PAGODA_TESTDATA") ? test_shared_path("vocab/ggml-vocab-llama-spm.gguf") : NULL;
  if (g)
    toks[n_toks++] = tokenizer_load(g);
  for (int i = 0; i < 2; i++)
    if (!toks[i]) {
      fprintf(stderr, "fuzz_tokenizer: could not build tokenizer %d\n", i);
      abort();
    }
}

/* Decodes IDS whole and streamed; aborts if the two differ. Returns the decode (malloc'd). */
static char *decode_both(const struct tokenizer *t, const int32_t *ids, int n, int skip, int *len_out) {
  int len = tokenizer_decode(t, ids, n, skip, NULL, 0);
  struct detokenizer *d = detokenizer_create(t, skip);
  char delta[1024];
  char *acc = malloc((size_t)(len > 0 ? len : 0) + 1024);
  size_t al = 0;
  int failed = 0;
  for (int i = 0; i < n; i++) {
    int k = detokenizer_push(d, ids[i], delta, sizeof delta);
    if (k < 0) {
      failed = 1;
      continue; /* an out-of-range id is refused and the stream goes on */
    }
    if (len >= 0) {
      if (al + (size_t)k > (size_t)len + 8)
        abort();
      memcpy(acc + al, delta, (size_t)k);
    }
    al += (size_t)k;
  }
  int k = detokenizer_flush(d, delta, sizeof delta);
  if (k < 0)
    abort();
  if (len >= 0) {
    memcpy(acc + al, delta, (size_t)k);
    al += (size_t)k;
    if (failed || al != (size_t)len)
      abort();
    char *full = malloc((size_t)len + 1);
    tokenizer_decode(t, ids, n, skip, full, (size_t)len + 1);
    if (memcmp(full, acc, (size_t)len))
      abort();
    free(full);
  } else if (!failed) {
    abort(); /* decode refused ids that the detokenizer accepted */
  }
  detokenizer_free(d);
  free(acc);
  *len_out = len;
  return NULL;
}

int fuzz_one(const uint8_t *data, size_t size) {
  setup();
  if (size < 1)
    return 0;
  uint8_t mode = data[0];
  const char *text = (const char *)data + 1;
  size_t len = size - 1;
  const struct tokenizer *t = toks[(mode >> 2) % n_toks];
  if ((mode & 3) != 3) {
    int parse = mode & 1;
    int32_t ids[512];
    int n = tokenizer_encode(t, text, len, (mode >> 1) & 1, parse, ids, 512);
    if (n < 0)
      abort(); /* any bytes are encodable */
    int32_t *all = malloc((size_t)(n ? n : 1) * sizeof *all);
    if (tokenizer_encode(t, text, len, (mode >> 1) & 1, parse, all, n) != n)
      abort();
    for (int i = 0; i < n; i++)
      if (all[i] < 0 || all[i] >= tokenizer_vocab_size(t))
        abort();
    int dl;
    decode_both(t, all, n, 0, &dl);
    /* Byte-level BPE without special parsing or BOS is lossless on valid UTF-8. */
    if (t == toks[0] && !parse && !((mode >> 1) & 1) && unicode_utf8_valid(text, len)) {
      char *dec = malloc((size_t)dl + 1);
      tokenizer_decode(t, all, n, 0, dec, (size_t)dl + 1);
      if ((size_t)dl != len || memcmp(dec, text, len))
        abort();
      free(dec);
    }
    free(all);
  } else {
    /* Raw ids, some out of range or negative. */
    int n = (int)(len / 2);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    int vs = tokenizer_vocab_size(t);
    for (int i = 0; i < n; i++) {
      int v = data[1 + 2 * i] | (data[2 + 2 * i] << 8);
      ids[i] = v == 0xFFFF ? -1 : v % (vs + 2);
    }
    int dl;
    decode_both(t, ids, n, (mode >> 4) & 1, &dl);
    free(ids);
  }
  return 0;
}

void fuzz_seeds(void (*add)(const uint8_t *data, size_t size)) {
  static const char *const seeds[] = {
      "\x00Hello world, it's 2024! <|im_start|>user\nhi<|im_end|> \xe2\x82\xac\xe2\x82\xac",
      "\x01<|im_start|>system\n<mask>  x <|im_end|>\n\n",
      "\x04 the quick  brown\tfox \xf0\x9f\xa6\x99 caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd",
      "\x05<s> a</s>  b",
      "\x08\xff\xfe\x80\xc3( x \xed\xa0\x80",
      "\x03\x01\x00\x02\x01\xff\xff\x10\x27\x05\x01",
      "\x07\x03\x01\x04\x01\x05\x01\x06\x01",
      "\x13\x01\x00\x02\x00\x41\x00"};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
    add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
