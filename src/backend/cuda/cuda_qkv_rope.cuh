/* cuda_qkv_rope.cuh - the epilogue of matmul_qkv_rope (backend.h): q/k/v, RoPE and the KV write
 * in one GEMV, shared by the bf16 GEMV (cuda_gemv.cu, gemv_qkv_rope_kernel) and the integer-dot
 * GEMV on quantized weights (cuda_quant_gemv.cu, qgemv_i8_kernel with ROPE).
 *
 * The grid runs over the rows of wq, wk and wv, where each warp takes TWO rows whose sums RoPE
 * rotates together, so its epilogue has both: per head of q and k (hd / 2 pairs), pair j <
 * rot_dim / 2 is RoPE's (neox: dims j and j + rot_dim / 2; interleaved: 2j and 2j + 1), the others
 * the unrotated dims 2j, 2j + 1 (from rot_dim on); v's rows go in consecutive pairs. Lane t (every
 * lane holds the totals) finishes token t: each sum rounded and biased as matmul_n stores it
 * (gemv_multi_value), the pair rotated by that token's angle as rope_kv_write_kernel rotates it
 * (rope_sincos, rope_rotate: cuda_rope.cuh), then q, k and v stored and k and v also into the
 * cache at the token's slot (kv_store; slots < 0 or past the pool skipped). A row's sum does not
 * depend on its pairing (each kernel sums a row in its one fixed order), so the outputs and both
 * caches are that kernel's matmul_n followed by rope_kv_write byte for byte. */
#ifndef PAGODA_CUDA_QKV_ROPE_CUH
#define PAGODA_CUDA_QKV_ROPE_CUH

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_rope.cuh"

#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

/* Up to BACKEND_MATMUL_N_MAX matrices in one grid (struct cuda_matmul_set, cuda_backend.h). */
typedef struct cuda_matmul_set gemv_multi;

/* The bias of row ROW of matrix I of M (0 without one). */
__device__ __forceinline__ float gemv_multi_bias(const gemv_multi &m, int i, int row) {
  const void *bias = m.bias[i];
  return !bias ? 0.0f : m.bias_f32[i] ? ((const float *)bias)[row] : __bfloat162float(((const bf16 *)bias)[row]);
}

/* One sum as matmul_n stores it: rounded to bf16, then (HAS_BIAS) + B rounded again (as the bias
 * kernel adds it to the product). Shared with matmul_qkv_rope's epilogue. */
__device__ __forceinline__ bf16 gemv_multi_value(float acc, bool has_bias, float b) {
  bf16 v = __float2bfloat16(acc);
  return has_bias ? __float2bfloat16(__bfloat162float(v) + b) : v;
}

/* What the epilogue needs beyond the matrices (filled by cuda_op_matmul_qkv_rope). */
struct gemv_rope {
  const int32_t *positions, *slots; /* (T) */
  const float *inv_freq;            /* (rot_dim / 2) */
  void *kc, *vc;                    /* (num_blocks, n_kv, bs, hd) of bf16, or e4m3 when kv_f8 */
  long long num_slots;
  float k_scale, v_scale, mscale; /* scales 1 for a bf16 cache */
  int hd, rot_dim, neox, n_kv, bs, kv_f8;
  int pq, pk; /* pairs of q (n_heads * hd / 2) and of k (n_kv * hd / 2, as many as of v) */
  int early;  /* cb->epi_early: a warp's first pair reads its epilogue inputs (qkv_rope_load) right
               * after the kernel's wait, so their round trips overlap the products */
};

/* Grid row G's matrix (0 q, 1 k, 2 v), its two rows R0 and R1, and the RoPE frequency J of the
 * pair (-1: not rotated). */
struct qkv_pair {
  int i, r0, r1, j;
};

__device__ __forceinline__ qkv_pair qkv_rope_pair(const gemv_rope &r, int g) {
  qkv_pair p;
  p.i = g < r.pq ? 0 : g < r.pq + r.pk ? 1 : 2;
  const int e = g - (p.i == 0 ? 0 : p.i == 1 ? r.pq : r.pq + r.pk); /* pair within the matrix */
  const int hd2 = r.hd >> 1, half = r.rot_dim >> 1;
  const int h = e / hd2, j = e - h * hd2;
  const bool rot = p.i < 2 && j < half;
  p.j = rot ? j : -1;
  p.r0 = rot && r.neox ? h * r.hd + j : 2 * e;
  p.r1 = rot && r.neox ? h * r.hd + j + half : 2 * e + 1;
  return p;
}

template <class E>
__device__ __forceinline__ void qkv_cache_pair(void *cache, size_t at, int d0, int d1, bf16 v0, bf16 v1, float scale) {
  kv_store((E *)cache, at + d0, v0, scale);
  kv_store((E *)cache, at + d1, v1, scale);
}

/* What pair P's epilogue reads for lane t < NT (token t) besides the sums: the rows' biases, the
 * rotation's sin and cos, the token's cache slot (-1: none). The GEMVs call it right after their
 * wait (cb->epi_early), or at the store. */
struct qkv_rope_in {
  float b0, b1, sf, cf;
  int32_t slot;
};

template <int NT>
__device__ __forceinline__ qkv_rope_in qkv_rope_load(const gemv_multi &m, const gemv_rope &r, const qkv_pair &p,
                                                     int lane) {
  qkv_rope_in in = {0.0f, 0.0f, 0.0f, 1.0f, -1};
  if (lane >= NT)
    return in;
  in.b0 = gemv_multi_bias(m, p.i, p.r0);
  in.b1 = gemv_multi_bias(m, p.i, p.r1);
  if (p.j >= 0)
    rope_sincos((float)r.positions[lane], r.inv_freq[p.j], r.mscale, &in.sf, &in.cf);
  if (p.i != 0)
    in.slot = r.slots[lane];
  return in;
}

/* The epilogue of pair P: lane t < NT finishes token t (see above), with IN from qkv_rope_load. */
template <int NT>
__device__ __forceinline__ void qkv_rope_store(const gemv_multi &m, const gemv_rope &r, const qkv_pair &p,
                                               const float (*acc)[NT], int lane, const qkv_rope_in &in) {
  float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
  for (int t = 0; t < NT; t++) /* selects, so acc stays in registers */
    if (lane == t) {
      a0 = acc[0][t];
      a1 = acc[1][t];
    }
  if (lane >= NT)
    return;
  const int t = lane;
  const bool has_bias = m.bias[p.i] != NULL;
  bf16 v0 = gemv_multi_value(a0, has_bias, in.b0);
  bf16 v1 = gemv_multi_value(a1, has_bias, in.b1);
  if (p.j >= 0)
    rope_rotate(&v0, &v1, in.cf, in.sf);
  bf16 *o = (bf16 *)m.out[p.i] + (size_t)t * m.N[p.i];
  o[p.r0] = v0;
  o[p.r1] = v1;
  if (p.i == 0)
    return;
  const int32_t slot = in.slot;
  if (slot < 0 || slot >= r.num_slots)
    return;
  const int h = p.r0 / r.hd, base = h * r.hd;
  const size_t at = (((size_t)(slot / r.bs) * r.n_kv + h) * r.bs + slot % r.bs) * r.hd;
  void *cache = p.i == 1 ? r.kc : r.vc;
  const float scale = p.i == 1 ? r.k_scale : r.v_scale;
  if (r.kv_f8)
    qkv_cache_pair<uint8_t>(cache, at, p.r0 - base, p.r1 - base, v0, v1, scale);
  else
    qkv_cache_pair<bf16>(cache, at, p.r0 - base, p.r1 - base, v0, v1, scale);
}

/* qkv_rope_store with the inputs read now. */
template <int NT>
__device__ __forceinline__ void qkv_rope_store(const gemv_multi &m, const gemv_rope &r, const qkv_pair &p,
                                               const float (*acc)[NT], int lane) {
  qkv_rope_store<NT>(m, r, p, acc, lane, qkv_rope_load<NT>(m, r, p, lane));
}

#endif
