/* test_tokenizer_gguf_pre.c - every tokenizer.ggml.pre name pagoda knows loads, and its regex
 * list splits text into pieces that byte-level BPE encodes losslessly; a few names are checked
 * for the splits llama.cpp's regexes make (digits in threes for llama-bpe, single digits for
 * qwen2, punctuation runs for falcon). The GGUF files are written here (no shared data). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "util/log.h"

struct buf {
  uint8_t *d;
  size_t n, cap;
};

static void put(struct buf *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 256;
    b->d = realloc(b->d, b->cap);
  }
  memcpy(b->d + b->n, p, n);
  b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}

/* Vocabulary: the 256 byte-level characters, then the merged tokens below. */
static const char *const merges[][2] = {{"1", "2"}, {"12", "3"}, {"H", "e"}, {"He", "l"}, {"Hel", "l"},
                                        {"Hell", "o"}, {"\xc4\xa0", "w"}, {"!", "!"}};

static char *write_gguf(const char *pre) {
  struct buf b = {0};
  char tok[256 + 8][16];
  int n = 0;
  for (int i = 0; i < 256; i++) {
    memset(tok[n], 0, 16);
    unicode_utf8_encode(unicode_byte_to_cp((uint8_t)i), tok[n]);
    n++;
  }
  for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
    snprintf(tok[n++], 16, "%s%s", merges[i][0], merges[i][1]);
  put(&b, "GGUF", 4);
  put_u32(&b, 3);
  put_u64(&b, 0); /* tensors */
  put_u64(&b, 4); /* kvs */
  put_str(&b, "tokenizer.ggml.model");
  put_u32(&b, 8);
  put_str(&b, "gpt2");
  put_str(&b, "tokenizer.ggml.pre");
  put_u32(&b, 8);
  put_str(&b, pre);
  put_str(&b, "tokenizer.ggml.tokens");
  put_u32(&b, 9);
  put_u32(&b, 8);
  put_u64(&b, (uint64_t)n);
  for (int i = 0; i < n; i++)
    put_str(&b, tok[i]);
  put_str(&b, "tokenizer.ggml.merges");
  put_u32(&b, 9);
  put_u32(&b, 8);
  put_u64(&b, sizeof merges / sizeof merges[0]);
  for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
    char m[32];
    snprintf(m, sizeof m, "%s %s", merges[i][0], merges[i][1]);
    put_str(&b, m);
  }
  char *path = strdup("/tmp/pagoda_test_pre_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, b.d, b.n) != (ssize_t)b.n) {
    free(b.d);
    free(path);
    return NULL;
  }
  close(fd);
  free(b.d);
  return path;
}

static const char *const names[] = {
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
    "smaug-bpe", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "starcoder", "refact",
    "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "gpt-2", "phi-2", "mpt", "olmo", "jais",
    "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "roberta-bpe", "jina-v1-en",
    "jina-v2-code", "exaone4", "trillion", "mellum", "qwen2", "qwen2.5", "qwen-2.5", "deepseek-r1-qwen",
    "megrez", "hunyuan", "kormo", "stablelm2", "poro-chat", "bloom", "gpt3-finnish", "chatglm-bpe", "glm4",
    "viking", "tekken", "gpt-4o", "llama4", "seed-coder", "default"};

static const char text[] = "Hello world!! It's 2024, don't   you\tthink? \xe4\xbd\xa0\xe5\xa5\xbd "
                           "\xf0\x9f\xa6\x99 x1234567 \xd9\xa3 \n\n end  ";

/* Ids of S under tokenizer T, as a space-separated string (static buffer). */
static const char *ids_of(struct tokenizer *t, const char *s) {
  static char out[1024];
  int32_t ids[256];
  int n = tokenizer_encode(t, s, strlen(s), 0, 0, ids, 256);
  size_t w = 0;
  out[0] = 0;
  for (int i = 0; i < n && w + 16 < sizeof out; i++)
    w += (size_t)snprintf(out + w, sizeof out - w, i ? " %d" : "%d", (int)ids[i]);
  return out;
}

int main(void) {
  int base = 256; /* id of the first merged token: "12" */
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char *path = write_gguf(names[i]);
    REQUIRE(path != NULL, "cannot write a temporary GGUF");
    struct tokenizer *t = tokenizer_load(path);
    unlink(path);
    free(path);
    CHECK(t != NULL, "pre '%s': %s", names[i], err_last());
    if (!t)
      continue;
    int32_t ids[512];
    int n = tokenizer_encode(t, text, strlen(text), 0, 0, ids, 512);
    char dec[512];
    int dl = tokenizer_decode(t, ids, n, 0, dec, sizeof dec);
    CHECK(n > 0 && dl == (int)strlen(text) && !memcmp(dec, text, strlen(text)), "pre '%s': round trip", names[i]);
    /* "1234567": llama-bpe groups digits by three ("123" "456" "7"); qwen2 keeps them single. */
    char want[64];
    if (!strcmp(names[i], "llama-bpe")) {
      const char *got = ids_of(t, "x1234567");
      /* Byte b of a printable ASCII character is token b. 'x', then "123" (merged), "456"
       * (no merge), "7". */
      snprintf(want, sizeof want, "%d %d %d %d %d %d", 'x', base + 1, '4', '5', '6', '7');
      CHECK(!strcmp(got, want), "llama-bpe digits: %s, want %s", got, want);
    }
    if (!strcmp(names[i], "qwen2")) {
      const char *got = ids_of(t, "123");
      snprintf(want, sizeof want, "%d %d %d", '1', '2', '3');
      CHECK(!strcmp(got, want), "qwen2 digits are single: %s, want %s", got, want);
    }
    if (!strcmp(names[i], "gpt-2")) {
      const char *got = ids_of(t, "123");
      snprintf(want, sizeof want, "%d", base + 1);
      CHECK(!strcmp(got, want), "gpt-2 keeps digit runs whole: %s, want %s", got, want);
      got = ids_of(t, "Hello!!");
      snprintf(want, sizeof want, "%d %d", base + 5, base + 7);
      CHECK(!strcmp(got, want), "gpt-2 'Hello!!': %s, want %s", got, want);
    }
    tokenizer_free(t);
  }
  return test_finish("test_tokenizer_gguf_pre");
}
