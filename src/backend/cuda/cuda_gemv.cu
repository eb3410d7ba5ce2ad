/* cuda_gemv.cu - decode-sized bf16 matmuls: out(T, N) = x(T, K) @ W(N, K)^T for T up to
 * CUDA_GEMV_MAX_T rows, reading every weight byte once per call at close to the memory
 * bandwidth, where cuBLAS's GEMM kernels (tiled for large T) leave most of it unused.
 *
 * One warp per output feature (weight row): lane l multiplies the 8 columns [e + 8 l, +8) of
 * the row (one 16-byte load) with the same columns of each of the T activation rows, a warp
 * step covering 256 columns; the loop issues four steps' weight loads before using them, so
 * each warp keeps 4 x 512 bytes in flight. Sums are f32 (fma), reduced over the warp by
 * shuffles. K must be a multiple of 8 (16-byte rows); callers fall back to cuBLAS otherwise. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant.cuh" /* cq_bf16x8_f32, shared with the quantized GEMV */

typedef __nv_bfloat16 bf16;

#define GEMV_WARPS 4 /* rows per block */

template <int NT>
__device__ __forceinline__ void gemv_step(uint4 wu, const bf16 *x, int K, int e, float *acc) {
  float wv[8];
  cq_bf16x8_f32(wu, wv);
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float xv[8];
    cq_bf16x8_f32(__ldg((const uint4 *)(x + (size_t)t * K + e)), xv);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
      s = fmaf(wv[i], xv[i], s);
    acc[t] += s;
  }
}

template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(void *out, int out_f32, const bf16 *W, const bf16 *x, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (row >= N)
    return;
  const bf16 *wr = W + (size_t)row * K;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; t++)
    acc[t] = 0.0f;
  int e = lane * 8;
  for (; e + 768 < K; e += 1024) { /* four steps, loads first */
    uint4 w0 = __ldg((const uint4 *)(wr + e)), w1 = __ldg((const uint4 *)(wr + e + 256)),
          w2 = __ldg((const uint4 *)(wr + e + 512)), w3 = __ldg((const uint4 *)(wr + e + 768));
    gemv_step<NT>(w0, x, K, e, acc);
    gemv_step<NT>(w1, x, K, e + 256, acc);
    gemv_step<NT>(w2, x, K, e + 512, acc);
    gemv_step<NT>(w3, x, K, e + 768, acc);
  }
  for (; e < K; e += 256)
    gemv_step<NT>(__ldg((const uint4 *)(wr + e)), x, K, e, acc);
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

int cuda_gemv_bf16(struct backend *be, void *out, const void *x, const struct weight *w, int T, int out_f32) {
  struct cuda_backend *cb = cuda_be(be);
  int N = (int)w->rows, K = (int)w->cols;
  if (T < 1 || T > CUDA_GEMV_MAX_T || K % 8 || w->dtype != DTYPE_BF16)
    return ERR("cuda gemv: T %d (1..%d), K %d (a multiple of 8), dtype %s (bf16)", T, CUDA_GEMV_MAX_T, K,
               dtype_name(w->dtype));
  dim3 grid((unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS));
  const bf16 *W = (const bf16 *)w->data, *X = (const bf16 *)x;
  cudaStream_t st = cb->stream;
  switch (T) {
#define GEMV_CASE(n) \
  case n: gemv_kernel<n><<<grid, GEMV_WARPS * 32, 0, st>>>(out, out_f32, W, X, N, K); break;
    GEMV_CASE(1) GEMV_CASE(2) GEMV_CASE(3) GEMV_CASE(4) GEMV_CASE(5) GEMV_CASE(6) GEMV_CASE(7) GEMV_CASE(8)
#undef GEMV_CASE
  }
  CUDA_LAUNCH_CHECK();
  return 0;
}
