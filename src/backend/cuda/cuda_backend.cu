/* cuda_backend.cu - the CUDA backend: device memory, the stream, cuBLAS GEMMs and the ops table. */
#include "backend/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>

/* cuBLAS gets its workspace once at start-up (cublasSetWorkspace) so that no GEMM allocates. */
#define CUDA_BLAS_WS_BYTES ((size_t)32 << 20)
/* Rows of logits one sample call handles per launch before reserve sizes it (larger calls
 * loop); reserve raises it to max_seqs. */
#define CUDA_SAMPLE_CAP 64
/* Host staging for weight conversion: converted in chunks of at most this many bytes. */
#define CUDA_STAGE_BYTES ((size_t)64 << 20)

static void *cuda_alloc(struct backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  if (bytes == 0)
    bytes = 16;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky-free error state of the runtime */
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    ERR("CUDA out of memory: cannot allocate %.1f MiB (%.1f MiB free of %.1f MiB on the GPU); "
        "lower --pa-memory-fraction (or --pa-memory-mb / --pa-context-len), --max-num-seqs or "
        "--max-num-batched-tokens",
        bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
    return NULL;
  }
  return p;
}

static void cuda_free(struct backend *be, void *p) {
  (void)be;
  if (p)
    cudaFree(p);
}

static void *cuda_alloc_host(struct backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 16);
  if (e != cudaSuccess) {
    cudaGetLastError();
    ERR("CUDA error %s: cannot allocate %.1f MiB of pinned host memory; lower --max-num-batched-tokens or "
        "--max-num-seqs", cudaGetErrorName(e), bytes / 1048576.0);
    return NULL;
  }
  return p;
}

static void cuda_free_host(struct backend *be, void *p) {
  (void)be;
  if (p)
    cudaFreeHost(p);
}

static int cuda_upload(struct backend *be, void *dst, const void *host_src, size_t bytes) {
  /* From pageable memory the call returns once the source is staged, so the caller may reuse
   * host_src at once; the copy itself stays ordered on the stream. */
  cuda_step_timing_start(cuda_be(be)); /* (PAGODA_STEP_TIMING only: a step begins with its batch) */
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cuda_be(be)->stream));
  return 0;
}

static int cuda_download(struct backend *be, void *host_dst, const void *src, size_t bytes) {
  struct cuda_backend *cb = cuda_be(be);
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
  CUDA_CHECK(cudaStreamSynchronize(cb->stream));
  return 0;
}

static int cuda_memset0(struct backend *be, void *dst, size_t bytes) {
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda_be(be)->stream));
  return 0;
}

static int cuda_sync(struct backend *be) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_be(be)->stream));
  return 0;
}

static size_t cuda_mem_available(struct backend *be) {
  (void)be;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free_b;
}

/* Weights: matrices become BF16 (the GEMM input type); 1-D tensors (norm weights, biases)
 * stay F32, since they are tiny and the norm's scale is applied in f32 anyway. Conversion
 * happens on the host in chunks, then one synchronous copy per chunk (start-up only). */
static int cuda_weight_from_host(struct backend *be, struct weight *w, const void *host,
                                 enum dtype src_t, int64_t rows, int64_t cols) {
  (void)be;
  memset(w, 0, sizeof *w);
  if (rows <= 0 || cols <= 0)
    return ERR("cuda backend: weight of shape (%lld, %lld)", (long long)rows, (long long)cols);
  /* Quantized matrices are uploaded as they are (cuda_quant_gemm.cu); quantized vectors are
   * converted to f32 below like any other 1-D tensor. */
  if (rows > 1 && cuda_quant_type(src_t) >= 0)
    return cuda_quant_weight_upload(be, w, host, src_t, rows, cols);
  if (src_t != DTYPE_F32 && src_t != DTYPE_F16 && src_t != DTYPE_BF16 && cuda_quant_type(src_t) < 0)
    return ERR("cuda backend: weights of dtype %s are not supported", dtype_name(src_t));
  enum dtype dst_t = rows == 1 ? DTYPE_F32 : DTYPE_BF16;
  size_t esz = dst_t == DTYPE_F32 ? 4 : 2;
  size_t total = (size_t)rows * (size_t)cols * esz;
  void *d = cuda_alloc(be, total);
  if (!d)
    return -1;
  w->data = d;
  w->dtype = dst_t;
  w->rows = rows;
  w->cols = cols;
  if (src_t == dst_t) {
    cudaError_t e = cudaMemcpy(d, host, total, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      cudaFree(d);
      memset(w, 0, sizeof *w);
      CUDA_CHECK(e);
    }
    return 0;
  }
  size_t src_row = dtype_row_bytes(src_t, cols);
  size_t dst_row = (size_t)cols * esz;
  int64_t rows_per_chunk = (int64_t)(CUDA_STAGE_BYTES / dst_row);
  if (rows_per_chunk < 1)
    rows_per_chunk = 1;
  if (rows_per_chunk > rows)
    rows_per_chunk = rows;
  float *tmp = (float *)malloc((size_t)cols * sizeof(float));
  void *stage = malloc((size_t)rows_per_chunk * dst_row);
  if (!tmp || !stage) {
    free(tmp);
    free(stage);
    cudaFree(d);
    memset(w, 0, sizeof *w);
    return ERR("cuda backend: out of host memory converting a weight");
  }
  int rc = 0;
  for (int64_t r0 = 0; r0 < rows && rc == 0; r0 += rows_per_chunk) {
    int64_t nr = rows - r0 < rows_per_chunk ? rows - r0 : rows_per_chunk;
    for (int64_t r = 0; r < nr; r++) {
      const char *src = (const char *)host + (size_t)(r0 + r) * src_row;
      float *dst_f = dst_t == DTYPE_F32 ? (float *)stage + (size_t)r * cols : tmp;
      dtype_to_f32(dst_f, src, src_t, cols);
      if (dst_t == DTYPE_BF16) {
        uint16_t *o = (uint16_t *)stage + (size_t)r * cols;
        for (int64_t c = 0; c < cols; c++)
          o[c] = f32_to_bf16(tmp[c]);
      }
    }
    cudaError_t e = cudaMemcpy((char *)d + (size_t)r0 * dst_row, stage, (size_t)nr * dst_row,
                               cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
      rc = ERR("CUDA error %s (%s) in cudaMemcpy of a weight", cudaGetErrorName(e),
               cudaGetErrorString(e));
  }
  free(tmp);
  free(stage);
  if (rc != 0) {
    cudaFree(d);
    memset(w, 0, sizeof *w);
  }
  return rc;
}

static void cuda_weight_free(struct backend *be, struct weight *w) {
  (void)be;
  if (w && w->data)
    cudaFree(w->data);
  if (w)
    memset(w, 0, sizeof *w);
}

/* out(T, N) = x(T, K) @ W(N, K)^T. In cuBLAS's column-major terms this is
 * C(N, T) = op_T(W as (K, N), ld K) * x as (K, T), ld K; C has ld N. BF16 in, f32 compute. */
static int cuda_matmul(struct backend *be, void *out, const void *x, const struct weight *w,
                       const struct weight *bias, int T, int out_f32) {
  struct cuda_backend *cb = cuda_be(be);
  if (T <= 0)
    return T == 0 ? 0 : ERR("cuda matmul: T = %d", T);
  if (cuda_quant_type(w->dtype) >= 0) {
    if (cuda_quant_matmul(be, out, x, w, T, out_f32) != 0)
      return -1;
    return bias ? cuda_op_add_bias(be, out, out_f32, bias, T) : 0;
  }
  if (w->dtype != DTYPE_BF16)
    return ERR("cuda matmul: weight dtype %s (expected bf16 or a quantized type for a matrix)",
               dtype_name(w->dtype));
  const float alpha = 1.0f, beta = 0.0f;
  int N = (int)w->rows, K = (int)w->cols;
  if (T <= cb->gemv_max_t && K % 8 == 0) {
    if (cuda_gemv_bf16(be, out, x, w, T, out_f32) != 0)
      return -1;
    return bias ? cuda_op_add_bias(be, out, out_f32, bias, T) : 0;
  }
  CUBLAS_CHECK(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w->data, CUDA_R_16BF, K,
                            x, CUDA_R_16BF, K, &beta, out, out_f32 ? CUDA_R_32F : CUDA_R_16BF, N,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias)
    return cuda_op_add_bias(be, out, out_f32, bias, T);
  return 0;
}

/* Copy-on-write: per layer, K and V of block src[i] -> dst[i], as device-to-device copies. */
static int cuda_copy_blocks(struct backend *be, struct kv_layer *layers, int n_layers,
                            const int32_t *src, const int32_t *dst, int n) {
  struct cuda_backend *cb = cuda_be(be);
  for (int l = 0; l < n_layers; l++) {
    const struct kv_layer *kv = &layers[l];
    if (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3)
      return ERR("cuda backend: kv cache dtype %s is not supported (bf16 or f8e4m3)", dtype_name(kv->dtype));
    size_t blk = (size_t)kv->n_kv_heads * kv->block_size * dtype_row_bytes(kv->dtype, kv->head_dim);
    for (int i = 0; i < n; i++) {
      if (src[i] < 0 || src[i] >= kv->num_blocks || dst[i] < 0 || dst[i] >= kv->num_blocks)
        return ERR("copy_blocks: block %d -> %d out of range (%d blocks)", src[i], dst[i],
                   kv->num_blocks);
      CUDA_CHECK(cudaMemcpyAsync((char *)kv->k + (size_t)dst[i] * blk, (char *)kv->k + (size_t)src[i] * blk,
                                 blk, cudaMemcpyDeviceToDevice, cb->stream));
      CUDA_CHECK(cudaMemcpyAsync((char *)kv->v + (size_t)dst[i] * blk, (char *)kv->v + (size_t)src[i] * blk,
                                 blk, cudaMemcpyDeviceToDevice, cb->stream));
    }
  }
  return 0;
}

static void cuda_free_sample_staging(struct cuda_backend *cb) {
  cudaFree(cb->sample_params_dev);
  cudaFree(cb->sample_tokens_dev);
  cudaFreeHost(cb->sample_params_host);
  cudaFreeHost(cb->sample_tokens_host);
  cudaFree(cb->lp_out_dev);
  cudaFreeHost(cb->lp_out_host);
  cudaFree(cb->sample_rows_dev);
  cudaFreeHost(cb->sample_rows_host);
  cb->lp_out_dev = cb->lp_out_host = NULL;
  cb->sample_rows_dev = cb->sample_rows_host = NULL;
  cb->sample_params_dev = NULL;
  cb->sample_tokens_dev = NULL;
  cb->sample_params_host = NULL;
  cb->sample_tokens_host = NULL;
  cb->sample_cap = 0;
  cuda_async_free(cb);
}

/* The sampling staging for ROWS rows: parameters and tokens on the device, their pinned host
 * copies (one async copy each way per call). */
static int cuda_alloc_sample_staging(struct cuda_backend *cb, int rows) {
  cuda_free_sample_staging(cb);
  CUDA_CHECK(cudaMalloc(&cb->sample_params_dev, sizeof(struct backend_sample_params) * rows));
  CUDA_CHECK(cudaMalloc(&cb->sample_tokens_dev, sizeof(int32_t) * rows));
  CUDA_CHECK(cudaMallocHost(&cb->sample_params_host, sizeof(struct backend_sample_params) * rows));
  CUDA_CHECK(cudaMallocHost(&cb->sample_tokens_host, sizeof(int32_t) * rows));
  CUDA_CHECK(cudaMalloc(&cb->lp_out_dev, sizeof(float) * rows));
  CUDA_CHECK(cudaMallocHost(&cb->lp_out_host, sizeof(float) * rows));
  CUDA_CHECK(cudaMalloc(&cb->sample_rows_dev, sizeof(int32_t) * rows));
  CUDA_CHECK(cudaMallocHost(&cb->sample_rows_host, sizeof(int32_t) * rows));
  if (cuda_async_alloc(cb, rows))
    return -1;
  cb->sample_cap = rows;
  return 0;
}

/* Sizes the step scratch for the engine's largest step: sampling and logprob staging for
 * max_seqs rows (one launch samples the whole batch), and the bound the split-K decode attention
 * sizes its scratch for (allocated on its first call, the profiling step, outside any graph
 * capture; cuda_attn_decode.cu). The cuBLAS workspace (cublasSetWorkspace, fixed size) and the
 * quantized-weight slab were given at creation and load. */
static int cuda_reserve(struct backend *be, int max_tokens, int max_seqs, int max_blocks) {
  struct cuda_backend *cb = cuda_be(be);
  (void)max_tokens;
  cuda_preload_join(cb); /* the modules' memory is in use before the profiling step measures */
  if (cuda_attention_reserve(be, max_seqs, max_blocks * 32)) /* 32: the largest block size */
    return -1;
  if (max_seqs > cb->sample_cap) {
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    if (cuda_alloc_sample_staging(cb, max_seqs))
      return ERR("cuda: cannot allocate the sampling staging for %d sequences: lower --max-num-seqs", max_seqs);
  }
  return 0;
}

static void cuda_destroy(struct backend *be) {
  struct cuda_backend *cb = cuda_be(be);
  if (!cb)
    return;
  cuda_preload_join(cb);
  if (cb->stream) /* drained before the staging the peers read is freed */
    cudaStreamSynchronize(cb->stream);
  cuda_comm_free(cb);
  cuda_step_timing_report(cb);
  if (cb->blas)
    cublasDestroy(cb->blas);
  cudaFree(cb->blas_ws);
  cudaFree(cb->deq_scratch);
  cudaFree(cb->attn_scratch);
  cuda_graph_free_all(cb);
  cuda_free_sample_staging(cb);
  cuda_sample_free(cb);
  cudaFree(cb->proc_dev);
  cudaFreeHost(cb->proc_host);
  if (cb->stream)
    cudaStreamDestroy(cb->stream);
  free(cb);
}

static int cuda_bind(struct backend *be) {
  CUDA_CHECK(cudaSetDevice(cuda_be(be)->device));
  return 0;
}

static const struct backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .upload = */ cuda_upload,
    /* .download = */ cuda_download,
    /* .memset0 = */ cuda_memset0,
    /* .sync = */ cuda_sync,
    /* .mem_available = */ cuda_mem_available,
    /* .weight_from_host = */ cuda_weight_from_host,
    /* .weight_free = */ cuda_weight_free,
    /* .embed = */ cuda_op_embed,
    /* .rmsnorm = */ cuda_op_rmsnorm,
    /* .matmul = */ cuda_matmul,
    /* .rope = */ cuda_op_rope,
    /* .silu_mul = */ cuda_op_silu_mul,
    /* .kv_write = */ cuda_op_kv_write,
    /* .attention = */ cuda_op_attention,
    /* .gather_rows = */ cuda_op_gather_rows,
    /* .copy_blocks = */ cuda_copy_blocks,
    /* .destroy = */ cuda_destroy,
    /* .reserve = */ cuda_reserve,
    /* .sample = */ cuda_op_sample,
    /* .gelu_tanh_mul = */ cuda_op_gelu_tanh_mul,
    /* .scale = */ cuda_op_scale,
    /* .softcap = */ cuda_op_softcap,
    /* .moe_route = */ cuda_op_moe_route,
    /* .moe_combine = */ cuda_op_moe_combine,
    /* .process = */ cuda_op_process,
    /* .logprob_rows = */ cuda_op_logprob_rows,
    /* .alloc_host = */ cuda_alloc_host,
    /* .free_host = */ cuda_free_host,
    /* .graph_run = */ cuda_graph_run,
    /* .sample_rows = */ cuda_op_sample_rows,
    /* .stash_rows = */ cuda_op_stash_rows,
    /* .topk_rows = */ cuda_op_topk_rows,
    /* .sample_async = */ cuda_op_sample_async,
    /* .sample_wait = */ cuda_op_sample_wait,
    /* .resolve_ids = */ cuda_op_resolve_ids,
    /* .bind = */ cuda_bind,
#ifdef PAGODA_HAVE_NCCL
    /* .comm_id = */ cuda_comm_id,
    /* .comm_init = */ cuda_comm_init,
    /* .all_reduce_sum = */ cuda_all_reduce_sum,
    /* .comm_check = */ cuda_comm_check,
    /* .comm_abort = */ cuda_comm_abort,
    /* .gather_cols = */ cuda_gather_cols,
#else
    NULL, NULL, NULL, NULL, NULL, NULL,
#endif
    /* .matmul_n = */ cuda_op_matmul_n,
    /* .matmul_silu_mul = */ cuda_op_matmul_silu_mul,
    /* .rope_kv_write = */ cuda_op_rope_kv_write,
    /* .matmul_qkv_rope = */ cuda_op_matmul_qkv_rope,
    /* .matmul_add = */ cuda_op_matmul_add,
    /* .all_reduce_add = */ NULL, /* the fused peer all-reduce + add: branch tpar, not run on 2 GPUs yet */
#ifdef PAGODA_HAVE_NCCL
    /* .peer_ar_alloc = */ cuda_peer_ar_alloc,
    /* .peer_ar_connect = */ cuda_peer_ar_connect,
#else
    NULL, NULL,
#endif
};

/* How the context loads kernels, for the start-up line: the pagoda command asks for eager loading
 * (src/cli/main.c), but CUDA may have started before pagoda was loaded; under lazy loading pagoda's
 * own kernels are preloaded (cuda_preload.cu), or the line says why not (written into NOTE when
 * so). Empty when the driver or the runtime (before CUDA 12.5) cannot say. */
static const char *loading_mode_note(const struct cuda_backend *cb, char *note, size_t size) {
  switch (cuda_loading_lazy()) {
  case 0:
    return ", kernels loaded at start-up";
  case 1:
    if (cb->preload)
      return ", pagoda's kernels loading in the background (lazy loading: CUDA_MODULE_LOADING is not EAGER, or "
             "CUDA started before pagoda; other libraries' kernels load on first use)";
    snprintf(note, size,
             ", kernels loaded on first use (lazy: CUDA_MODULE_LOADING is not EAGER, or CUDA started before pagoda; "
             "not preloaded: %s)", cb->preload_skip ? cb->preload_skip : "?");
    return note;
  default:
    return "";
  }
}

/* The plain reason there is no usable GPU, for users: no driver, a driver older than the runtime,
 * no device, or a device without bf16. */
extern "C" int cuda_backend_available(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (e == cudaErrorInsufficientDriver && drv == 0)
      ERR("no NVIDIA driver is installed on this machine");
    else if (e == cudaErrorInsufficientDriver)
      ERR("the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime pagoda was built with; "
          "update the driver", drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    else if (e == cudaErrorNoDevice)
      ERR("no NVIDIA GPU was found");
    else
      ERR("the GPU cannot be used: %s", cudaGetErrorString(e));
    return 0;
  }
  if (n <= 0) {
    ERR("no NVIDIA GPU was found");
    return 0;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    ERR("the properties of GPU 0 cannot be read");
    return 0;
  }
  if (prop.major < 8) {
    ERR("%s has compute capability %d.%d; pagoda's CUDA backend needs 8.0 or newer (bf16)", prop.name,
        prop.major, prop.minor);
    return 0;
  }
  return 1;
}

/* A setting from the environment: DEF when NAME is unset or empty, else a decimal integer in
 * [LO, HI] (LO >= 0); -1 (error set, saying WHAT was expected) for anything else. */
static int env_int(const char *name, int def, int lo, int hi, const char *what) {
  const char *v = getenv(name);
  if (!v || !*v)
    return def;
  char *end;
  long n = strtol(v, &end, 10);
  if (*end || n < lo || n > hi)
    return ERR("%s=%s: expected %s", name, v, what);
  return (int)n;
}

/* An on/off switch: DEF when unset, else 0 or 1. */
static int env_flag(const char *name, int def) { return env_int(name, def, 0, 1, "0 or 1"); }

static int cuda_init(struct cuda_backend *cb, int device) {
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n <= 0)
    return ERR("--device cuda: no CUDA device found");
  if (device < 0 || device >= n)
    return ERR("--tp: GPU %d asked for, but this machine has %d GPU%s (lower --tp to at most %d)", device, n,
               n == 1 ? "" : "s", n);
  cb->device = device;
  CUDA_CHECK(cudaSetDevice(cb->device));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, cb->device));
  if (prop.major < 8)
    return ERR("--device cuda: %s has compute capability %d.%d; pagoda's CUDA backend needs 8.0 or "
               "newer (bf16)", prop.name, prop.major, prop.minor);
  snprintf(cb->name, sizeof cb->name, "%s", prop.name);
  cb->smem_optin = prop.sharedMemPerBlockOptin < CUDA_SMEM_OPTIN_MAX ? (int)prop.sharedMemPerBlockOptin
                                                                      : CUDA_SMEM_OPTIN_MAX;
  CUDA_CHECK(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cb->blas));
  CUBLAS_CHECK(cublasSetStream(cb->blas, cb->stream));
  cb->blas_ws_bytes = CUDA_BLAS_WS_BYTES;
  CUDA_CHECK(cudaMalloc(&cb->blas_ws, cb->blas_ws_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(cb->blas, cb->blas_ws, cb->blas_ws_bytes));
  cb->gemv_max_t = CUDA_GEMV_MAX_T;
  const char *gmax = getenv("PAGODA_GEMV_MAX_T"); /* for measuring the GEMV/cuBLAS crossover; 0: cuBLAS */
  if (gmax && *gmax)
    cb->gemv_max_t = atoi(gmax) < CUDA_GEMV_MAX_T ? atoi(gmax) : CUDA_GEMV_MAX_T;
  /* The fused ops (matmul_n, matmul_silu_mul, rope_kv_write): on unless set to 0, for measuring
   * what they save (docs/cuda.md, Fused ops). */
  const char *fo = getenv("PAGODA_FUSED_OPS"), *fs = getenv("PAGODA_FUSED_SILU");
  cb->fused_ops = !(fo && strcmp(fo, "0") == 0);
  cb->fused_silu = !(fs && strcmp(fs, "0") == 0);
  /* The RMSNorm in the GEMV's prologue and the residual add in its epilogue (cuda_gemv.cu):
   * PAGODA_FUSED_NORM=0 turns both off (the add + rmsnorm op between the sub-blocks instead);
   * PAGODA_GEMV_PRE_ROWS=4|8|16 sets the prologue's warps per block, PAGODA_GEMV_PRE_LOOP=1|2|4
   * its rows per warp, PAGODA_GEMV_PRE_L2=1 prefetches the first weight steps into L2 rather than
   * loading them into registers (the default, CUDA_GEMV_PRE_L2 0). For measuring them. */
  const char *fn = getenv("PAGODA_FUSED_NORM"), *pr = getenv("PAGODA_GEMV_PRE_ROWS"),
             *pl = getenv("PAGODA_GEMV_PRE_LOOP");
  cb->fused_norm = cb->fused_ops && !(fn && strcmp(fn, "0") == 0);
  /* q/k/v + RoPE + KV write in one kernel (matmul_qkv_rope): PAGODA_FUSED_ROPE=0 turns it off (the
   * model then runs matmul_n and rope_kv_write), for measuring it. */
  const char *fr = getenv("PAGODA_FUSED_ROPE");
  cb->fused_rope = cb->fused_ops && !(fr && strcmp(fr, "0") == 0);
  /* Several warps per row of a matrix with too few rows to fill the GPU (cuda_gemv.cu,
   * gemv_split): PAGODA_GEMV_SPLIT=0 keeps one warp per row, for measuring it (same bits). */
  const char *gs = getenv("PAGODA_GEMV_SPLIT");
  cb->gemv_split = !(gs && strcmp(gs, "0") == 0);
  /* PAGODA_GEMV_PRE_SPLIT=0: only the prenorm GEMVs keep one warp per row group. PAGODA_GEMV_REG:
   * the plain GEMVs' first weight steps into registers (1) or L2 (0) before their wait.
   * PAGODA_QX_EARLY, PAGODA_ATTN_EARLY: the x quantization of the integer-dot GEMV (decode
   * attention) triggering the next kernel before its own wait. PAGODA_EPI_EARLY: the GEMV
   * epilogues' reads right after their wait. PAGODA_ATTN_PREFETCH=n: decode attention's first n
   * keys' K/V rows prefetched before its wait, PAGODA_ATTN_EXIT_EARLY its blocks without keys leaving
   * before it, PAGODA_ATTN_KV_EARLY its first keys' K/V loaded before it, PAGODA_ATTN_CLUSTER its
   * partitions combined through distributed shared memory. PAGODA_QG_EVICT_FIRST: the integer-dot GEMV's
   * weight copies with L2's evict-first policy (the ring GEMV's too). PAGODA_ROPE_KV_SPLIT:
   * rope_kv_write over several blocks per token. PAGODA_GEMV_RING, _KB, _LATE, _MIN_K: the ring
   * GEMV at T = 1 (cuda_gemv.cu; cuda_backend.h). For measuring them. */
  if ((cb->gemv_pre_split = env_flag("PAGODA_GEMV_PRE_SPLIT", 1)) < 0 ||
      (cb->gemv_reg = env_flag("PAGODA_GEMV_REG", CUDA_GEMV_REG)) < 0 ||
      (cb->qx_early = env_flag("PAGODA_QX_EARLY", CUDA_QX_EARLY)) < 0 ||
      (cb->epi_early = env_flag("PAGODA_EPI_EARLY", CUDA_EPI_EARLY)) < 0 ||
      (cb->attn_prefetch =
           env_int("PAGODA_ATTN_PREFETCH", CUDA_ATTN_PREFETCH, 0, 65535, "a number of keys, at most 65535 (0: off)")) < 0 ||
      (cb->attn_early = env_flag("PAGODA_ATTN_EARLY", CUDA_ATTN_EARLY)) < 0 ||
      (cb->attn_exit_early = env_flag("PAGODA_ATTN_EXIT_EARLY", CUDA_ATTN_EXIT_EARLY)) < 0 ||
      (cb->attn_kv_early = env_flag("PAGODA_ATTN_KV_EARLY", CUDA_ATTN_KV_EARLY)) < 0 ||
      (cb->attn_cluster = env_int("PAGODA_ATTN_CLUSTER", CUDA_ATTN_CLUSTER, 0, 16,
                                  "blocks per cluster, 2..16 (0: off)")) < 0 ||
      (cb->rope_kv_split = env_flag("PAGODA_ROPE_KV_SPLIT", CUDA_ROPE_KV_SPLIT)) < 0 ||
      (cb->preload_on = env_flag("PAGODA_CUDA_PRELOAD", 1)) < 0 ||
      (cb->qg_evict_first = env_flag("PAGODA_QG_EVICT_FIRST", CUDA_QG_EVICT_FIRST)) < 0 ||
      (cb->gemv_ring = env_flag("PAGODA_GEMV_RING", CUDA_GEMV_RING)) < 0 ||
      (cb->gemv_ring_late = env_flag("PAGODA_GEMV_RING_LATE", CUDA_GEMV_RING_LATE)) < 0 ||
      (cb->gemv_ring_store = env_flag("PAGODA_GEMV_RING_STORE", CUDA_GEMV_RING_STORE)) < 0 ||
      (cb->qgemv_ring = env_flag("PAGODA_QGEMV_RING", CUDA_QGEMV_RING)) < 0 ||
      (cb->qgemv_ring_warps = env_int("PAGODA_QGEMV_RING_WARPS", CUDA_QGEMV_RING_WARPS, 8, 16, "8 or 16")) < 0 ||
      (cb->qgemv_ring_cv = env_int("PAGODA_QGEMV_RING_CHUNK", CUDA_QGEMV_RING_CHUNK, 1024, 2048, "1024 or 2048")) < 0 ||
      (cb->gemv_ring_min_k = env_int("PAGODA_GEMV_RING_MIN_K", CUDA_GEMV_RING_MIN_K, 0, INT32_MAX,
                                     "a row length (0: every length)")) < 0 ||
      (cb->gemv_ring_kb = env_int("PAGODA_GEMV_RING_KB", CUDA_GEMV_RING_KB, 32, 192,
                                  "a ring size in KiB per block (32..192)")) < 0 ||
      (cb->gemv_ring_pre_ahead = env_int("PAGODA_GEMV_RING_PRE_AHEAD", CUDA_GEMV_RING_PRE_AHEAD, 0, 8,
                                         "chunks per warp before the wait (1..8; 0: half the ring)")) < 0)
    return -1;
  if (cb->qgemv_ring_warps % 8 != 0)
    return ERR("PAGODA_QGEMV_RING_WARPS=%d: expected 8 or 16", cb->qgemv_ring_warps);
  if (cb->qgemv_ring_cv % 1024 != 0)
    return ERR("PAGODA_QGEMV_RING_CHUNK=%d: expected 1024 or 2048", cb->qgemv_ring_cv);
  cb->gemv_pre_split = cb->gemv_pre_split && cb->gemv_split;
  /* The bf16 prologue only for rows of at most N values (PAGODA_GEMV_PRE_MAX_K=N; at 8B, K = 4096,
   * it first measured slower than the separate norm, then faster once the q/k/v split came,
   * bench/RESULTS.md), for measuring it. */
  if ((cb->gemv_pre_max_k = env_int("PAGODA_GEMV_PRE_MAX_K", 0, 0, INT32_MAX, "a row length (0: no limit)")) < 0)
    return -1;
  cb->gemv_pre_rows = CUDA_GEMV_PRE_ROWS;
  if (pr && *pr) {
    if (strcmp(pr, "4") && strcmp(pr, "8") && strcmp(pr, "16"))
      return ERR("PAGODA_GEMV_PRE_ROWS=%s: expected 4, 8 or 16 (warps per block of the prenorm GEMV)", pr);
    cb->gemv_pre_rows = atoi(pr);
  }
  cb->gemv_pre_loop = CUDA_GEMV_PRE_LOOP;
  if (pl && *pl) {
    if (strcmp(pl, "1") && strcmp(pl, "2") && strcmp(pl, "4"))
      return ERR("PAGODA_GEMV_PRE_LOOP=%s: expected 1, 2 or 4 (weight rows per warp of the prenorm GEMV)", pl);
    cb->gemv_pre_loop = atoi(pl);
  }
  if ((cb->gemv_pre_l2 = env_int("PAGODA_GEMV_PRE_L2", CUDA_GEMV_PRE_L2, 0, 1,
                                  "0 or 1 (the prenorm GEMV's first weight steps into registers or L2)")) < 0)
    return -1;
  /* Programmatic dependent launch (cuda_pdl.cuh): Hopper and newer; PAGODA_PDL=0 turns it off
   * (for measuring it and for bisecting: the outputs are the same either way). */
  const char *pdl = getenv("PAGODA_PDL");
  cb->pdl = prop.major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
  if (cb->attn_cluster == 1)
    return ERR("PAGODA_ATTN_CLUSTER=1: expected 2..16 blocks per cluster (0: off)");
  if (prop.major < 9)
    cb->attn_cluster = 0; /* thread block clusters: compute capability 9.0 and newer */
  /* Decode attention's split-K reduction folded into its last partition block (cuda_attn_decode.cu);
   * PAGODA_ATTN_FOLD=0 keeps the separate reduce kernel (same bits; for measuring and bisecting). */
  const char *fold = getenv("PAGODA_ATTN_FOLD");
  cb->attn_fold = !(fold && strcmp(fold, "0") == 0);
  cb->qgemv_max_t = CUDA_QGEMV_MAX_T;
  const char *qmax = getenv("PAGODA_QGEMV_MAX_T"); /* for measuring the GEMV/GEMM crossover */
  if (qmax && *qmax)
    cb->qgemv_max_t = atoi(qmax);
  if (cuda_alloc_sample_staging(cb, CUDA_SAMPLE_CAP))
    return -1;
  cb->preload_skip = cuda_preload_start(cb);
  char note[256];
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  log_info("cuda: %s, compute capability %d.%d, %d SMs, %.1f GiB free of %.1f GiB%s%s", prop.name,
           prop.major, prop.minor, prop.multiProcessorCount, free_b / 1073741824.0,
           total_b / 1073741824.0, cb->pdl ? ", programmatic dependent launch" : "",
           loading_mode_note(cb, note, sizeof note));
  return 0;
}

extern "C" struct backend *cuda_backend_create(const struct backend_params *p) {
  struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof *cb);
  if (!cb) {
    ERR("out of memory");
    return NULL;
  }
  cb->base.ops = &cuda_ops;
  cb->base.act_dtype = DTYPE_BF16;
  cb->base.num_threads = 0;
  /* Device memory; a bf16 cache (cuda_attention.cu); cuBLAS and lazily loaded kernel modules
   * allocate on first use, so the engine profiles one step before sizing the pool; sampling
   * runs on the device (cuda_sample.cu). */
  cb->base.caps.host_memory = 0;
  cb->base.caps.kv_dtypes = 1u << DTYPE_BF16 | 1u << DTYPE_F8E4M3;
  cb->base.caps.kv_auto = DTYPE_BF16;
  cb->base.caps.kv_auto_gguf = DTYPE_BF16;
  cb->base.caps.needs_profile = 1;
  cb->base.caps.device_sampling = 1;
  cb->base.caps.graphs = 1;
  cb->base.caps.async_steps = 1;
  const char *g = getenv("PAGODA_CUDA_GRAPHS"); /* 0: replay off (the batches are padded still) */
  cb->graphs_on = !(g && !strcmp(g, "0"));
  if (cuda_init(cb, p ? p->device_index : 0) != 0) {
    cuda_destroy(&cb->base);
    return NULL;
  }
  cb->base.caps.graph_short_ctx = cuda_attn_graph_short_ctx(cb); /* after cuda_init: attn_cluster */
  return &cb->base;
}

cudaError_t cuda_smem_opt_in(const struct cuda_backend *cb, const void *fn, unsigned long long *opted) {
  const unsigned long long bit = cb->device >= 0 && cb->device < 64 ? 1ull << cb->device : 0;
  if (bit && (__atomic_load_n(opted, __ATOMIC_ACQUIRE) & bit))
    return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, cb->smem_optin);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess && bit)
    __atomic_fetch_or(opted, bit, __ATOMIC_RELEASE);
  return e;
}

int cuda_sm_count(struct cuda_backend *cb) {
  if (cb->num_sms <= 0) {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, cb->device));
    cb->num_sms = v > 0 ? v : 1;
  }
  return cb->num_sms;
}
