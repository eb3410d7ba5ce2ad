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

/* The 8 bytes at P into o[0..7], with the widest loads P's alignment allows (blocks of 18, 22,
 * 34, 110, 210 bytes leave most quant arrays only 2-byte aligned; Q4_K's are 8-byte aligned). */
__device__ __forceinline__ void cq_bytes8(const uint8_t *p, uint8_t *o) {
  uint32_t lo, hi;
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
#pragma unroll
  for (int i = 0; i < 4; i++) {
    o[i] = (uint8_t)(lo >> (8 * i));
    o[i + 4] = (uint8_t)(hi >> (8 * i));
  }
}

__device__ __forceinline__ uint32_t cq_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* The 16 values of the IQ4 non-linear grid (ggml's kvalues_iq4nl). */
/* {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} as int8 bytes in
 * four words, picked by __byte_perm so that no indexed array goes to local memory. */
__device__ __forceinline__ float cq_iq4_value(int i) {
  unsigned r = i < 8 ? __byte_perm(0xBFAD9881u, 0xF6EADDCFu, (unsigned)i)
                     : __byte_perm(0x26190D01u, 0x71594535u, (unsigned)(i - 8));
  return (float)(signed char)(r & 0xFF);
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

/* The 8 values e0 .. e0 + 7 of a row as a * q[i] + b: q are the integer codes (or IQ4 grid
 * values) as floats, a and b the scale and offset they share. */
template <int QT>
__device__ __forceinline__ void cq_q8(const uint8_t *row, int64_t e0, float *q8, float &a, float &bo) {
  typedef cq_traits<QT> tr;
  const uint8_t *b = row + (e0 / tr::QK) * tr::BYTES;
  const int e = (int)(e0 % tr::QK);
  if (QT == CQ_Q4_0 || QT == CQ_Q4_1 || QT == CQ_IQ4_NL) {
    const int off = QT == CQ_Q4_1 ? 4 : 2;
    const float d = cq_f16(b);
    const float m = QT == CQ_Q4_1 ? cq_f16(b + 2) : 0.0f;
    uint8_t qs[8];
    cq_bytes8(b + off + (e & 15), qs);
    const int sh = e >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = (qs[i] >> sh) & 0xF;
      q8[i] = QT == CQ_Q4_0 ? (float)(q - 8) : QT == CQ_Q4_1 ? (float)q : cq_iq4_value(q);
    }
    a = d;
    bo = m;
  } else if (QT == CQ_Q5_0 || QT == CQ_Q5_1) {
    const int hoff = QT == CQ_Q5_1 ? 4 : 2;
    const float d = cq_f16(b);
    const float m = QT == CQ_Q5_1 ? cq_f16(b + 2) : 0.0f;
    const uint32_t qh = cq_u32(b + hoff);
    uint8_t qs[8];
    cq_bytes8(b + hoff + 4 + (e & 15), qs);
    const int sh = e >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = ((qs[i] >> sh) & 0xF) | (((qh >> (e + i)) & 1) << 4);
      q8[i] = QT == CQ_Q5_0 ? (float)(q - 16) : (float)q;
    }
    a = d;
    bo = m;
  } else if (QT == CQ_Q8_0) {
    const float d = cq_f16(b);
    uint8_t qb[8];
    cq_bytes8(b + 2 + e, qb);
    const int8_t *qs = (const int8_t *)qb;
#pragma unroll
    for (int i = 0; i < 8; i++)
      q8[i] = (float)qs[i];
    a = d;
    bo = 0.0f;
  } else if (QT == CQ_Q2_K) {
    const int sc = b[e / 16];
    const float dl = cq_f16(b + 80) * (float)(sc & 0xF);
    const float ml = cq_f16(b + 82) * (float)(sc >> 4);
    uint8_t qs[8];
    cq_bytes8(b + 16 + (e / 128) * 32 + (e % 32), qs);
    const int sh = 2 * ((e % 128) / 32);
#pragma unroll
    for (int i = 0; i < 8; i++)
      q8[i] = (float)((qs[i] >> sh) & 3);
    a = dl;
    bo = -ml;
  } else if (QT == CQ_Q3_K) {
    const int si = e / 16;
    const uint8_t *scales = b + 96;
    int lo = si < 8 ? scales[si] & 0xF : scales[si - 8] >> 4;
    int hi = (scales[8 + (si & 3)] >> (2 * (si / 4))) & 3;
    const float dl = cq_f16(b + 108) * (float)((lo | (hi << 4)) - 32);
    uint8_t hm[8], qs[8];
    cq_bytes8(b + (e % 32), hm);
    cq_bytes8(b + 32 + (e / 128) * 32 + (e % 32), qs);
    const int j = (e % 128) / 32;
    const int sh = 2 * j, hb = (e / 128) * 4 + j;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = ((qs[i] >> sh) & 3) - (((hm[i] >> hb) & 1) ? 0 : 4);
      q8[i] = (float)q;
    }
    a = dl;
    bo = 0.0f;
  } else if (QT == CQ_Q4_K || QT == CQ_Q5_K) {
    const int s = e / 32;
    int sc, mn;
    cq_scale_min_k4(s, b + 4, &sc, &mn);
    const float dl = cq_f16(b) * (float)sc, ml = cq_f16(b + 2) * (float)mn;
    const int qoff = QT == CQ_Q4_K ? 16 : 48;
    uint8_t qs[8], qh[8];
    cq_bytes8(b + qoff + (e / 64) * 32 + (e % 32), qs);
    if (QT == CQ_Q5_K)
      cq_bytes8(b + 16 + (e % 32), qh);
    const int sh = 4 * (s & 1);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = (qs[i] >> sh) & 0xF;
      if (QT == CQ_Q5_K)
        q |= ((qh[i] >> s) & 1) << 4;
      q8[i] = (float)q;
    }
    a = dl;
    bo = -ml;
  } else if (QT == CQ_Q6_K) {
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const float dl = cq_f16(b + 208) * (float)((const int8_t *)(b + 192))[e / 16];
    uint8_t ql[8], qh[8];
    cq_bytes8(b + h * 64 + l + (quarter & 1) * 32, ql);
    cq_bytes8(b + 128 + h * 32 + l, qh);
    const int lsh = 4 * (quarter >> 1), hsh = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = (((ql[i] >> lsh) & 0xF) | (((qh[i] >> hsh) & 3) << 4)) - 32;
      q8[i] = (float)q;
    }
    a = dl;
    bo = 0.0f;
  } else if (QT == CQ_IQ4_XS) {
    const int ib = e / 32, j = e % 32;
    const int scales_h = b[2] | (b[3] << 8);
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = cq_f16(b) * (float)(ls - 32);
    uint8_t qs[8];
    cq_bytes8(b + 8 + ib * 16 + (j & 15), qs);
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
      q8[i] = cq_iq4_value((qs[i] >> sh) & 0xF);
    a = dl;
    bo = 0.0f;
  }
}

/* Invariant (see the top): the 8 dequantized values e0 .. e0 + 7 of a row, in f32. */
template <int QT> __device__ __forceinline__ void cq_deq8(const uint8_t *row, int64_t e0, float *v) {
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

#endif
