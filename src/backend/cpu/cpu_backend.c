/* cpu_backend.c - the CPU backend: host memory, weights (aliased when usable as is), op table. */
#include "backend/cpu/cpu_backend.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* 64-byte alignment: one cache line, and enough for any SIMD load. */
#define CPU_ALIGN 64

static void *cpu_alloc(struct backend *be, size_t bytes) {
  (void)be;
  size_t n = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
  void *p = aligned_alloc(CPU_ALIGN, n ? n : CPU_ALIGN);
  if (!p)
    ERR("out of memory allocating %zu bytes of host memory", bytes);
  return p;
}

static void cpu_free(struct backend *be, void *p) {
  (void)be;
  free(p);
}

static int cpu_upload(struct backend *be, void *dst, const void *host_src, size_t bytes) {
  (void)be;
  if (bytes)
    memmove(dst, host_src, bytes);
  return 0;
}

static int cpu_download(struct backend *be, void *host_dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes)
    memmove(host_dst, src, bytes);
  return 0;
}

static int cpu_memset0(struct backend *be, void *dst, size_t bytes) {
  (void)be;
  if (bytes)
    memset(dst, 0, bytes);
  return 0;
}

static int cpu_sync(struct backend *be) {
  (void)be;
  return 0; /* every CPU op has finished when it returns */
}

/* MemAvailable of /proc/meminfo: what the kernel estimates can be allocated without swapping. */
static size_t cpu_mem_available(struct backend *be) {
  (void)be;
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long v;
    if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
      kb = (size_t)v;
      break;
    }
  }
  fclose(f);
  return kb * 1024;
}

static size_t elem_align(enum dtype t) {
  switch (t) {
  case DTYPE_F32:
    return 4;
  case DTYPE_F16:
  case DTYPE_BF16:
    return 2;
  default:
    return 2; /* quantized blocks: even sizes, read through structs with f16 fields */
  }
}

static int cpu_weight_from_host(struct backend *be, struct weight *w, const void *host, enum dtype src_t,
                                int64_t rows, int64_t cols) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  if (src_t != DTYPE_F32 && src_t != DTYPE_F16 && src_t != DTYPE_BF16 &&
      !(dtype_is_quant(src_t) && src_t != DTYPE_Q8_K))
    return ERR("cpu backend: weights of dtype %s are not supported (use f32, f16, bf16 or a GGUF "
               "quant type)", dtype_name(src_t));
  if (rows <= 0 || cols <= 0 || cols > INT32_MAX)
    return ERR("cpu backend: bad weight shape (%lld, %lld)", (long long)rows, (long long)cols);
  if (cols % dtype_block_size(src_t) != 0)
    return ERR("cpu backend: %s weight with %lld columns (must be a multiple of %d)",
               dtype_name(src_t), (long long)cols, dtype_block_size(src_t));
  w->dtype = src_t;
  w->rows = rows;
  w->cols = cols;
  if ((uintptr_t)host % elem_align(src_t) == 0) {
    w->data = (void *)host; /* used in place: the mapped file must outlive the weight */
    return 0;
  }
  /* Misaligned elements (possible in a safetensors file) would be undefined behaviour to read
   * through a typed pointer: keep an aligned copy, owned by the backend. */
  size_t bytes = dtype_row_bytes(src_t, cols) * (size_t)rows;
  if (cb->num_owned == cb->cap_owned) {
    int cap = cb->cap_owned ? cb->cap_owned * 2 : 16;
    void **o = realloc(cb->owned, sizeof *o * (size_t)cap);
    if (!o)
      return ERR("out of memory");
    cb->owned = o;
    cb->cap_owned = cap;
  }
  void *p = cpu_alloc(be, bytes);
  if (!p)
    return -1;
  memcpy(p, host, bytes);
  cb->owned[cb->num_owned++] = p;
  w->data = p;
  return 0;
}

static void cpu_weight_free(struct backend *be, struct weight *w) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  cpu_comm_free(be);
  for (int i = 0; i < cb->num_owned; i++) {
    if (cb->owned[i] == w->data) {
      free(w->data);
      cb->owned[i] = cb->owned[--cb->num_owned];
      break;
    }
  }
  w->data = NULL;
}

float cpu_weight_elem(const struct weight *w, int64_t i) {
  switch (w->dtype) {
  case DTYPE_F32:
    return ((const float *)w->data)[i];
  case DTYPE_F16:
    return f16_to_f32(((const uint16_t *)w->data)[i]);
  case DTYPE_BF16:
    return bf16_to_f32(((const uint16_t *)w->data)[i]);
  default: { /* a quantized type: dequantize the block holding element i */
    float block[256];
    int bs = dtype_block_size(w->dtype);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)(i / bs) * dtype_block_bytes(w->dtype);
    dtype_to_f32(block, p, w->dtype, bs);
    return block[i % bs];
  }
  }
}

static void cpu_destroy(struct backend *be) {
  struct cpu_backend *cb = (struct cpu_backend *)be;
  cpu_comm_free(be);
  for (int i = 0; i < cb->num_owned; i++)
    free(cb->owned[i]);
  free(cb->owned);
  free(cb);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .memset0 = cpu_memset0,
    .sync = cpu_sync,
    .mem_available = cpu_mem_available,
    .weight_from_host = cpu_weight_from_host,
    .weight_free = cpu_weight_free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .gather_rows = cpu_gather_rows,
    .copy_blocks = cpu_copy_blocks,
    .destroy = cpu_destroy,
    .gelu_tanh_mul = cpu_gelu_tanh_mul,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .moe_route = cpu_moe_route,
    .moe_combine = cpu_moe_combine,
    .comm_id = cpu_comm_id,
    .comm_init = cpu_comm_init,
    .all_reduce_sum = cpu_all_reduce_sum,
    .comm_abort = cpu_comm_abort,
    .gather_cols = cpu_gather_cols,
    .matmul_n = cpu_matmul_n,
    .matmul_qkv_rope = cpu_matmul_qkv_rope,
    .matmul_add = cpu_matmul_add,
    .all_reduce_add = cpu_all_reduce_add,
    .rope_kv_write = cpu_rope_kv_write,
};

struct backend *backend_cpu_create(int num_threads) {
  if (num_threads < 0) {
    ERR("--threads %d: must be >= 0 (0 = all cores)", num_threads);
    return NULL;
  }
  struct cpu_backend *cb = calloc(1, sizeof *cb);
  if (!cb) {
    ERR("out of memory");
    return NULL;
  }
  cb->base.ops = &cpu_ops;
  cb->base.act_dtype = DTYPE_F32;
  /* Host memory; f32 and f16 caches (cpu_attention.c); nothing allocated lazily inside a step
   * (the workspace was zeroed, so its pages already count against MemAvailable); sampling is
   * the host sampler's (sampling/sampler.c, the reference for every other backend); asynchronous
   * steps run the engine's bookkeeping with the host sampler picking at launch. */
  cb->base.caps = (struct backend_caps){.host_memory = 1,
                                        .kv_dtypes = 1u << DTYPE_F32 | 1u << DTYPE_F16 | 1u << DTYPE_F8E4M3,
                                        .kv_auto = DTYPE_F32,
                                        .kv_auto_gguf = DTYPE_F16,
                                        .needs_profile = 0,
                                        .device_sampling = 0,
                                        .async_steps = 1};
  cb->base.num_threads = num_threads > 0 ? num_threads : omp_get_num_procs();
  /* All cores by default, but no more threads than the cores other processes leave idle: on a
   * busy machine a team larger than that waits on its descheduled members at every barrier. An
   * explicit --threads N is taken as it is. */
  omp_set_dynamic(num_threads == 0);
  if (cb->base.num_threads < 1)
    cb->base.num_threads = 1;
  return &cb->base;
}
