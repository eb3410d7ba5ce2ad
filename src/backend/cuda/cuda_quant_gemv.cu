/* cuda_quant_gemv.cu - decode-sized matmuls on quantized weights: a fused dequantize-and-
 * multiply GEMV that reads every weight byte once per call, for up to CUDA_QGEMV_MAX_T
 * activation rows, and the quantized embedding gather.
 *
 * Layout of the work: one warp per output feature (weight row); lane l dequantizes the 8
 * values [it * 256 + 8 l, +8) of the row in f32 and multiplies them with the same 8 columns
 * of each of the T bf16 activation rows (one 16-byte load per row), so a warp step covers 256
 * columns (one K-quant super-block, or eight 32-value blocks). Sums are f32, reduced over
 * the warp by shuffles at the end. QGEMV_UNROLL warp steps are loaded before they are
 * multiplied, to keep more weight bytes in flight. Activations stay bf16 (not quantized to 8 bits): the
 * kernel is bound by the weight bytes at these sizes, so int8 dot products would only add a
 * quantization pass and its rounding.
 * Measured and rejected (bench/RESULTS.md, "CUDA quantized matmul"): two weight rows per warp
 * sharing each activation load, with the dot product factored as a * (q . x) + b * sum(x), was
 * 10-50% slower at every shape and T <= 8 (half the warps in flight for the same bytes). */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant.cuh"

typedef __nv_bfloat16 bf16;

#define QGEMV_WARPS 4 /* rows per block */
#ifndef QGEMV_UNROLL
#define QGEMV_UNROLL 4 /* warp steps (256 columns each) whose loads are in flight together */
#endif

__device__ __forceinline__ void bf16x8_to_f32(uint4 u, float *f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <int QT, int NT>
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
    qgemv_kernel(void *out,            /* (NT, N) f32 or bf16 */
                 int out_f32,
                 const uint8_t *__restrict__ W, /* (N rows of row_bytes) quantized */
                 size_t row_bytes,
                 const bf16 *__restrict__ x, /* (NT, K) */
                 int N, int K) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
  if (row >= N)
    return;
  const uint8_t *wr = W + (size_t)row * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; t++)
    acc[t] = 0.0f;
  int e0 = lane * 8;
  /* QGEMV_UNROLL warp steps at once: all their weight loads are issued before the first FMA,
   * so each lane has QGEMV_UNROLL times the bytes in flight (the loop is latency bound with
   * one step). The sums are added in the same order as the single-step tail below. */
  for (; e0 + (QGEMV_UNROLL - 1) * 256 < K; e0 += QGEMV_UNROLL * 256) {
    float wv[QGEMV_UNROLL][8];
#pragma unroll
    for (int u = 0; u < QGEMV_UNROLL; u++)
      cq_deq8<QT>(wr, e0 + u * 256, wv[u]);
#pragma unroll
    for (int u = 0; u < QGEMV_UNROLL; u++) {
#pragma unroll
      for (int t = 0; t < NT; t++) {
        float xv[8];
        bf16x8_to_f32(__ldg((const uint4 *)(x + (size_t)t * K + e0 + u * 256)), xv);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
          s = fmaf(wv[u][i], xv[i], s);
        acc[t] += s;
      }
    }
  }
  for (; e0 < K; e0 += 256) {
    float wv[8];
    cq_deq8<QT>(wr, e0, wv);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      float xv[8];
      bf16x8_to_f32(__ldg((const uint4 *)(x + (size_t)t * K + e0)), xv);
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; i++)
        s = fmaf(wv[i], xv[i], s);
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) {
      if (out_f32)
        ((float *)out)[(size_t)t * N + row] = v;
      else
        ((bf16 *)out)[(size_t)t * N + row] = __float2bfloat16(v);
    }
  }
}

template <int QT, int NT>
static void qgemv_launch(cudaStream_t st, void *out, int out_f32, const struct weight *w,
                         size_t row_bytes, const bf16 *x) {
  int N = (int)w->rows, K = (int)w->cols;
  dim3 grid((N + QGEMV_WARPS - 1) / QGEMV_WARPS);
  qgemv_kernel<QT, NT><<<grid, QGEMV_WARPS * 32, 0, st>>>(out, out_f32, (const uint8_t *)w->data,
                                                            row_bytes, x, N, K);
}

template <int QT>
static void qgemv_dispatch_t(cudaStream_t st, void *out, int out_f32, const struct weight *w,
                             size_t row_bytes, const bf16 *x, int T) {
  switch (T) {
  case 1: qgemv_launch<QT, 1>(st, out, out_f32, w, row_bytes, x); break;
  case 2: qgemv_launch<QT, 2>(st, out, out_f32, w, row_bytes, x); break;
  case 3: qgemv_launch<QT, 3>(st, out, out_f32, w, row_bytes, x); break;
  case 4: qgemv_launch<QT, 4>(st, out, out_f32, w, row_bytes, x); break;
  case 5: qgemv_launch<QT, 5>(st, out, out_f32, w, row_bytes, x); break;
  case 6: qgemv_launch<QT, 6>(st, out, out_f32, w, row_bytes, x); break;
  case 7: qgemv_launch<QT, 7>(st, out, out_f32, w, row_bytes, x); break;
  default: qgemv_launch<QT, 8>(st, out, out_f32, w, row_bytes, x); break;
  }
}

/* out(T, N) = x(T, K) @ W^T for T rows, in passes of at most CUDA_QGEMV_MAX_T rows (each pass
 * reads the weight once). */
int cuda_quant_gemv(struct backend *be, void *out, const void *x, const struct weight *w, int T,
                    int out_f32) {
  int qt = cuda_quant_type(w->dtype);
  if (qt < 0)
    return ERR("cuda quantized matmul: weight dtype %s is not a quantized type", dtype_name(w->dtype));
  cudaStream_t st = cuda_be(be)->stream;
  size_t row_bytes = cuda_quant_row_bytes(qt, w->cols);
  size_t osz = out_f32 ? 4 : 2;
  for (int t0 = 0; t0 < T; t0 += CUDA_QGEMV_MAX_T) {
    int nt = T - t0 < CUDA_QGEMV_MAX_T ? T - t0 : CUDA_QGEMV_MAX_T;
    void *o = (char *)out + (size_t)t0 * w->rows * osz;
    const bf16 *xs = (const bf16 *)x + (size_t)t0 * w->cols;
    CQ_DISPATCH(qt, qgemv_dispatch_t<QT_>(st, o, out_f32, w, row_bytes, xs, nt));
    CUDA_LAUNCH_CHECK();
  }
  return 0;
}

/* ---- embedding of a quantized table: out(T, dim) = dequant(emb[ids[t]]); ids outside
 * [0, vocab) give a zero row. One block per token, 8 values per thread. ---- */
template <int QT>
__global__ void qembed_kernel(bf16 *out, const uint8_t *emb, size_t row_bytes, int64_t vocab,
                              const int32_t *ids, int dim) {
  int t = blockIdx.x;
  int32_t id = ids[t];
  bool ok = id >= 0 && id < vocab;
  for (int e0 = threadIdx.x * 8; e0 < dim; e0 += blockDim.x * 8) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (ok)
      cq_deq8<QT>(emb + (size_t)id * row_bytes, e0, v);
#pragma unroll
    for (int i = 0; i < 8; i++)
      out[(size_t)t * dim + e0 + i] = __float2bfloat16(v[i]);
  }
}

int cuda_quant_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T) {
  int qt = cuda_quant_type(emb->dtype);
  if (qt < 0)
    return ERR("cuda embed: table dtype %s is not a quantized type", dtype_name(emb->dtype));
  size_t row_bytes = cuda_quant_row_bytes(qt, emb->cols);
  cudaStream_t st = cuda_be(be)->stream;
  CQ_DISPATCH(qt, (qembed_kernel<QT_><<<T, 128, 0, st>>>((bf16 *)out, (const uint8_t *)emb->data,
                                                         row_bytes, emb->rows, ids, (int)emb->cols)));
  CUDA_LAUNCH_CHECK();
  return 0;
}
