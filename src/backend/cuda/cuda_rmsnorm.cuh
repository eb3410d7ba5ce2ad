/* cuda_rmsnorm.cuh - the arithmetic of RMSNorm, shared by rmsnorm_kernel (cuda_ops.cu) and the
 * norm that matmul_add_rmsnorm runs in its last thread block (cuda_gemv.cu), so that the two give
 * the same bits. The order is rmsnorm_kernel's, with rms_threads(dim) threads per row: thread i
 * sums the squares of elements i, i + threads, ... (one fma each), each warp's 32 sums are added
 * by an xor butterfly (offsets 16, 8, 4, 2, 1), then the warps' sums (in warp order, zero-padded
 * to 32) by the same butterfly; inv = rsqrt(total / dim + eps); out = bf16(x * inv * w). */
#ifndef PAGODA_CUDA_RMSNORM_CUH
#define PAGODA_CUDA_RMSNORM_CUH

#include <cuda_bf16.h>

/* Threads per row of rmsnorm_kernel (a multiple of 32, at most 1024), which fixes the order. */
static __host__ __device__ __forceinline__ int rms_threads(int dim) {
  return dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
}

static __device__ __forceinline__ float rms_sq_acc(float ss, float v) { return __fmaf_rn(v, v, ss); }

static __device__ __forceinline__ float rms_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __device__ __forceinline__ float rms_inv(float total, int dim, float eps) {
  return rsqrtf(total / (float)dim + eps);
}

/* Element i of a norm weight, F32 or BF16 (the two dtypes cuda_weight_from_host makes). */
static __device__ __forceinline__ float rms_weight_at(const void *p, int is_f32, size_t i) {
  return is_f32 ? ((const float *)p)[i] : __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

#endif
