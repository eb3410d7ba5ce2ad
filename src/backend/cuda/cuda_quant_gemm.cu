/* cuda_quant_gemm.cu - larger-batch matmuls on quantized weights, and the choice between the
 * two paths.
 *
 * For T > CUDA_QGEMV_MAX_T activation rows the weight is dequantized, a slab of rows at a time,
 * into a bf16 scratch buffer (allocated once, when the first quantized weight is uploaded),
 * and each slab is one cuBLAS bf16 GEMM on tensor cores writing its columns of the output.
 * The quantized weight stays the only copy kept; the scratch is at most CUDA_DEQ_SCRATCH_BYTES. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant.cuh"

#include <stddef.h>
#include <stdlib.h>

extern "C" {
#include "util/quant.h"
}

typedef __nv_bfloat16 bf16;

struct cq_info {
  enum dtype dt;
  int qk;
  size_t bytes;
};

/* cq_type -> the dtype it implements and its block geometry (same order as enum cq_type), from
 * the host layouts in util/quant.h; the kernels' byte offsets (cuda_quant.cuh) are pinned to
 * those structs by the static_asserts below. */
static const struct cq_info cq_table[CQ_COUNT] = {
    {DTYPE_Q4_0, QK4_0, sizeof(struct block_q4_0)},    {DTYPE_Q4_1, QK4_1, sizeof(struct block_q4_1)},
    {DTYPE_Q5_0, QK5_0, sizeof(struct block_q5_0)},    {DTYPE_Q5_1, QK5_1, sizeof(struct block_q5_1)},
    {DTYPE_Q8_0, QK8_0, sizeof(struct block_q8_0)},    {DTYPE_Q2_K, QK_K, sizeof(struct block_q2_K)},
    {DTYPE_Q3_K, QK_K, sizeof(struct block_q3_K)},     {DTYPE_Q4_K, QK_K, sizeof(struct block_q4_K)},
    {DTYPE_Q5_K, QK_K, sizeof(struct block_q5_K)},     {DTYPE_Q6_K, QK_K, sizeof(struct block_q6_K)},
    {DTYPE_IQ4_NL, QK4_NL, sizeof(struct block_iq4_nl)}, {DTYPE_IQ4_XS, QK_K, sizeof(struct block_iq4_xs)},
};

#define CQ_PIN(QT, S) \
  static_assert(cq_traits<QT>::BYTES == sizeof(struct S), #S " size"); \
  static_assert(cq_traits<QT>::QK == (QT == CQ_Q4_0 || QT == CQ_Q4_1 || QT == CQ_Q5_0 || QT == CQ_Q5_1 || \
                                      QT == CQ_Q8_0 || QT == CQ_IQ4_NL ? 32 : QK_K), #S " block")
CQ_PIN(CQ_Q4_0, block_q4_0);
CQ_PIN(CQ_Q4_1, block_q4_1);
CQ_PIN(CQ_Q5_0, block_q5_0);
CQ_PIN(CQ_Q5_1, block_q5_1);
CQ_PIN(CQ_Q8_0, block_q8_0);
CQ_PIN(CQ_Q2_K, block_q2_K);
CQ_PIN(CQ_Q3_K, block_q3_K);
CQ_PIN(CQ_Q4_K, block_q4_K);
CQ_PIN(CQ_Q5_K, block_q5_K);
CQ_PIN(CQ_Q6_K, block_q6_K);
CQ_PIN(CQ_IQ4_NL, block_iq4_nl);
CQ_PIN(CQ_IQ4_XS, block_iq4_xs);
/* the field offsets cq_deq8 reads */
static_assert(offsetof(struct block_q5_1, qh) == 4 && offsetof(struct block_q5_1, qs) == 8, "q5_1");
static_assert(offsetof(struct block_q2_K, qs) == 16 && offsetof(struct block_q2_K, d) == 80, "q2_K");
static_assert(offsetof(struct block_q3_K, qs) == 32 && offsetof(struct block_q3_K, scales) == 96 &&
                  offsetof(struct block_q3_K, d) == 108, "q3_K");
static_assert(offsetof(struct block_q4_K, scales) == 4 && offsetof(struct block_q4_K, qs) == 16, "q4_K");
static_assert(offsetof(struct block_q5_K, qh) == 16 && offsetof(struct block_q5_K, qs) == 48, "q5_K");
static_assert(offsetof(struct block_q6_K, qh) == 128 && offsetof(struct block_q6_K, scales) == 192 &&
                  offsetof(struct block_q6_K, d) == 208, "q6_K");
static_assert(offsetof(struct block_iq4_xs, scales_l) == 4 && offsetof(struct block_iq4_xs, qs) == 8, "iq4_xs");

int cuda_quant_type(enum dtype t) {
  for (int i = 0; i < CQ_COUNT; i++)
    if (cq_table[i].dt == t)
      return i;
  return -1;
}

int cuda_quant_block_values(int qt) { return cq_table[qt].qk; }

size_t cuda_quant_row_bytes(int qt, int64_t cols) {
  return (size_t)(cols / cq_table[qt].qk) * (size_t)cq_table[qt].bytes;
}

/* rows [r0, r0 + nr) of W -> scratch (nr, K) bf16; each thread writes 8 values (16 bytes). */
template <int QT>
__global__ void qdeq_kernel(bf16 *dst, const uint8_t *W, size_t row_bytes, int64_t r0, int nr, int K) {
  const int per_row = K / 8;
  const int64_t n = (int64_t)nr * per_row;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / per_row;
    int e0 = (int)(i % per_row) * 8;
    float v[8];
    cq_deq8<QT>(W + (size_t)(r0 + r) * row_bytes, e0, v);
    __align__(16) bf16 o[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
      o[j] = __float2bfloat16(v[j]);
    *(uint4 *)(dst + r * K + e0) = *(const uint4 *)o;
  }
}

/* Dequantizes rows [r0, r0 + nr) of W into dst (nr, K) bf16 on the backend's stream. */
int cuda_quant_dequant_rows(struct backend *be, void *dst, const struct weight *w, int64_t r0, int nr) {
  int qt = cuda_quant_type(w->dtype);
  if (qt < 0)
    return ERR("cuda dequantize: weight dtype %s is not a quantized type", dtype_name(w->dtype));
  size_t row_bytes = cuda_quant_row_bytes(qt, w->cols);
  int K = (int)w->cols;
  int64_t n = (int64_t)nr * (K / 8);
  int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 16)
    blocks = 65535 * 16;
  cudaStream_t st = cuda_be(be)->stream;
  CQ_DISPATCH(qt, (qdeq_kernel<QT_><<<(int)blocks, threads, 0, st>>>((bf16 *)dst, (const uint8_t *)w->data,
                                                                  row_bytes, r0, nr, K)));
  CUDA_LAUNCH_CHECK();
  return 0;
}

/* The quantized matmul: the fused GEMV for T <= CUDA_QGEMV_MAX_T (or PAGODA_QGEMV_MAX_T when
 * set, for measuring the crossover), else dequantize slabs + cuBLAS. */
int cuda_quant_matmul(struct backend *be, void *out, const void *x, const struct weight *w, int T,
                      int out_f32) {
  struct cuda_backend *cb = cuda_be(be);
  if (T <= cb->qgemv_max_t)
    return cuda_quant_gemv(be, out, x, w, T, out_f32);
  if (!cb->deq_scratch)
    return ERR("cuda quantized matmul: no dequantization scratch (weight not loaded through "
               "weight_from_host)");
  int64_t N = w->rows, K = w->cols;
  int64_t slab = (int64_t)(cb->deq_scratch_bytes / ((size_t)K * 2));
  if (slab < 1)
    return ERR("cuda quantized matmul: a row of %lld values does not fit the %zu-byte scratch",
               (long long)K, cb->deq_scratch_bytes);
  if (slab > N)
    slab = N;
  const float alpha = 1.0f, beta = 0.0f;
  size_t osz = out_f32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < N; r0 += slab) {
    int nr = (int)(N - r0 < slab ? N - r0 : slab);
    if (cuda_quant_dequant_rows(be, cb->deq_scratch, w, r0, nr) != 0)
      return -1;
    /* out(T, N) row-major = C(N, T) column-major, ld N; this slab is C rows [r0, r0 + nr). */
    CUBLAS_CHECK(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, nr, T, (int)K, &alpha, cb->deq_scratch,
                              CUDA_R_16BF, (int)K, x, CUDA_R_16BF, (int)K, &beta, (char *)out + r0 * osz,
                              out_f32 ? CUDA_R_32F : CUDA_R_16BF, (int)N, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }
  return 0;
}

/* Uploads a quantized weight as it is (blocks unchanged) and makes sure the dequantization
 * scratch can hold a slab of it (grown at load time only, up to CUDA_DEQ_SCRATCH_BYTES). */
int cuda_quant_weight_upload(struct backend *be, struct weight *w, const void *host, enum dtype t,
                             int64_t rows, int64_t cols) {
  struct cuda_backend *cb = cuda_be(be);
  int qt = cuda_quant_type(t);
  if (qt < 0)
    return ERR("cuda backend: dtype %s is not a quantized type", dtype_name(t));
  if (cols % cq_table[qt].qk != 0)
    return ERR("cuda backend: %s weight with %lld columns (not a multiple of %d)", dtype_name(t),
               (long long)cols, cq_table[qt].qk);
  size_t bytes = cuda_quant_row_bytes(qt, cols) * (size_t)rows;
  void *d = be->ops->alloc(be, bytes);
  if (!d)
    return -1;
  cudaError_t e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(d);
    CUDA_CHECK(e);
  }
  w->data = d;
  w->dtype = t;
  w->rows = rows;
  w->cols = cols;
  if (rows > 1) {
    size_t want = (size_t)rows * (size_t)cols * 2;
    if (want > CUDA_DEQ_SCRATCH_BYTES)
      want = CUDA_DEQ_SCRATCH_BYTES;
    if (want < (size_t)cols * 2)
      want = (size_t)cols * 2;
    if (want < cuda_quant_x8_bytes(CUDA_QGEMV_MAX_T, cols)) /* the GEMV's int8 activations live here too */
      want = cuda_quant_x8_bytes(CUDA_QGEMV_MAX_T, cols);
    if (want > cb->deq_scratch_bytes) {
      void *s = be->ops->alloc(be, want);
      if (!s) {
        cudaFree(d);
        memset(w, 0, sizeof *w);
        return -1;
      }
      cudaFree(cb->deq_scratch);
      cb->deq_scratch = s;
      cb->deq_scratch_bytes = want;
    }
  }
  return 0;
}

CUDA_PRELOAD_ANCHOR(quant_gemm)
