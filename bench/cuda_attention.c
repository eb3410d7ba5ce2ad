/* cuda_attention.c - the CUDA paged-attention kernels on Llama-3.1-8B's attention shape (32 query
 * heads over 8 KV heads, head_dim 128; or the head_dim and head counts given, e.g. 96 32 32 for
 * Phi-3.5-mini, 256 16 8 for Gemma-2-9B), through the backend's attention op:
 * - decode: 64 sequences x 4096 context, one query each, bf16 and f8e4m3 caches, block sizes
 *   8, 16 and 32, blocks in shuffled physical order (a paged pool after churn) and in order;
 *   GB/s = K and V bytes read once / time, TFLOP/s = 4 x heads x context x head_dim per query;
 * - the part-1 kernel on the same decode batch (max_query_len passed as 2, a loose bound, so the
 *   general path runs) for comparison;
 * - causal prefill: 4 sequences x 4096 prompt tokens, bf16 at block sizes 16, 8 and 32, f8e4m3 at
 *   16, TFLOP/s = 4 x B x H x S^2 x D / 2;
 * next to the device copy bandwidth measured in the same run (cudaMemcpy device to device of
 * 512 MiB through copy_blocks; bytes read + written per second).
 * Usage: cuda_attention [samples [head_dim [heads kv_heads]]]   Prints one line per case and a JSON
 * object (last line). PAGODA_ATTN_DECODE=simd PAGODA_ATTN_PREFILL=simd in the environment give the
 * CUDA-core kernels (the generic one for head_dims they are not compiled for) for comparison. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench_util.h"
#include "util/dtype.h"
#include "util/log.h"

static int H = 32, KVH = 8, HD = 128;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}
static float rndf(void) { return (float)rnd() / 2147483648.0f - 1.0f; } /* [-1, 1) */

static void die(const char *what) {
  fprintf(stderr, "cuda_attention: %s: %s\n", what, err_last_where());
  exit(1);
}

static struct backend *be;
static int samples = 7;

static void *dev_alloc(size_t bytes) {
  void *p = be->ops->alloc(be, bytes);
  if (!p)
    die("alloc");
  return p;
}

static void *upload(const void *h, size_t bytes) {
  void *d = dev_alloc(bytes);
  if (be->ops->upload(be, d, h, bytes))
    die("upload");
  return d;
}

/* Fills BYTES of device memory at D with random values of type T (bf16 in [-1, 1), or e4m3 of
 * such values): a 1 MiB random pattern tiled at varying offsets. */
static void fill_random(void *d, size_t bytes, enum dtype t) {
  size_t chunk = (size_t)1 << 20;
  unsigned char *h = malloc(chunk * 2);
  if (t == DTYPE_BF16)
    for (size_t i = 0; i < chunk; i++)
      ((uint16_t *)h)[i] = f32_to_bf16(rndf());
  else
    for (size_t i = 0; i < 2 * chunk; i++)
      h[i] = f32_to_f8e4m3(rndf());
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t n = bytes - off < chunk ? bytes - off : chunk;
    if (be->ops->upload(be, (char *)d + off, h + (off / chunk * 4096) % chunk, n))
      die("upload");
  }
  free(h);
}

/* Median over SAMPLES of the mean time of REPS calls of attention, in seconds. */
static double time_attention(void *out, void *q, const struct kv_layer *kv, const struct batch *b,
                             const struct attn_params *ap, int reps) {
  for (int i = 0; i < 2; i++)
    if (be->ops->attention(be, out, q, kv, b, ap))
      die("attention");
  if (be->ops->sync(be))
    die("sync");
  double ts[32];
  for (int s = 0; s < samples; s++) {
    double t0 = bench_now();
    for (int i = 0; i < reps; i++)
      if (be->ops->attention(be, out, q, kv, b, ap))
        die("attention");
    if (be->ops->sync(be))
      die("sync");
    ts[s] = (bench_now() - t0) / reps;
  }
  for (int i = 1; i < samples; i++) /* insertion sort */
    for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
      double x = ts[j];
      ts[j] = ts[j - 1], ts[j - 1] = x;
    }
  return ts[samples / 2];
}

/* Device copy bandwidth: 512 MiB device to device (copy_blocks of one 512 MiB block, K and V). */
static double copy_gbps(void) {
  struct kv_layer kv = {0};
  kv.dtype = DTYPE_BF16;
  kv.num_blocks = 2;
  kv.block_size = 32;
  kv.n_kv_heads = 1;
  kv.head_dim = 1 << 22; /* 32 x 4M bf16 = 256 MiB per block */
  size_t blk = (size_t)32 * kv.head_dim * 2;
  kv.k = dev_alloc(2 * blk);
  kv.v = dev_alloc(2 * blk);
  fill_random(kv.k, 2 * blk, DTYPE_BF16);
  fill_random(kv.v, 2 * blk, DTYPE_BF16);
  int32_t src = 1, dst = 0;
  double best = 0;
  for (int s = 0; s < samples + 1; s++) {
    double t0 = bench_now();
    if (be->ops->copy_blocks(be, &kv, 1, &src, &dst, 1) || be->ops->sync(be))
      die("copy_blocks");
    double gbps = 2.0 * 2 * blk / (bench_now() - t0) / 1e9; /* K and V: read + write */
    if (s > 0 && gbps > best)
      best = gbps;
  }
  be->ops->free(be, kv.k);
  be->ops->free(be, kv.v);
  return best;
}

struct res {
  char name[64];
  double ms, gbps, tflops;
};
static struct res results[64];
static int n_results;

static void report(const char *name, double sec, double bytes, double flops) {
  struct res *r = &results[n_results++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->ms = sec * 1e3;
  r->gbps = bytes / sec / 1e9;
  r->tflops = flops / sec / 1e12;
  printf("%-34s %9.3f ms %8.0f GB/s %7.1f TFLOP/s\n", name, r->ms, r->gbps, r->tflops);
  fflush(stdout);
}

/* One batch of B sequences of CTX tokens, the last QLEN of them queries (all keys already in the
 * cache), over a pool of block size BS; SHUFFLE: physical blocks in random order. */
static void run_case(const char *name, int B, int ctx, int qlen, int bs, enum dtype kvt, int shuffle,
                     int loose_q, int reps) {
  int mb = (ctx + bs - 1) / bs, nblocks = 1 + B * mb;
  size_t esz = dtype_row_bytes(kvt, 1);
  size_t cache = (size_t)nblocks * KVH * bs * HD * esz;
  struct kv_layer kv = {0};
  kv.dtype = kvt;
  kv.k_scale = kv.v_scale = 1.0f;
  kv.num_blocks = nblocks;
  kv.block_size = bs;
  kv.n_kv_heads = KVH;
  kv.head_dim = HD;
  kv.k = dev_alloc(cache);
  kv.v = dev_alloc(cache);
  fill_random(kv.k, cache, kvt);
  fill_random(kv.v, cache, kvt);
  int T = B * qlen;
  int32_t *perm = malloc(sizeof(int32_t) * (nblocks - 1)), *tables = malloc(sizeof(int32_t) * B * mb);
  for (int i = 0; i < nblocks - 1; i++)
    perm[i] = i + 1;
  for (int i = nblocks - 2; shuffle && i > 0; i--) {
    int j = (int)(rnd() % (uint32_t)(i + 1)), x = perm[i];
    perm[i] = perm[j], perm[j] = x;
  }
  memcpy(tables, perm, sizeof(int32_t) * B * mb);
  int32_t *qs = malloc(sizeof(int32_t) * (B + 1)), *lens = malloc(sizeof(int32_t) * B);
  for (int s = 0; s <= B; s++)
    qs[s] = s * qlen;
  for (int s = 0; s < B; s++)
    lens[s] = ctx;
  uint16_t *qh = malloc(sizeof(uint16_t) * T * H * HD);
  for (size_t i = 0; i < (size_t)T * H * HD; i++)
    qh[i] = f32_to_bf16(rndf());
  void *q = upload(qh, sizeof(uint16_t) * T * H * HD), *out = dev_alloc(sizeof(uint16_t) * T * H * HD);
  struct batch b = {0};
  b.num_tokens = T;
  b.num_seqs = B;
  b.max_blocks_per_seq = mb;
  b.max_seq_len = ctx;
  b.max_query_len = loose_q ? qlen + 1 : qlen;
  b.query_start = upload(qs, sizeof(int32_t) * (B + 1));
  b.seq_lens = upload(lens, sizeof(int32_t) * B);
  b.block_tables = upload(tables, sizeof(int32_t) * B * mb);
  struct attn_params ap = {.n_heads = H, .scale = 1.0f / sqrtf((float)HD)};
  double sec = time_attention(out, q, &kv, &b, &ap, reps);
  double keys = qlen == 1 ? (double)B * ctx : (double)B * ctx * (ctx + 1) / 2.0 / ctx * qlen; /* causal */
  double bytes = qlen == 1 ? 2.0 * B * ctx * KVH * HD * esz : 2.0 * B * ctx * KVH * HD * esz + 4.0 * T * H * HD;
  report(name, sec, bytes, 4.0 * H * HD * keys);
  be->ops->free(be, kv.k), be->ops->free(be, kv.v), be->ops->free(be, q), be->ops->free(be, out);
  be->ops->free(be, (void *)b.query_start), be->ops->free(be, (void *)b.seq_lens);
  be->ops->free(be, (void *)b.block_tables);
  free(perm), free(tables), free(qs), free(lens), free(qh);
}

int main(int argc, char **argv) {
  if (argc > 1)
    samples = atoi(argv[1]);
  if (samples < 1 || samples > 32)
    samples = 7;
  if (argc > 2)
    HD = atoi(argv[2]);
  if (argc > 4)
    H = atoi(argv[3]), KVH = atoi(argv[4]);
  if (HD < 8 || HD > 256 || HD % 8 || KVH < 1 || H < KVH || H % KVH) {
    fprintf(stderr, "cuda_attention: head_dim %d (a multiple of 8 up to 256) over %d / %d heads is not valid\n", HD, H,
            KVH);
    return 1;
  }
  printf("shape: %d query heads over %d KV heads, head_dim %d\n", H, KVH, HD);
  be = backend_create(&(struct backend_params){.device = "cuda"});
  if (!be)
    die("backend_create(cuda)");
  /* reserve waits for the backend's kernel preloading under lazy loading (cuda_preload.cu): kernels
   * timed while it runs took up to 13% longer (bench/RESULTS.md, session 20) */
  if (be->ops->reserve && be->ops->reserve(be, 1, 1, 1))
    die("reserve");
  double copy = copy_gbps();
  printf("device copy bandwidth: %.0f GB/s (read + write)\n", copy);
  char name[64];
  for (int f8 = 0; f8 < 2; f8++)
    for (int bs = 8; bs <= 32; bs *= 2) {
      snprintf(name, sizeof name, "decode_%s_bs%d", f8 ? "f8" : "bf16", bs);
      run_case(name, 64, 4096, 1, bs, f8 ? DTYPE_F8E4M3 : DTYPE_BF16, 1, 0, 10);
    }
  run_case("decode_bf16_bs16_inorder", 64, 4096, 1, 16, DTYPE_BF16, 0, 0, 10);
  run_case("decode_f8_bs16_inorder", 64, 4096, 1, 16, DTYPE_F8E4M3, 0, 0, 10);
  run_case("decode_bf16_bs16_part1kernel", 64, 4096, 1, 16, DTYPE_BF16, 1, 1, 3);
  run_case("decode_bf16_bs16_batch1_ctx512", 1, 512, 1, 16, DTYPE_BF16, 1, 0, 50);
  run_case("prefill_bf16_bs16", 4, 4096, 4096, 16, DTYPE_BF16, 1, 0, 1);
  run_case("prefill_bf16_bs8", 4, 4096, 4096, 8, DTYPE_BF16, 1, 0, 1);
  run_case("prefill_bf16_bs32", 4, 4096, 4096, 32, DTYPE_BF16, 1, 0, 1);
  run_case("prefill_f8_bs16", 4, 4096, 4096, 16, DTYPE_F8E4M3, 1, 0, 1);
  printf("{\"head_dim\": %d, \"heads\": %d, \"kv_heads\": %d, \"copy_GBps_rw\": %.1f", HD, H, KVH, copy);
  for (int i = 0; i < n_results; i++)
    printf(", \"%s_ms\": %.4f, \"%s_GBps\": %.1f, \"%s_TFLOPs\": %.2f", results[i].name, results[i].ms,
           results[i].name, results[i].gbps, results[i].name, results[i].tflops);
  printf("}\n");
  be->ops->destroy(be);
  return 0;
}
