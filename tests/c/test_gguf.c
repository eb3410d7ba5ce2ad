/* test_gguf.c - the GGUF parser on real files (stories260K, vocab files) and on damaged copies. */
#include <string.h>

#include "model/gguf.h"
#include "test_util.h"
#include "util/log.h"

static int check_stories(const char *path) {
  struct gguf_file *g = gguf_open(path);
  REQUIRE(g != NULL, "open %s: %s", path, err_last());
  CHECK(g->version == 3, "version %u", g->version);
  size_t len;
  const char *arch = gguf_get_str(g, "general.architecture", &len);
  CHECK(arch && len == 5 && !memcmp(arch, "llama", 5), "architecture");
  int64_t v;
  CHECK(gguf_get_int(g, "llama.embedding_length", &v) == 0 && v == 64, "dim %lld", (long long)v);
  CHECK(gguf_get_int(g, "llama.block_count", &v) == 0 && v == 5, "layers %lld", (long long)v);
  CHECK(gguf_get_int(g, "llama.attention.head_count", &v) == 0 && v == 8, "heads");
  CHECK(gguf_get_int(g, "llama.attention.head_count_kv", &v) == 0 && v == 4, "kv heads");
  const struct gguf_kv *tokens = gguf_find(g, "tokenizer.ggml.tokens");
  CHECK(tokens && tokens->type == GGUF_TYPE_ARRAY && tokens->len == 512, "512 tokens");
  const char *t0 = gguf_arr_str(g, tokens, 0, &len);
  CHECK(t0 && len == 5 && !memcmp(t0, "<unk>", 5), "token 0 is <unk>");
  CHECK(gguf_arr_str(g, tokens, 512, &len) == NULL, "out-of-range string index refused");
  const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
  CHECK(emb && emb->ne[0] == 64 && emb->ne[1] == 512 && emb->dtype == DTYPE_F32, "token_embd");
  CHECK(emb && emb->nbytes == 64 * 512 * 4, "token_embd bytes");
  CHECK(gguf_find_tensor(g, "no.such.tensor") == NULL, "missing tensor");
  /* Every truncation of the file is an error, never a crash (ASan build checks reads). */
  size_t size = g->map.size;
  unsigned char *copy = malloc(size);
  memcpy(copy, g->map.data, size);
  gguf_close(g);
  for (size_t cut = 0; cut < size; cut += 1 + cut / 7) {
    unsigned char *part = malloc(cut ? cut : 1);
    memcpy(part, copy, cut);
    struct gguf_file *p = gguf_open_memory(part, cut, "truncated.gguf");
    CHECK(p == NULL, "truncated at %zu accepted", cut);
    CHECK(p != NULL || strstr(err_last(), "truncated.gguf"), "message names the file: %s", err_last());
    gguf_close(p);
    free(part);
  }
  free(copy);
  return 0;
}

int main(void) {
  const char *p = test_shared_path("models/stories260K.gguf");
  if (!p)
    return test_skip("../shared/testdata is absent");
  check_stories(p);
  const char *vocab[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                         "vocab/ggml-vocab-phi-3.gguf"};
  for (int i = 0; i < 3; i++) {
    const char *vp = test_shared_path(vocab[i]);
    if (!vp)
      continue;
    struct gguf_file *g = gguf_open(vp);
    CHECK(g != NULL, "open %s: %s", vp, err_last());
    if (g) {
      const struct gguf_kv *tokens = gguf_find(g, "tokenizer.ggml.tokens");
      CHECK(tokens && tokens->len > 1000, "%s has a vocabulary", vp);
      gguf_close(g);
    }
  }
  struct gguf_file *bad = gguf_open("/nonexistent/model.gguf");
  CHECK(bad == NULL && strstr(err_last(), "/nonexistent/model.gguf"), "missing file named");
  return test_finish("test_gguf");
}
