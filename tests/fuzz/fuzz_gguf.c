/* fuzz_gguf.c - fuzz target: the GGUF parser and its accessors on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

int fuzz_one(const uint8_t *data, size_t size) {
  struct gguf_file *g = gguf_open_memory(data, size, "fuzz.gguf");
  if (!g)
    return 0;
  /* Touch everything the loaders touch. */
  volatile uint64_t sink = 0;
  for (int64_t i = 0; i < g->num_kv; i++) {
    const struct gguf_kv *kv = &g->kv[i];
    int64_t iv;
    double fv;
    size_t len;
    if (kv->type == GGUF_TYPE_ARRAY) {
      for (uint64_t j = 0; j < kv->len && j < 64; j++) {
        const char *s = gguf_arr_str(g, kv, j, &len);
        if (s && len)
          sink += (uint8_t)s[len - 1];
        if (gguf_arr_int(kv, j, &iv) == 0)
          sink += (uint64_t)iv;
        if (gguf_arr_float(kv, j, &fv) == 0)
          sink += (uint64_t)(fv == fv);
      }
    } else {
      if (gguf_get_int(g, kv->key, &iv) == 0)
        sink += (uint64_t)iv;
      if (gguf_get_float(g, kv->key, &fv) == 0)
        sink += 1;
      const char *s = gguf_get_str(g, kv->key, &len);
      if (s && len)
        sink += (uint8_t)s[0] + (uint8_t)s[len - 1];
    }
  }
  for (int64_t i = 0; i < g->num_tensors; i++) {
    const struct gguf_tensor *t = &g->tensors[i];
    if (t->data && t->nbytes)
      sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
  }
  (void)sink;
  gguf_close(g);
  return 0;
}

/* A small valid GGUF v3 seed: 3 metadata keys (string, u32, string array) and 2 tensors. */
static size_t put(uint8_t *b, size_t at, const void *p, size_t n) {
  memcpy(b + at, p, n);
  return at + n;
}
static size_t put_u32(uint8_t *b, size_t at, uint32_t v) { return put(b, at, &v, 4); }
static size_t put_u64(uint8_t *b, size_t at, uint64_t v) { return put(b, at, &v, 8); }
static size_t put_str(uint8_t *b, size_t at, const char *s) {
  at = put_u64(b, at, strlen(s));
  return put(b, at, s, strlen(s));
}

void fuzz_seeds(void (*add)(const uint8_t *data, size_t size)) {
  uint8_t *b = calloc(1, 4096);
  size_t at = put_u32(b, 0, 0x46554747u);
  at = put_u32(b, at, 3);
  at = put_u64(b, at, 2); /* tensors */
  at = put_u64(b, at, 3); /* kv */
  at = put_str(b, at, "general.architecture");
  at = put_u32(b, at, GGUF_TYPE_STRING);
  at = put_str(b, at, "llama");
  at = put_str(b, at, "llama.block_count");
  at = put_u32(b, at, GGUF_TYPE_UINT32);
  at = put_u32(b, at, 1);
  at = put_str(b, at, "tokenizer.ggml.tokens");
  at = put_u32(b, at, GGUF_TYPE_ARRAY);
  at = put_u32(b, at, GGUF_TYPE_STRING);
  at = put_u64(b, at, 3);
  at = put_str(b, at, "<s>");
  at = put_str(b, at, "a");
  at = put_str(b, at, "\xe2\x96\x81the");
  at = put_str(b, at, "token_embd.weight");
  at = put_u32(b, at, 2);
  at = put_u64(b, at, 4);
  at = put_u64(b, at, 3);
  at = put_u32(b, at, GGUF_GGML_F32);
  at = put_u64(b, at, 0);
  at = put_str(b, at, "blk.0.attn_q.weight");
  at = put_u32(b, at, 2);
  at = put_u64(b, at, 32);
  at = put_u64(b, at, 1);
  at = put_u32(b, at, GGUF_GGML_Q8_0);
  at = put_u64(b, at, 64);
  at = (at + 31) / 32 * 32;
  for (int i = 0; i < 12; i++)
    at = put(b, at, &(float){(float)i}, 4);
  at = (at + 31) / 32 * 32;
  at += 34;
  add(b, at);
  free(b);
}
