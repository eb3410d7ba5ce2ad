/* cuda_norm.cuh - RMSNorm arithmetic for kernels that normalize their own input (the prologue of
 * the fused GEMVs, struct backend_prenorm in backend.h), bit for bit as rmsnorm_kernel
 * (cuda_ops.cu) does it, whatever their block size.
 *
 * rmsnorm_kernel runs V = norm_threads(dim) threads on a row: thread i sums v * v over the
 * elements i, i + V, i + 2V, ... in that order (f32, v the element as float), then block_sum adds
 * the V partial sums: each warp's 32 by the xor tree (offsets 16, 8, 4, 2, 1), then the per-warp
 * sums (lane w holding warp w's, lanes past the last warp 0) by the same tree. f32 addition is
 * not associative, so a kernel with another block size that summed "the same numbers" would get
 * another rms, another bf16 rounding of some elements, and another token now and then. norm_inv
 * below replays V virtual threads on NW real warps (real warp r takes the virtual warps r, r + NW,
 * ...) with the same per-thread order and the same two trees, so its inverse rms equals
 * rmsnorm_kernel's exactly; norm_elem is the element formula of both. Keep rmsnorm_kernel's sums
 * and this file in step: test_cuda_ops compares the fused forms with the separate ops byte for
 * byte. */
#ifndef PAGODA_CUDA_NORM_CUH
#define PAGODA_CUDA_NORM_CUH

#include <cuda_bf16.h>

/* rmsnorm_kernel's thread count for a row of DIM elements (its launch in cuda_ops.cu). */
__host__ __device__ __forceinline__ int norm_threads(int dim) { return dim >= 1024 ? 1024 : (dim + 31) / 32 * 32; }

__device__ __forceinline__ float norm_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Element I of a norm weight of f32 (W_F32) or bf16 values, as float. */
__device__ __forceinline__ float norm_weight_at(const void *w, int w_f32, size_t i) {
  return w_f32 ? ((const float *)w)[i] : __bfloat162float(((const __nv_bfloat16 *)w)[i]);
}

/* 1 / rms from the sum of squares SUM of DIM values: rsqrt(SUM / DIM + EPS), with the division and
 * the add rounded as written (IEEE division, and an add the compiler may not fuse with it): with
 * --use_fast_math the plain expression is an approximate reciprocal and multiply that ptxas may or
 * may or may not contract with the add into one FMA, depending on the surrounding kernel, so
 * rmsnorm_kernel and the GEMV prologue could get different last bits of the rms (test_cuda_ops,
 * seed 1882671549537440: a prenorm gate/up at T = 7, K = 1032 differed from rmsnorm followed by
 * the plain GEMV, with PDL and either GEMV form). Both call this. */
__device__ __forceinline__ float norm_inv_of(float sum, int dim, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum, (float)dim), eps));
}

/* 1 / rms of the row X (DIM bf16 values) with EPS, as rmsnorm_kernel computes it (residual
 * NULL). Every thread of the block calls it (NW = blockDim.x / 32 warps, 1 <= NW <= 32) and gets
 * the value. PART: 32 floats of shared memory, free on entry (the call ends with a barrier after
 * its last read, so it may be used again at once). */
template <int NW, bool ILP = false>
__device__ __forceinline__ float norm_inv(const __nv_bfloat16 *x, int dim, float eps, float *part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int V = norm_threads(dim), vwarps = V / 32;
  if constexpr (!ILP) {
    for (int vw = warp; vw < vwarps; vw += NW) {
      const int vt = vw * 32 + lane; /* the virtual thread this lane plays */
      float ss = 0.0f;
      for (int d = vt; d < dim; d += V) {
        float v = __bfloat162float(x[d]);
        ss = __fmaf_rn(v, v, ss); /* as rmsnorm_kernel: written out, so no kernel contracts it otherwise */
      }
      ss = norm_warp_sum(ss);
      if (lane == 0)
        part[vw] = ss;
    }
  } else {
    /* ILP: real warp w plays the virtual warps w + q NW, q < VQ, up to four side by side: each
     * virtual thread's sum and each virtual warp's tree are the same operations in the same order
     * as one after the other, but the chains are independent, so their loads and shuffles overlap
     * (at 8 warps and 4096 values, four virtual warps per real one: 1.1 us of the q/k/v and gate/up
     * prologues one after the other, bench/RESULTS.md, session 18; more registers, so only where
     * the kernel has them to spare) */
    constexpr int VQ = (32 + NW - 1) / NW; /* vwarps <= 32 */
    constexpr int QG = VQ < 4 ? VQ : 4;    /* side by side at most four (registers) */
#pragma unroll
    for (int q0 = 0; q0 < VQ; q0 += QG) {
      float ss[QG];
#pragma unroll
      for (int q = 0; q < QG; q++)
        ss[q] = 0.0f;
      for (int d0 = lane; d0 < dim; d0 += V) /* d0: the element of virtual warp 0's thread LANE */
#pragma unroll
        for (int q = 0; q < QG; q++) {
          const int vw = warp + (q0 + q) * NW, d = d0 + vw * 32; /* virtual thread vw * 32 + lane's */
          if (vw < vwarps && d < dim) {
            const float v = __bfloat162float(x[d]);
            ss[q] = __fmaf_rn(v, v, ss[q]); /* as above */
          }
        }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) /* norm_warp_sum's tree on each virtual warp, written out
                                          * (norm_warp_sum per sum compiles to another schedule,
                                          * not the one measured) */
#pragma unroll
        for (int q = 0; q < QG; q++)
          ss[q] += __shfl_xor_sync(0xffffffffu, ss[q], o);
#pragma unroll
      for (int q = 0; q < QG; q++)
        if (lane == 0 && warp + (q0 + q) * NW < vwarps)
          part[warp + (q0 + q) * NW] = ss[q];
    }
  }
  __syncthreads();
  float v = lane < vwarps ? part[lane] : 0.0f;
  float inv = norm_inv_of(norm_warp_sum(v), dim, eps);
  __syncthreads(); /* part[] read by every warp before anyone reuses it */
  return inv;
}

/* One normalized element, rounded as rmsnorm_kernel writes it: (x * inv) * w in f32, to bf16. */
__device__ __forceinline__ __nv_bfloat16 norm_elem(__nv_bfloat16 x, float inv, float w) {
  return __float2bfloat16(__bfloat162float(x) * inv * w);
}

#endif
