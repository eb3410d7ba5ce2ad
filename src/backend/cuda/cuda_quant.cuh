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

__device__ __forceinline__ float cq_f16(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ uint32_t cq_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* The 16 values of the IQ4 non-linear grid (ggml's kvalues_iq4nl). */
__device__ __forceinline__ float cq_iq4_value(int i) {
  const int8_t tab[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return (float)tab[i];
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

template <int QT> __device__ __forceinline__ void cq_deq8(const uint8_t *row, int64_t e0, float *v) {
  typedef cq_traits<QT> tr;
  const uint8_t *b = row + (e0 / tr::QK) * tr::BYTES;
  const int e = (int)(e0 % tr::QK);
  if (QT == CQ_Q4_0 || QT == CQ_Q4_1 || QT == CQ_IQ4_NL) {
    const int off = QT == CQ_Q4_1 ? 4 : 2;
    const float d = cq_f16(b);
    const float m = QT == CQ_Q4_1 ? cq_f16(b + 2) : 0.0f;
    const uint8_t *qs = b + off + (e & 15);
    const int sh = e >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = (qs[i] >> sh) & 0xF;
      if (QT == CQ_Q4_0)
        v[i] = (float)(q - 8) * d;
      else if (QT == CQ_Q4_1)
        v[i] = (float)q * d + m;
      else
        v[i] = cq_iq4_value(q) * d;
    }
  } else if (QT == CQ_Q5_0 || QT == CQ_Q5_1) {
    const int hoff = QT == CQ_Q5_1 ? 4 : 2;
    const float d = cq_f16(b);
    const float m = QT == CQ_Q5_1 ? cq_f16(b + 2) : 0.0f;
    const uint32_t qh = cq_u32(b + hoff);
    const uint8_t *qs = b + hoff + 4 + (e & 15);
    const int sh = e >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = ((qs[i] >> sh) & 0xF) | (((qh >> (e + i)) & 1) << 4);
      v[i] = QT == CQ_Q5_0 ? (float)(q - 16) * d : (float)q * d + m;
    }
  } else if (QT == CQ_Q8_0) {
    const float d = cq_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2 + e);
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = (float)qs[i] * d;
  } else if (QT == CQ_Q2_K) {
    const int sc = b[e / 16];
    const float dl = cq_f16(b + 80) * (float)(sc & 0xF);
    const float ml = cq_f16(b + 82) * (float)(sc >> 4);
    const uint8_t *qs = b + 16 + (e / 128) * 32 + (e % 32);
    const int sh = 2 * ((e % 128) / 32);
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = dl * (float)((qs[i] >> sh) & 3) - ml;
  } else if (QT == CQ_Q3_K) {
    const int si = e / 16;
    const uint8_t *scales = b + 96;
    int lo = si < 8 ? scales[si] & 0xF : scales[si - 8] >> 4;
    int hi = (scales[8 + (si & 3)] >> (2 * (si / 4))) & 3;
    const float dl = cq_f16(b + 108) * (float)((lo | (hi << 4)) - 32);
    const uint8_t *hm = b + (e % 32);
    const uint8_t *qs = b + 32 + (e / 128) * 32 + (e % 32);
    const int j = (e % 128) / 32;
    const int sh = 2 * j, hb = (e / 128) * 4 + j;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = ((qs[i] >> sh) & 3) - (((hm[i] >> hb) & 1) ? 0 : 4);
      v[i] = dl * (float)q;
    }
  } else if (QT == CQ_Q4_K || QT == CQ_Q5_K) {
    const int s = e / 32;
    int sc, mn;
    cq_scale_min_k4(s, b + 4, &sc, &mn);
    const float dl = cq_f16(b) * (float)sc, ml = cq_f16(b + 2) * (float)mn;
    const int qoff = QT == CQ_Q4_K ? 16 : 48;
    const uint8_t *qs = b + qoff + (e / 64) * 32 + (e % 32);
    const uint8_t *qh = b + 16 + (e % 32);
    const int sh = 4 * (s & 1);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = (qs[i] >> sh) & 0xF;
      if (QT == CQ_Q5_K)
        q |= ((qh[i] >> s) & 1) << 4;
      v[i] = dl * (float)q - ml;
    }
  } else if (QT == CQ_Q6_K) {
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const float dl = cq_f16(b + 208) * (float)((const int8_t *)(b + 192))[e / 16];
    const uint8_t *ql = b + h * 64 + l + (quarter & 1) * 32;
    const uint8_t *qh = b + 128 + h * 32 + l;
    const int lsh = 4 * (quarter >> 1), hsh = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int q = (((ql[i] >> lsh) & 0xF) | (((qh[i] >> hsh) & 3) << 4)) - 32;
      v[i] = dl * (float)q;
    }
  } else if (QT == CQ_IQ4_XS) {
    const int ib = e / 32, j = e % 32;
    const int scales_h = b[2] | (b[3] << 8);
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = cq_f16(b) * (float)(ls - 32);
    const uint8_t *qs = b + 8 + ib * 16 + (j & 15);
    const int sh = j >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = dl * cq_iq4_value((qs[i] >> sh) & 0xF);
  }
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
