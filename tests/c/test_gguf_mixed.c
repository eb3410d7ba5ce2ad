/* test_gguf_mixed.c - a mixed-type GGUF (as Q4_K_M / Q5_K_M files are: a different quant type per
 * matrix, F32 norms) loads, keeps each tensor's type, runs on the CPU, and gives the logits of
 * its dequantized twin.
 *
 * The test writes two llama GGUFs (dim 256, FFN 512, 2 layers, 8/2 heads, vocab 64): MIXED with
 * random blocks of twelve quant types spread over the matrices, and TWIN with the same matrices
 * dequantized to F32 by the reference code (itself checked against gguf-py in test_quant).
 * Tolerance 5e-2 relative L2 on the logits: the twin runs f32 activations, the mixed model 8-bit
 * ones (0.3-2% per matmul, compounding over 2 layers x 7 matrices and the head; measured value
 * printed); a wrong layout, type or row stride gives errors of order 1.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/model_file.h"
#include "test_util.h"
#include "util/log.h"
#include "util/quant.h"

#define DIM 256
#define FFN 512
#define LAYERS 2
#define VOCAB 64
#define HEADS 8
#define KV_HEADS 2
#define HD (DIM / HEADS)

struct buf {
  char *p;
  size_t n, cap;
};
static void put(struct buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void kv_u32(struct buf *b, const char *k, uint32_t v) {
  put_str(b, k);
  put_u32(b, GGUF_TYPE_UINT32);
  put_u32(b, v);
}

struct tensor {
  char name[64];
  int64_t rows, cols;
  enum dtype t;
  void *data;
};

static uint64_t rng = 0xfeedface12345678ull;

/* Random blocks of type T with finite f16 scales of magnitude 2^-7 .. 2^-3. */
static void *random_weight(enum dtype t, int64_t rows, int64_t cols) {
  size_t bytes = dtype_row_bytes(t, cols) * (size_t)rows, bb = dtype_block_bytes(t);
  uint8_t *p = malloc(bytes);
  for (size_t i = 0; i < bytes; i++)
    p[i] = (uint8_t)test_rand(&rng);
  int off[2] = {0, 2}, n = 1;
  if (t == DTYPE_Q4_1 || t == DTYPE_Q5_1 || t == DTYPE_Q4_K || t == DTYPE_Q5_K)
    n = 2;
  else if (t == DTYPE_Q2_K)
    off[0] = 80, off[1] = 82, n = 2;
  else if (t == DTYPE_Q3_K)
    off[0] = 108;
  else if (t == DTYPE_Q6_K)
    off[0] = 208;
  for (size_t b = 0; b < bytes / bb; b++)
    for (int f = 0; f < n; f++) {
      uint16_t h = f32_to_f16(test_randf(&rng) * ldexpf(1.0f, -3 - (int)(test_rand(&rng) % 5)));
      memcpy(p + b * bb + off[f], &h, 2);
    }
  return p;
}

/* Writes a llama GGUF of the tensors to PATH, each in type (TWIN: F32, dequantized). */
static int write_gguf(const char *path, struct tensor *ts, int n, int twin) {
  struct buf b = {0}, kvs = {0}, infos = {0}, data = {0};
  int nkv = 0;
  put_str(&kvs, "general.architecture"), put_u32(&kvs, GGUF_TYPE_STRING), put_str(&kvs, "llama"), nkv++;
  kv_u32(&kvs, "llama.context_length", 256), nkv++;
  kv_u32(&kvs, "llama.embedding_length", DIM), nkv++;
  kv_u32(&kvs, "llama.block_count", LAYERS), nkv++;
  kv_u32(&kvs, "llama.feed_forward_length", FFN), nkv++;
  kv_u32(&kvs, "llama.attention.head_count", HEADS), nkv++;
  kv_u32(&kvs, "llama.attention.head_count_kv", KV_HEADS), nkv++;
  for (int i = 0; i < n; i++) {
    enum dtype t = twin ? DTYPE_F32 : ts[i].t;
    size_t bytes = dtype_row_bytes(t, ts[i].cols) * (size_t)ts[i].rows;
    put_str(&infos, ts[i].name);
    put_u32(&infos, ts[i].rows > 1 ? 2 : 1);
    put_u64(&infos, (uint64_t)ts[i].cols);
    if (ts[i].rows > 1)
      put_u64(&infos, (uint64_t)ts[i].rows);
    put_u32(&infos, (uint32_t)dtype_to_ggml(t));
    put_u64(&infos, data.n);
    if (twin && ts[i].t != DTYPE_F32) {
      float *f = malloc(bytes);
      dtype_to_f32(f, ts[i].data, ts[i].t, ts[i].rows * ts[i].cols);
      put(&data, f, bytes);
      free(f);
    } else {
      put(&data, ts[i].data, bytes);
    }
    static const char zero[32];
    put(&data, zero, (32 - data.n % 32) % 32);
  }
  put_u32(&b, 0x46554747u);
  put_u32(&b, 3);
  put_u64(&b, (uint64_t)n);
  put_u64(&b, (uint64_t)nkv);
  put(&b, kvs.p, kvs.n);
  put(&b, infos.p, infos.n);
  static const char zero[32];
  put(&b, zero, (32 - b.n % 32) % 32);
  put(&b, data.p, data.n);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(b.p, 1, b.n, f) == b.n;
  if (f)
    fclose(f);
  free(b.p), free(kvs.p), free(infos.p), free(data.p);
  return ok ? 0 : -1;
}

static int forward(const char *path, struct backend *be, const int32_t *tokens, int n, float *logits,
                   struct model_file **mf_out) {
  struct model *m = model_load(path, be);
  if (!m)
    return -1;
  if (mf_out)
    *mf_out = model_file_open(path);
  int32_t table[4] = {0, 1, 2, 3}, pos[16], slots[16], lidx[16], qs[2] = {0, n}, len = n;
  for (int i = 0; i < n; i++)
    pos[i] = i, slots[i] = i, lidx[i] = i;
  struct batch b = {n, 1, 4, n, n, tokens, pos, slots, qs, &len, table, n, lidx};
  int rc = model_alloc_cache(m, 5, 16, DTYPE_F32, 16, 1, 4) || model_forward(m, &b, logits) ? -1 : 0;
  model_free(m);
  return rc;
}

int main(void) {
  static const enum dtype mats[] = {DTYPE_Q4_K, DTYPE_Q5_0, DTYPE_Q6_K, DTYPE_Q8_0, DTYPE_Q4_1,
                                    DTYPE_IQ4_XS, DTYPE_Q6_K, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q5_K,
                                    DTYPE_Q5_1, DTYPE_Q4_0, DTYPE_IQ4_NL, DTYPE_Q4_K};
  struct tensor ts[3 + 9 * LAYERS];
  int n = 0, mi = 0;
#define ADD(NAME, R, C, T)                                                                        \
  do {                                                                                            \
    snprintf(ts[n].name, sizeof ts[n].name, "%s", NAME);                                         \
    ts[n].rows = R, ts[n].cols = C, ts[n].t = T;                                                  \
    n++;                                                                                          \
  } while (0)
  ADD("token_embd.weight", VOCAB, DIM, DTYPE_Q4_K);
  ADD("output_norm.weight", 1, DIM, DTYPE_F32);
  ADD("output.weight", VOCAB, DIM, DTYPE_Q6_K);
  char nm[64];
  for (int l = 0; l < LAYERS; l++) {
    static const char *names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t rows[] = {DIM, KV_HEADS * HD, KV_HEADS * HD, DIM, FFN, FFN, DIM};
    const int64_t cols[] = {DIM, DIM, DIM, DIM, DIM, DIM, FFN};
    snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
    ADD(nm, 1, DIM, DTYPE_F32);
    snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
    ADD(nm, 1, DIM, DTYPE_F32);
    for (int i = 0; i < 7; i++) {
      snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[i]);
      ADD(nm, rows[i], cols[i], mats[mi++ % (sizeof mats / sizeof mats[0])]);
    }
  }
  for (int i = 0; i < n; i++) {
    if (ts[i].t == DTYPE_F32) {
      float *f = malloc(sizeof(float) * (size_t)ts[i].cols);
      for (int64_t j = 0; j < ts[i].cols; j++)
        f[j] = 1.0f + 0.1f * test_randf(&rng);
      ts[i].data = f;
    } else {
      ts[i].data = random_weight(ts[i].t, ts[i].rows, ts[i].cols);
    }
  }
  char dir[] = "/tmp/pagoda_mixed_XXXXXX", mixed[64], twin[64];
  REQUIRE(mkdtemp(dir), "mkdtemp");
  snprintf(mixed, sizeof mixed, "%s/mixed.gguf", dir);
  snprintf(twin, sizeof twin, "%s/twin.gguf", dir);
  REQUIRE(write_gguf(mixed, ts, n, 0) == 0 && write_gguf(twin, ts, n, 1) == 0, "write");

  struct backend_params bp = {"cpu", 2, 0};
  struct backend *be = backend_create(&bp);
  REQUIRE(be, "backend: %s", err_last());
  int32_t tokens[12] = {1, 5, 9, 63, 2, 17, 33, 8, 40, 41, 0, 12};
  float *a = malloc(sizeof(float) * 12 * VOCAB), *b = malloc(sizeof(float) * 12 * VOCAB);
  struct model_file *mf = NULL;
  CHECK(forward(mixed, be, tokens, 12, a, &mf) == 0, "mixed: %s", err_last());
  CHECK(forward(twin, be, tokens, 12, b, NULL) == 0, "twin: %s", err_last());
  if (mf) { /* each tensor keeps the type it was written in */
    CHECK(mf->tok_embd.dtype == DTYPE_Q4_K && mf->lm_head.dtype == DTYPE_Q6_K, "embd/head types");
    CHECK(mf->out_norm.dtype == DTYPE_F32, "norm f32");
    for (int l = 0; l < LAYERS; l++) {
      const struct host_tensor *h[] = {&mf->layers[l].wq, &mf->layers[l].wk, &mf->layers[l].wv,
                                       &mf->layers[l].wo, &mf->layers[l].w_gate, &mf->layers[l].w_up,
                                       &mf->layers[l].w_down};
      for (int i = 0; i < 7; i++)
        CHECK(h[i]->dtype == mats[(l * 7 + i) % 14], "layer %d matrix %d: %s", l, i, dtype_name(h[i]->dtype));
    }
    model_file_close(mf);
  }
  double e = test_rel_l2(a, b, 12 * VOCAB);
  int finite = 1;
  for (int i = 0; i < 12 * VOCAB; i++)
    finite &= isfinite(a[i]);
  printf("  mixed-type GGUF (12 quant types) vs its dequantized F32 twin: logits rel L2 %.4f\n", e);
  CHECK(finite && e < 5e-2, "mixed vs twin: rel L2 %g", e);

  unlink(mixed), unlink(twin), rmdir(dir);
  for (int i = 0; i < n; i++)
    free(ts[i].data);
  free(a), free(b);
  be->ops->destroy(be);
  return test_finish("test_gguf_mixed");
}
