/* cuda_quant.cuh - device-side dequantization of the GGUF block types, shared by the quantized
 * GEMV (cuda_quant_gemv.cu), the dequantize-to-bf16 GEMM path (cuda_quant_gemm.cu) and the
 * quantized embedding gather (cuda_quant_gemv.cu).
 *
 * The block layouts are the ggml ones (src/model/quant.h has the host structs and the scalar
 * reference dequantizers these kernels are tested against). Device code reads blocks as bytes at
 * the fixed offsets below because most blocks are only 2-byte aligned inside a row (18, 20, 22,
 * 34 ... bytes each).
 *
 * Invariant: cq_deq8<QT>(row, e0, v) writes the 8 values e0 .. e0 + 7 of a row whose quantized
 * bytes start at ROW; e0 is a multiple of 8, so the 8 values always share one scale (the
 * smallest scale group of any type is 16 values). */
#ifndef PAGODA_CUDA_QUANT_CUH
#define PAGODA_CUDA_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* The quantized types the CUDA kernels are compiled for (template parameter). */
enum cq_type {
  CQ_Q4_0,
  CQ_Q4_1,
  CQ_Q5_0,
  CQ_Q5_1,
  CQ_Q8_0,
  CQ_Q2_K,
  CQ_Q3_K,
  CQ_Q4_K,
  CQ_Q5_K,
  CQ_Q6_K,
  CQ_IQ4_NL,
  CQ_IQ4_XS,
  CQ_COUNT
};

/* Values per block and bytes per block, per type (ggml: QK4_0 = 32 ..., QK_K = 256). */
template <int QT> struct cq_traits;
template <> struct cq_traits<CQ_Q4_0> { static const int QK = 32, BYTES = 18; };
template <> struct cq_traits<CQ_Q4_1> { static const int QK = 32, BYTES = 20; };
template <> struct cq_traits<CQ_Q5_0> { static const int QK = 32, BYTES = 22; };
template <> struct cq_traits<CQ_Q5_1> { static const int QK = 32, BYTES = 24; };
template <> struct cq_traits<CQ_Q8_0> { static const int QK = 32, BYTES = 34; };
template <> struct cq_traits<CQ_Q2_K> { static const int QK = 256, BYTES = 84; };
template <> struct cq_traits<CQ_Q3_K> { static const int QK = 256, BYTES = 110; };
template <> struct cq_traits<CQ_Q4_K> { static const int QK = 256, BYTES = 144; };
template <> struct cq_traits<CQ_Q5_K> { static const int QK = 256, BYTES = 176; };
template <> struct cq_traits<CQ_Q6_K> { static const int QK = 256, BYTES = 210; };
template <> struct cq_traits<CQ_IQ4_NL> { static const int QK = 32, BYTES = 18; };
template <> struct cq_traits<CQ_IQ4_XS> { static const int QK = 256, BYTES = 136; };

/* f16 fields are always 2-byte aligned: every block size and field offset is even, and rows
 * are consecutive in one allocation. */
__device__ __forceinline__ float cq_f16(const uint8_t *p) {
  return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

/* The 8 bytes at BASE + OFF as two little-endian words LO (bytes 0..3) and HI (4..7).
 * SMEM = false (rows in global memory, any alignment): the widest loads the address's
 * alignment allows, chosen at run time (blocks of 18, 22, 34, 110, 210 bytes leave most quant
 * arrays only 2-byte aligned), never a byte outside the 8.
 * SMEM = true (a staged chunk in shared memory, cuda_quant_gemv.cu; BASE 16-byte aligned): A is
 * OFF's alignment known at compile time (8: one 8-byte load; 4: two words); otherwise three
 * aligned words and two funnel shifts, the same instructions on every lane (no divergent
 * alignment branches), reading up to 3 bytes on either side of the 8 (the staging buffers carry
 * 16 bytes of slack). Offsets stay relative to BASE so that the loads are shared-memory ones. */
template <bool SMEM, int A>
__device__ __forceinline__ void cq_ld8(const uint8_t *base, int off, uint32_t &lo, uint32_t &hi) {
  if (SMEM) {
    if (A % 8 == 0) {
      uint2 r = *(const uint2 *)(base + off);
      lo = r.x;
      hi = r.y;
    } else if (A % 4 == 0) {
      lo = *(const uint32_t *)(base + off);
      hi = *(const uint32_t *)(base + off + 4);
    } else {
      const uint32_t *w = (const uint32_t *)(base + (off & ~3));
      const unsigned sh = (unsigned)(off & 3) * 8;
      uint32_t w0 = w[0], w1 = w[1], w2 = w[2];
      lo = __funnelshift_r(w0, w1, sh);
      hi = __funnelshift_r(w1, w2, sh);
    }
    return;
  }
  const uint8_t *p = base + off;
  uintptr_t a = (uintptr_t)p;
  if ((a & 7) == 0) {
    uint2 r = *(const uint2 *)p;
    lo = r.x;
    hi = r.y;
  } else if ((a & 3) == 0) {
    lo = *(const uint32_t *)p;
    hi = *(const uint32_t *)(p + 4);
  } else if ((a & 1) == 0) {
    const unsigned short *h = (const unsigned short *)p;
    lo = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
    hi = (uint32_t)h[2] | ((uint32_t)h[3] << 16);
  } else {
    lo = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    hi = (uint32_t)p[4] | ((uint32_t)p[5] << 8) | ((uint32_t)p[6] << 16) | ((uint32_t)p[7] << 24);
  }
}

__device__ __forceinline__ uint32_t cq_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Integer codes to f32 without I2F (a quarter-rate conversion unit on sm_90, the bottleneck of
 * the dequantizing kernels): a byte b placed in the mantissa of 2^23 is the float 2^23 + b, so
 * f = that - (2^23 + BIAS) is b - BIAS exactly (one PRMT and one FADD). */
__device__ __forceinline__ void cq_u8x4_f32(uint32_t w, float bias, float *f) {
#pragma unroll
  for (int i = 0; i < 4; i++)
    f[i] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)i)) - (8388608.0f + bias);
}
/* A signed integer |q| < 2^22 to f32 exactly (1.5 * 2^23 + q, minus 1.5 * 2^23). */
__device__ __forceinline__ float cq_i2f(int q) {
  return __int_as_float(0x4B400000 + q) - 12582912.0f;
}

/* The 16 values of the IQ4 non-linear grid (ggml's kvalues_iq4nl). */
/* {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} as int8 bytes in
 * four words, picked by __byte_perm so that no indexed array goes to local memory. */
__device__ __forceinline__ float cq_iq4_value(int i) {
  unsigned r = i < 8 ? __byte_perm(0xBFAD9881u, 0xF6EADDCFu, (unsigned)i)
                     : __byte_perm(0x26190D01u, 0x71594535u, (unsigned)(i - 8));
  return cq_i2f((int)(signed char)(r & 0xFF));
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
__device__ __forceinline__ void cq_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/* Compile-time alignment of a block start inside a 16-byte-aligned staged chunk. */
template <int QT> struct cq_align {
  static const int B = cq_traits<QT>::BYTES;
  static const int A = B % 16 == 0 ? 16 : B % 8 == 0 ? 8 : B % 4 == 0 ? 4 : 2;
};
/* Spread 4 bits (bit k of H -> bit 0 of byte k): the four shifted copies never overlap. */
__device__ __forceinline__ uint32_t cq_spread4(uint32_t h) {
  return (h * 0x00204081u) & 0x01010101u;
}

/* The 8 values e0 .. e0 + 7 of a row as a * q[i] + b: q are the integer codes (or IQ4 grid
 * values) as floats, a and b the scale and offset they share. SMEM: ROW is a staged chunk in
 * shared memory starting at a 16-byte boundary (see cq_ld8). The codes are built 4 at a time
 * in the bytes of a word (offset to be non-negative) and converted by cq_u8x4_f32. */
template <int QT, bool SMEM = false>
__device__ __forceinline__ void cq_q8(const uint8_t *row, int e0, float *q8, float &a, float &bo) {
  typedef cq_traits<QT> tr;
  const int AB = SMEM ? cq_align<QT>::A : 1; /* alignment of the block start when known */
  const int o = (e0 / tr::QK) * tr::BYTES; /* the block's offset in ROW */
  const uint8_t *b = row + o;
  const int e = e0 % tr::QK;
  uint32_t lo, hi;
  if (QT == CQ_Q4_0 || QT == CQ_Q4_1 || QT == CQ_IQ4_NL) {
    const int off = QT == CQ_Q4_1 ? 4 : 2;
    const float d = cq_f16(b);
    const float m = QT == CQ_Q4_1 ? cq_f16(b + 2) : 0.0f;
    cq_ld8<SMEM, QT == CQ_Q4_1 ? (AB < 4 ? AB : 4) : 2>(row, o + off + (e & 15), lo, hi); /* e & 15: 0 or 8 */
    const int sh = e >= 16 ? 4 : 0;
    lo = (lo >> sh) & 0x0F0F0F0Fu;
    hi = (hi >> sh) & 0x0F0F0F0Fu;
    if (QT == CQ_IQ4_NL) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        q8[i] = cq_iq4_value((lo >> (8 * i)) & 0xF);
        q8[i + 4] = cq_iq4_value((hi >> (8 * i)) & 0xF);
      }
    } else {
      cq_u8x4_f32(lo, QT == CQ_Q4_0 ? 8.0f : 0.0f, q8);
      cq_u8x4_f32(hi, QT == CQ_Q4_0 ? 8.0f : 0.0f, q8 + 4);
    }
    a = d;
    bo = m;
  } else if (QT == CQ_Q5_0 || QT == CQ_Q5_1) {
    const int hoff = QT == CQ_Q5_1 ? 4 : 2;
    const float d = cq_f16(b);
    const float m = QT == CQ_Q5_1 ? cq_f16(b + 2) : 0.0f;
    const uint32_t qh = QT == CQ_Q5_1 && SMEM ? *(const uint32_t *)(b + 4) : cq_u32(b + hoff);
    cq_ld8<SMEM, QT == CQ_Q5_1 ? (AB < 8 ? AB : 8) : 2>(row, o + hoff + 4 + (e & 15), lo, hi);
    const int sh = e >= 16 ? 4 : 0;
    const uint32_t h8 = qh >> e; /* bits of values e .. e + 7 */
    lo = ((lo >> sh) & 0x0F0F0F0Fu) | (cq_spread4(h8 & 0xF) << 4);
    hi = ((hi >> sh) & 0x0F0F0F0Fu) | (cq_spread4((h8 >> 4) & 0xF) << 4);
    cq_u8x4_f32(lo, QT == CQ_Q5_0 ? 16.0f : 0.0f, q8);
    cq_u8x4_f32(hi, QT == CQ_Q5_0 ? 16.0f : 0.0f, q8 + 4);
    a = d;
    bo = m;
  } else if (QT == CQ_Q8_0) {
    const float d = cq_f16(b);
    cq_ld8<SMEM, 2>(row, o + 2 + e, lo, hi);
    cq_u8x4_f32(lo ^ 0x80808080u, 128.0f, q8); /* int8 + 128 as an unsigned byte */
    cq_u8x4_f32(hi ^ 0x80808080u, 128.0f, q8 + 4);
    a = d;
    bo = 0.0f;
  } else if (QT == CQ_Q2_K) {
    const int sc = b[e / 16];
    const float dl = cq_f16(b + 80) * (float)(sc & 0xF);
    const float ml = cq_f16(b + 82) * (float)(sc >> 4);
    cq_ld8<SMEM, AB>(row, o + 16 + (e / 128) * 32 + (e % 32), lo, hi);
    const int sh = 2 * ((e % 128) / 32);
    cq_u8x4_f32((lo >> sh) & 0x03030303u, 0.0f, q8);
    cq_u8x4_f32((hi >> sh) & 0x03030303u, 0.0f, q8 + 4);
    a = dl;
    bo = -ml;
  } else if (QT == CQ_Q3_K) {
    const int si = e / 16;
    const uint8_t *scales = b + 96;
    int slo = si < 8 ? scales[si] & 0xF : scales[si - 8] >> 4;
    int shi = (scales[8 + (si & 3)] >> (2 * (si / 4))) & 3;
    const float dl = cq_f16(b + 108) * (float)((slo | (shi << 4)) - 32);
    uint32_t mlo, mhi;
    cq_ld8<SMEM, AB>(row, o + (e % 32), mlo, mhi);
    cq_ld8<SMEM, AB>(row, o + 32 + (e / 128) * 32 + (e % 32), lo, hi);
    const int j = (e % 128) / 32;
    const int sh = 2 * j, hb = (e / 128) * 4 + j;
    /* q + 4 = low 2 bits | (high-mask bit << 2) */
    cq_u8x4_f32(((lo >> sh) & 0x03030303u) | (((mlo >> hb) & 0x01010101u) << 2), 4.0f, q8);
    cq_u8x4_f32(((hi >> sh) & 0x03030303u) | (((mhi >> hb) & 0x01010101u) << 2), 4.0f, q8 + 4);
    a = dl;
    bo = 0.0f;
  } else if (QT == CQ_Q4_K || QT == CQ_Q5_K) {
    const int s = e / 32;
    int sc, mn;
    cq_scale_min_k4(s, b + 4, &sc, &mn);
    const float dl = cq_f16(b) * (float)sc, ml = cq_f16(b + 2) * (float)mn;
    const int qoff = QT == CQ_Q4_K ? 16 : 48;
    cq_ld8<SMEM, AB>(row, o + qoff + (e / 64) * 32 + (e % 32), lo, hi);
    const int sh = 4 * (s & 1);
    lo = (lo >> sh) & 0x0F0F0F0Fu;
    hi = (hi >> sh) & 0x0F0F0F0Fu;
    if (QT == CQ_Q5_K) {
      uint32_t hlo, hhi;
      cq_ld8<SMEM, AB>(row, o + 16 + (e % 32), hlo, hhi);
      lo |= ((hlo >> s) & 0x01010101u) << 4;
      hi |= ((hhi >> s) & 0x01010101u) << 4;
    }
    cq_u8x4_f32(lo, 0.0f, q8);
    cq_u8x4_f32(hi, 0.0f, q8 + 4);
    a = dl;
    bo = -ml;
  } else if (QT == CQ_Q6_K) {
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const float dl = cq_f16(b + 208) * (float)((const int8_t *)(b + 192))[e / 16];
    uint32_t hlo, hhi;
    cq_ld8<SMEM, AB>(row, o + h * 64 + l + (quarter & 1) * 32, lo, hi);
    cq_ld8<SMEM, AB>(row, o + 128 + h * 32 + l, hlo, hhi);
    const int lsh = 4 * (quarter >> 1), hsh = 2 * quarter;
    /* q + 32 = low nibble | (2 high bits << 4) */
    cq_u8x4_f32(((lo >> lsh) & 0x0F0F0F0Fu) | (((hlo >> hsh) & 0x03030303u) << 4), 32.0f, q8);
    cq_u8x4_f32(((hi >> lsh) & 0x0F0F0F0Fu) | (((hhi >> hsh) & 0x03030303u) << 4), 32.0f, q8 + 4);
    a = dl;
    bo = 0.0f;
  } else if (QT == CQ_IQ4_XS) {
    const int ib = e / 32, j = e % 32;
    const int scales_h = b[2] | (b[3] << 8);
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = cq_f16(b) * (float)(ls - 32);
    cq_ld8<SMEM, AB>(row, o + 8 + ib * 16 + (j & 15), lo, hi);
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      q8[i] = cq_iq4_value((lo >> (8 * i + sh)) & 0xF);
      q8[i + 4] = cq_iq4_value((hi >> (8 * i + sh)) & 0xF);
    }
    a = dl;
    bo = 0.0f;
  }
}

/* Types whose values carry an offset b (a * q + b with b != 0 in general). */
template <int QT> struct cq_has_min {
  static const bool V = QT == CQ_Q4_1 || QT == CQ_Q5_1 || QT == CQ_Q2_K || QT == CQ_Q4_K || QT == CQ_Q5_K;
};

/* bf16 x 8 (one 16-byte load) to f32: a bf16 is the top half of its f32. Shared by the bf16
 * GEMV (cuda_gemv.cu) and the quantized one. */
__device__ __forceinline__ void cq_bf16x8_f32(uint4 u, float *f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

/* Invariant (see the top): the 8 dequantized values e0 .. e0 + 7 of a row, in f32. */
template <int QT> __device__ __forceinline__ void cq_deq8(const uint8_t *row, int e0, float *v) {
  float q[8], a, b;
  cq_q8<QT>(row, e0, q, a, b);
#pragma unroll
  for (int i = 0; i < 8; i++)
    v[i] = fmaf(a, q[i], b);
}

/* Runs F.template operator()<QT>() for the runtime type QT; returns -1 for CQ_COUNT or worse. */
#define CQ_DISPATCH(qt, CALL)                                                                   \
  switch (qt) {                                                                                 \
  case CQ_Q4_0: { const int QT_ = CQ_Q4_0; CALL; } break;                                       \
  case CQ_Q4_1: { const int QT_ = CQ_Q4_1; CALL; } break;                                       \
  case CQ_Q5_0: { const int QT_ = CQ_Q5_0; CALL; } break;                                       \
  case CQ_Q5_1: { const int QT_ = CQ_Q5_1; CALL; } break;                                       \
  case CQ_Q8_0: { const int QT_ = CQ_Q8_0; CALL; } break;                                       \
  case CQ_Q2_K: { const int QT_ = CQ_Q2_K; CALL; } break;                                       \
  case CQ_Q3_K: { const int QT_ = CQ_Q3_K; CALL; } break;                                       \
  case CQ_Q4_K: { const int QT_ = CQ_Q4_K; CALL; } break;                                       \
  case CQ_Q5_K: { const int QT_ = CQ_Q5_K; CALL; } break;                                       \
  case CQ_Q6_K: { const int QT_ = CQ_Q6_K; CALL; } break;                                       \
  case CQ_IQ4_NL: { const int QT_ = CQ_IQ4_NL; CALL; } break;                                   \
  case CQ_IQ4_XS: { const int QT_ = CQ_IQ4_XS; CALL; } break;                                   \
  default: break;                                                                               \
  }

/* 16-byte cp.async copies into shared memory (the staged and integer-dot GEMVs here, the ring
 * GEMV in cuda_gemv.cu): the plain form, the one with an L2 cache policy (createpolicy), the
 * group commit and the wait for all but N of this thread's groups. */
__device__ __forceinline__ void qg_cp_async16(void *smem, const void *gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
/* The same with the L2 cache policy POL (createpolicy; here evict-first: bytes read once per step). */
__device__ __forceinline__ void qg_cp_async16_pol(void *smem, const void *gmem, uint64_t pol) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void qg_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void qg_cp_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* The same for a ring of C (2..8, uniform) chunks: all but C - 1 groups landed (the ring GEMVs). */
__device__ __forceinline__ void qg_cp_wait_ring(int C) {
  switch (C) {
  case 2: qg_cp_wait<1>(); break;
  case 3: qg_cp_wait<2>(); break;
  case 4: qg_cp_wait<3>(); break;
  case 5: qg_cp_wait<4>(); break;
  case 6: qg_cp_wait<5>(); break;
  case 7: qg_cp_wait<6>(); break;
  default: qg_cp_wait<7>(); break;
  }
}

/* qg_cp_async16_pol with POL when EVICT_FIRST, else the plain form. */
__device__ __forceinline__ void qg_cp_async16_hint(void *smem, const void *gmem, int evict_first, uint64_t pol) {
  if (evict_first)
    qg_cp_async16_pol(smem, gmem, pol);
  else
    qg_cp_async16(smem, gmem);
}

/* Block blockIdx.x's share of a ring GEMV's UNITS, split evenly over the grid, starting at u0, and
 * how many of them warp WARP of WARPS takes (u0 + warp, u0 + warp + warps, ...). */
struct qg_ring_share {
  int u0, nu;
};
__device__ __forceinline__ qg_ring_share qg_ring_share_of(int units, int warps, int warp) {
  const int u0 = (int)((long long)blockIdx.x * units / gridDim.x);
  const int u1 = (int)((long long)(blockIdx.x + 1) * units / gridDim.x);
  return qg_ring_share{u0, u0 + warp < u1 ? (u1 - u0 - warp + warps - 1) / warps : 0};
}

/* The issue side of a ring GEMV's stream (cuda_gemv.cu, cuda_quant_gemv.cu): the warp's unit ik
 * (of nu), its chunk ic (of nch), into slot is (of C). next() moves on one chunk and says whether a
 * new unit starts, whose rows the caller then looks up. */
struct qg_ring_cursor {
  int ik, ic, is;
  __device__ __forceinline__ bool next(int nch, int nu, int C) {
    bool unit = false;
    if (++ic == nch) {
      ic = 0;
      unit = ++ik < nu;
    }
    is = is + 1 == C ? 0 : is + 1;
    return unit;
  }
};

/* L2's evict-first policy for qg_cp_async16_pol (weights: read once per step). */
__device__ __forceinline__ uint64_t qg_evict_first_policy(void) {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

#endif
