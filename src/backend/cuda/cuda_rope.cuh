/* cuda_rope.cuh - the RoPE and KV-cache store helpers shared by rope_kernel, kv_write_kernel and
 * rope_kv_write_kernel (cuda_ops.cu) and the fused q/k/v GEMV (gemv_qkv_rope_kernel, cuda_gemv.cu),
 * so that every kernel that rotates a pair or stores a cache element does it with the same
 * arithmetic and roundings (the fused forms are compared byte for byte with the separate ones).
 * The angle is the f32 product pos * inv_freq (as HF computes it); its sin/cos are taken in
 * double because --use_fast_math would turn sincosf into the intrinsic, which is inaccurate for
 * the large angles of long contexts. */
#ifndef PAGODA_CUDA_ROPE_CUH
#define PAGODA_CUDA_ROPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* The frequencies token T rotates with: LongRoPE's long ones when its sequence (found by binary
 * search over query_start, every thread alike) holds more than long_after tokens. */
__device__ __forceinline__ const float *rope_freqs(int t, const float *inv_freq, const float *inv_freq_long,
                                                   int long_after, const int32_t *query_start,
                                                   const int32_t *seq_lens, int num_seqs) {
  if (!inv_freq_long)
    return inv_freq;
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return seq_lens[lo] > long_after ? inv_freq_long : inv_freq;
}

/* sin and cos of pos * freq (taken in double, see above), times mscale when it is not 0. */
__device__ __forceinline__ void rope_sincos(float pos, float freq, float mscale, float *sf, float *cf) {
  float ang = pos * freq;
  double s, c;
  sincos((double)ang, &s, &c);
  *sf = (float)s;
  *cf = (float)c;
  if (mscale != 0.0f) {
    *sf *= mscale;
    *cf *= mscale;
  }
}

/* One pair in place: (a, b) -> (a cos - b sin, b cos + a sin), with explicit roundings (one
 * product, then a fused multiply-add) so that every kernel rotating pairs gets the same bits. */
__device__ __forceinline__ void rope_rotate(__nv_bfloat16 *pa, __nv_bfloat16 *pb, float cf, float sf) {
  float a = __bfloat162float(*pa), b = __bfloat162float(*pb);
  *pa = __float2bfloat16(__fmaf_rn(a, cf, -__fmul_rn(b, sf)));
  *pb = __float2bfloat16(__fmaf_rn(b, cf, __fmul_rn(a, sf)));
}

/* One cache element: a bf16 cache gets X as it is; an f8e4m3 cache gets e4m3(x / scale) (nearest
 * even, saturated to +-448, as the CPU's f32_to_f8e4m3). */
__device__ __forceinline__ void kv_store(__nv_bfloat16 *c, size_t i, __nv_bfloat16 x, float) { c[i] = x; }
__device__ __forceinline__ void kv_store(uint8_t *c, size_t i, __nv_bfloat16 x, float scale) {
  c[i] = (uint8_t)__nv_cvt_float_to_fp8(__bfloat162float(x) / scale, __NV_SATFINITE, __NV_E4M3);
}

#endif /* PAGODA_CUDA_ROPE_CUH */
