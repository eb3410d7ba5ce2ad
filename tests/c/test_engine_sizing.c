/* test_engine_sizing.c - KV pool sizing at engine start-up on stories260K (CPU): --pa-memory-mb
 * gives floor(budget / block bytes) blocks with the block bytes computed here from the GGUF
 * header, --pa-context-len N gives max_num_seqs * ceil(N / block_size), --pa-memory-fraction is a
 * fraction of MemAvailable, no flag caps the pool at max_num_seqs full sequences, impossible
 * budgets fail at creation naming the flag, f8e4m3 holds twice the tokens of f16; and the model's split
 * start-up (workspace, profiling pass, pool) gives the logits of model_alloc_cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/gguf.h"
#include "model/model.h"
#include "pagoda.h"
#include "test_util.h"
#include "util/log.h"

static const char *model_path;
static size_t kv_row_bytes; /* bytes of one token's K and V over all layers, in f32 */

static void params(struct pagoda_engine_params *ep, int bs) {
  pagoda_engine_params_default(ep);
  ep->model = model_path;
  ep->device = "cpu";
  ep->threads = 1;
  ep->block_size = bs;
  ep->max_num_seqs = 4;
  ep->max_model_len = 256;
  ep->max_num_batched_tokens = 512;
  ep->cache_type = PAGODA_CACHE_TYPE_F32; /* kv_row_bytes counts f32 */
}

/* Creates an engine; returns its usable block count, or -status on failure. */
static int create_blocks(const struct pagoda_engine_params *ep) {
  pagoda_engine_t *e;
  int st = pagoda_engine_create(ep, &e);
  if (st != PAGODA_OK)
    return st < 0 ? st : -st;
  struct pagoda_engine_stats s;
  int n = pagoda_engine_stats(e, &s) == PAGODA_OK && s.block_size == ep->block_size ? s.num_blocks : -1000;
  pagoda_engine_free(e);
  return n;
}

static double mem_available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
      break;
  fclose(f);
  return (double)kb * 1024.0;
}

static int test_engine_budgets(void) {
  const int bss[3] = {8, 16, 32};
  const double mbs[3] = {0.5, 1.0, 3.7};
  struct pagoda_engine_params ep;
  for (int i = 0; i < 3; i++) {
    size_t block_bytes = kv_row_bytes * (size_t)bss[i];
    for (int j = 0; j < 3; j++) {
      params(&ep, bss[i]);
      ep.pa_memory_mb = mbs[j];
      long long want = (long long)floor(mbs[j] * 1048576.0 / (double)block_bytes); /* null block included */
      int got = create_blocks(&ep);
      CHECK(got == want - 1, "bs %d, --pa-memory-mb %g: %d usable blocks, want %lld - 1 (%zu bytes each): %s",
            bss[i], mbs[j], got, want, block_bytes, got < 0 ? pagoda_last_error() : "");
    }
    params(&ep, bss[i]);
    ep.pa_context_len = 100;
    int got = create_blocks(&ep);
    CHECK(got == 4 * ((100 + bss[i] - 1) / bss[i]), "bs %d, --pa-context-len 100: %d blocks", bss[i], got);
    params(&ep, bss[i]);
    got = create_blocks(&ep);
    CHECK(got == 4 * (256 / bss[i]), "bs %d, no flag: %d blocks, want the cap of 4 x 256 tokens", bss[i], got);
  }

  /* a fraction of MemAvailable (small, the machine is shared): not capped at 4 sequences */
  params(&ep, 16);
  ep.pa_memory_fraction = 2e-4;
  double before = mem_available_bytes();
  int got = create_blocks(&ep);
  double after = mem_available_bytes();
  double lo = fmin(before, after), hi = fmax(before, after), bb = (double)(kv_row_bytes * 16);
  /* other processes move MemAvailable between the readings: a wide window */
  CHECK(got + 1 >= floor(2e-4 * lo / bb) * 0.75 && got + 1 <= ceil(2e-4 * hi / bb) * 1.33,
        "--pa-memory-fraction 2e-4: %d blocks for MemAvailable %.0f..%.0f bytes (%s)", got, lo, hi,
        got < 0 ? pagoda_last_error() : "");
  return 0;
}

static int test_engine_refusals(void) {
  struct pagoda_engine_params ep;
  /* 256 tokens = 16 blocks of 16 = 16 * 10240 bytes; 0.1 MiB holds 10 (null block included) */
  params(&ep, 16);
  ep.pa_memory_mb = 0.1;
  int got = create_blocks(&ep);
  CHECK(got == -PAGODA_ERR_INVALID_ARG && strstr(pagoda_last_error(), "raise --pa-memory-mb") &&
            strstr(pagoda_last_error(), "--max-model-len"),
        "budget below one sequence: %d: %s", got, pagoda_last_error());
  params(&ep, 16);
  ep.pa_memory_fraction = 1e-12;
  got = create_blocks(&ep);
  CHECK(got == -PAGODA_ERR_INVALID_ARG && strstr(pagoda_last_error(), "raise --pa-memory-fraction"),
        "tiny fraction: %d: %s", got, pagoda_last_error());
  params(&ep, 16);
  ep.max_num_seqs = 1;
  ep.pa_context_len = 100; /* 7 blocks < the 16 of a 256-token sequence */
  got = create_blocks(&ep);
  CHECK(got == -PAGODA_ERR_INVALID_ARG && strstr(pagoda_last_error(), "raise --pa-context-len"),
        "context below --max-model-len: %d: %s", got, pagoda_last_error());
  params(&ep, 16);
  ep.pa_memory_mb = 1;
  ep.pa_context_len = 256;
  got = create_blocks(&ep);
  CHECK(got == -PAGODA_ERR_INVALID_ARG && strstr(pagoda_last_error(), "mutually exclusive"),
        "two budget flags: %d: %s", got, pagoda_last_error());
  /* auto on a GGUF model on the CPU is an f16 cache (llama.cpp's default): twice the blocks */
  params(&ep, 16);
  ep.pa_memory_mb = 1;
  ep.cache_type = PAGODA_CACHE_TYPE_AUTO;
  got = create_blocks(&ep);
  CHECK(got == (int)floor(1048576.0 / (double)(kv_row_bytes / 2 * 16)) - 1, "auto (f16), 1 MiB: %d blocks", got);
  ep.cache_type = PAGODA_CACHE_TYPE_F16;
  CHECK(create_blocks(&ep) == got, "--pa-cache-type f16 equals auto here");
  /* f8e4m3: one byte per value and no per-token scales, so twice the blocks of f16 */
  ep.cache_type = PAGODA_CACHE_TYPE_F8E4M3;
  int got8 = create_blocks(&ep);
  CHECK(got8 == (int)floor(1048576.0 / (double)(kv_row_bytes / 4 * 16)) - 1 && got8 + 1 >= 2 * (got + 1) - 1,
        "f8e4m3, 1 MiB: %d blocks (f16: %d)", got8, got);
  ep.cache_type = PAGODA_CACHE_TYPE_BF16;
  got = create_blocks(&ep);
  CHECK(got < 0 && strstr(pagoda_last_error(), "--pa-cache-type bf16"), "bf16 refused on CPU: %d: %s", got,
        pagoda_last_error());
  /* the paged-attention switch keeps its own pool rule: the same budget on a contiguous cache */
  params(&ep, 16);
  ep.pa_memory_mb = 1;
  ep.paged_attn = PAGODA_PAGED_ATTN_OFF;
  got = create_blocks(&ep);
  CHECK(got == (int)floor(1048576.0 / (double)(kv_row_bytes * 16)) - 1, "--paged-attn off, 1 MiB: %d blocks", got);
  return 0;
}

/* One prompt of n tokens through blocks 1.. of the pool; logits of its last token into out. */
static int prefill(struct model *m, const int32_t *ids, int n, int bs, float *out) {
  int32_t pos[64], slots[64], qs[2] = {0, n}, lens[1] = {n}, table[8], lidx[1] = {n - 1};
  for (int i = 0; i < n; i++) {
    pos[i] = i;
    slots[i] = (1 + i / bs) * bs + i % bs;
  }
  for (int i = 0; i < 8; i++)
    table[i] = 1 + i;
  struct batch b = {0};
  b.num_tokens = n;
  b.num_seqs = 1;
  b.max_blocks_per_seq = 8;
  b.max_seq_len = b.max_query_len = n;
  b.input_ids = ids;
  b.positions = pos;
  b.slot_mapping = slots;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_tables = table;
  b.num_logits = 1;
  b.logits_idx = lidx;
  return model_forward(m, &b, out);
}

static int test_model_split_start(void) {
  struct backend *be = backend_cpu_create(1);
  REQUIRE(be, "backend: %s", err_last());
  struct model *m = model_load(model_path, be);
  REQUIRE(m, "model_load: %s", err_last_where());
  int V = model_get_config(m)->vocab_size;
  int32_t ids[40];
  for (int i = 0; i < 40; i++)
    ids[i] = i ? (i * 37 + 11) % V : 1;
  float *ref = malloc(sizeof(float) * V), *out = malloc(sizeof(float) * V);
  REQUIRE(ref && out, "oom");
  CHECK(model_weight_bytes(m) > 0 && model_workspace_bytes(m) == 0, "weights %zu, no workspace yet",
        model_weight_bytes(m));
  CHECK(model_profile(m, 16, DTYPE_F32) != 0 && strstr(err_last(), "model_alloc_workspace"),
        "profile before the workspace refused: %s", err_last());
  REQUIRE(model_alloc_cache(m, 10, 16, DTYPE_F32, 300, 3, 8) == 0, "alloc_cache: %s", err_last());
  REQUIRE(prefill(m, ids, 40, 16, ref) == 0, "prefill: %s", err_last());
  CHECK(model_profile(m, 16, DTYPE_F32) != 0, "profile with a pool present refused");

  /* the engine's order; the profiling batch is 300 tokens over 3 sequences of 100 (< 8 x 16) */
  REQUIRE(model_alloc_workspace(m, 300, 3, 8) == 0, "workspace: %s", err_last());
  const struct model_config *c = model_get_config(m);
  size_t want = 300 * 4 * (size_t)(3 * c->dim + 2 * c->n_heads * c->head_dim + 2 * c->n_kv_heads * c->head_dim +
                                   2 * c->ffn_dim);
  CHECK(model_workspace_bytes(m) == want, "workspace %zu bytes, want %zu (9 f32 activation buffers)",
        model_workspace_bytes(m), want);
  REQUIRE(model_alloc_kv(m, 10, 16, DTYPE_F32) == 0, "kv: %s", err_last());
  CHECK(model_profile(m, 16, DTYPE_F32) != 0, "profile after the pool refused");
  /* drop the pool by rebuilding: a fresh model, workspace, profile, then the pool */
  model_free(m);
  m = model_load(model_path, be);
  REQUIRE(m, "reload: %s", err_last());
  REQUIRE(model_alloc_workspace(m, 300, 3, 8) == 0, "workspace: %s", err_last());
  CHECK(model_profile(m, 16, DTYPE_F32) == 0, "profiling pass: %s", err_last());
  CHECK(model_kv_layers(m) == NULL, "the profiling pool is freed");
  CHECK(model_alloc_kv(m, 10, 16, DTYPE_BF16) != 0 && strstr(err_last(), "--pa-cache-type"),
        "bf16 pool refused on cpu: %s", err_last());
  CHECK(model_alloc_kv(m, 1, 16, DTYPE_F32) != 0, "a pool without a usable block refused");
  REQUIRE(model_alloc_kv(m, 10, 16, DTYPE_F32) == 0, "kv: %s", err_last());
  REQUIRE(prefill(m, ids, 40, 16, out) == 0, "prefill: %s", err_last());
  CHECK(memcmp(out, ref, sizeof(float) * V) == 0, "split start-up gives model_alloc_cache's logits");
  free(ref);
  free(out);
  model_free(m);
  be->ops->destroy(be);
  return 0;
}

int main(void) {
  model_path = test_shared_path("models/stories260K.gguf");
  if (!model_path)
    return test_skip("stories260K.gguf not found (set PAGODA_TESTDATA)");
  /* block bytes from the file's own header, not from the engine's arithmetic */
  struct gguf_file *g = gguf_open(model_path);
  REQUIRE(g, "gguf_open: %s", err_last());
  int64_t layers, heads, kv_heads, dim;
  REQUIRE(gguf_get_int(g, "llama.block_count", &layers) == 0 && gguf_get_int(g, "llama.attention.head_count", &heads) == 0 &&
              gguf_get_int(g, "llama.attention.head_count_kv", &kv_heads) == 0 &&
              gguf_get_int(g, "llama.embedding_length", &dim) == 0,
          "stories260K header");
  gguf_close(g);
  kv_row_bytes = 2 * (size_t)layers * (size_t)kv_heads * (size_t)(dim / heads) * sizeof(float);
  CHECK(kv_row_bytes == 2 * 5 * 4 * 8 * 4, "stories260K: 5 layers, 4 KV heads of 8: %zu bytes per token",
        kv_row_bytes);
  log_set_level(LOG_LEVEL_WARN);
  test_engine_budgets();
  test_engine_refusals();
  test_model_split_start();
  return test_finish("test_engine_sizing");
}
