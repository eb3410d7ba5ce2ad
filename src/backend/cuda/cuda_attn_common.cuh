/* cuda_attn_common.cuh - what every paged-attention kernel shares (cuda_attention.cu: the
 * general varlen kernels; cuda_attn_decode.cu: the split-context decode kernel;
 * cuda_attn_prefill.cu: the tensor-core prefill kernels):
 * - attn_lookup: token -> sequence, its query range, the keys it sees (context length and the
 *   sliding window's first key), read from the batch's device arrays;
 * - attn_load_q8: 8 consecutive q elements, scaled, as f32;
 * - the KV element types: struct kv_bf16 and struct kv_f8 (FP8 E4M3 with one scale per layer for
 *   K and one for V, struct kv_layer), each loading 16 bytes of a cache row as f32 values;
 * - softcapping and warp reductions.
 * - struct attn_rows: which dims of which key rows each thread of the
 *   register-fed tensor-core kernels (decode, per-warp prefill) loads, for every head_dim in
 *   attn_mma_hd (64, 80, 96, 128, 256);
 * Invariants: head_dim is a multiple of 8 (16 for an f8e4m3 cache in the grouped kernels and for
 * the tensor-core kernels), rows
 * are 16-byte aligned (the pool's allocation is, and a row is head_dim elements), block tables
 * hold valid block ids for every key a query sees (window blocks before the first key may be 0). */
#ifndef PAGODA_CUDA_ATTN_COMMON_CUH
#define PAGODA_CUDA_ATTN_COMMON_CUH

#include <cuda_fp8.h>

#include "backend/cuda/cuda_backend.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float attn_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float attn_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Gemma 2's attention logit softcapping (cap > 0), on a score that already includes the scale. */
__device__ __forceinline__ float attn_cap(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

/* The first key a query with CTX keys (its position + 1) sees under WINDOW (0: no window). */
__device__ __forceinline__ int attn_first_key(int ctx, int window) {
  return window > 0 && ctx > window ? ctx - window : 0;
}

/* Where a query token stands: its sequence b, the sequence's first token t0 and query count
 * q_len, and the keys it sees, first .. ctx - 1. */
struct attn_tok {
  int b, t0, q_len, ctx, first;
};

/* The sequence of flattened token T: the largest b with query_start[b] <= t. */
__device__ __forceinline__ int attn_seq_of(const int32_t *query_start, int B, int t) {
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* Token T of sequence B (b < 0: found by binary search over query_start): the query at
 * t - t0 of a sequence of seq_lens[b] tokens, q_len of them new, sees keys up to its own
 * position, ctx = seq_lens[b] - q_len + (t - t0) + 1, from attn_first_key(ctx, window). */
__device__ __forceinline__ attn_tok attn_lookup(const int32_t *query_start, const int32_t *seq_lens, int B,
                                                int t, int b, int window) {
  attn_tok r;
  r.b = b >= 0 ? b : attn_seq_of(query_start, B, t);
  r.t0 = query_start[r.b];
  r.q_len = query_start[r.b + 1] - r.t0;
  r.ctx = seq_lens[r.b] - r.q_len + (t - r.t0) + 1;
  r.first = attn_first_key(r.ctx, window);
  return r;
}

/* q[0..7] = 8 bf16 at P (16-byte aligned) times SCALE. */
__device__ __forceinline__ void attn_load_q8(float q[8], const bf16 *p, float scale) {
  uint4 u = *(const uint4 *)p;
  const __nv_bfloat162 *p2 = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    float2 f = __bfloat1622float2(p2[k]);
    q[2 * k] = f.x * scale;
    q[2 * k + 1] = f.y * scale;
  }
}

/* KV element types. N = elements in one load of type vec (16 bytes); cvt16 converts it to N f32 values
 * times SCALE (f8 only: bf16 ignores it); load8 reads 8 elements at P (8 or 16 bytes, aligned
 * to that) the same way; at reads one element. */
struct kv_bf16 {
  typedef bf16 elem;
  typedef uint4 vec;
  static constexpr int N = 8;
  __device__ static __forceinline__ void cvt16(float f[8], uint4 u, float) {
    const __nv_bfloat162 *p2 = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      float2 x = __bfloat1622float2(p2[k]);
      f[2 * k] = x.x, f[2 * k + 1] = x.y;
    }
  }
  __device__ static __forceinline__ void load8(float f[8], const elem *p, float s) { cvt16(f, *(const uint4 *)p, s); }
  __device__ static __forceinline__ float at(const elem *p, int i, float) { return __bfloat162float(p[i]); }
};

struct kv_f8 {
  typedef uint8_t elem;
  typedef uint4 vec;
  static constexpr int N = 16;
  /* 4 e4m3 in W -> 4 f32 (through half2: exact) times S */
  __device__ static __forceinline__ void cvt4(float f[4], uint32_t w, float s) {
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    float2 a = __half22float2(*(__half2 *)&lo), b = __half22float2(*(__half2 *)&hi);
    f[0] = a.x * s, f[1] = a.y * s, f[2] = b.x * s, f[3] = b.y * s;
  }
  __device__ static __forceinline__ void cvt16(float f[16], uint4 u, float s) {
    cvt4(f, u.x, s), cvt4(f + 4, u.y, s), cvt4(f + 8, u.z, s), cvt4(f + 12, u.w, s);
  }
  __device__ static __forceinline__ void load8(float f[8], const elem *p, float s) {
    uint2 u = *(const uint2 *)p;
    cvt4(f, u.x, s), cvt4(f + 4, u.y, s);
  }
  __device__ static __forceinline__ float at(const elem *p, int i, float s) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)p[i], __NV_E4M3);
    return __half2float(*(__half *)&h) * s;
  }
};

/* Everything a paged-attention kernel reads, passed by value. INVARIANT: at most 128 bytes
 * (static_assert below). A larger by-value kernel parameter makes nvcc address it through a
 * generic pointer, and the kernels compile differently: at 152 bytes the wgmma prefill ran 16%
 * slower and the e4m3 decode kernel about 4% (bench/RESULTS.md, session 14). Pointers first, so
 * no padding; the split-K partial outputs follow part_ml (attn_part_acc). */
struct attn_args {
  bf16 *out;                   /* (T, n_heads, hd) */
  const bf16 *q;               /* (T, n_heads, hd) */
  const void *kc, *vc;         /* (num_blocks, n_kv, BS, hd) of bf16 or e4m3 */
  const int32_t *query_start;  /* (B+1) */
  const int32_t *seq_lens;     /* (B) */
  const int32_t *block_tables; /* (B, max_blocks) */
  /* split-context decode (cuda_attn_decode.cu) */
  float2 *part_ml; /* (B, n_heads, num_parts) partial (max, sum), then the (B, n_heads, num_parts, hd)
                    * unnormalized partial outputs (attn_part_acc) */
  int *part_cnt;   /* (B, n_kv) partitions done, 0 between launches; NULL: the separate reduce kernel */
  int T, B, max_blocks, n_heads, n_kv, hd;
  float scale, softcap;
  int window;
  float k_scale, v_scale; /* f8e4m3 cache: per-layer dequantization scales */
  int num_parts;  /* the grid's partitions per (sequence, KV head) */
  int part_len; /* the granule of a partition's length (keys); see dec_part_len */
  unsigned short prefetch; /* > 0: attn_decode_mma_kernel looks up its keys and prefetches the K/V rows of
                            * the first PREFETCH keys of its partition into L2 before its wait
                            * (cb->attn_prefetch, at most 65535) */
  unsigned char pdl_early;  /* the decode kernels trigger the next kernel before their wait (cb->attn_early,
                             * cuda_pdl.cuh) */
  unsigned char early; /* with PREFETCH, ATTN_EXIT_EARLY: a block with no keys to read exits before its
                        * wait (cb->attn_exit_early); ATTN_KV_EARLY: attn_decode_mma_kernel loads its
                        * warps' first step of K/V before its wait (cb->attn_kv_early) */
};
#define ATTN_EXIT_EARLY 1
#define ATTN_KV_EARLY 2
static_assert(sizeof(attn_args) <= 128, "attn_args must stay within 128 bytes (see above)");

/* The split-K partial outputs: (B, n_heads, num_parts, hd) floats after the (max, sum) pairs. */
__host__ __device__ __forceinline__ float *attn_part_acc(const attn_args &a) {
  return (float *)(a.part_ml + (size_t)a.B * a.n_heads * a.num_parts);
}

/* ---- tensor-core building blocks (mma.sync m16n8k16, f32 accumulators): bf16 operands for a
 * bf16 cache, f16 for e4m3 (e4m3 -> f16 is exact). Fragment layouts as the PTX ISA gives them:
 * thread (g = lane / 4, t = lane % 4) holds A rows g and g + 8, B column g, C rows g and g + 8,
 * each at the k (or n) pairs 2t, 2t + 1 and 2t + 8, 2t + 9. attn_mma takes rows g + 8 of A as
 * zero (decode: at most 8 query heads). ---- */
__device__ __forceinline__ void attn_mma(float c[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1, bf16) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void attn_mma(float c[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1, __half) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t attn_trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t attn_pack(float x, float y, bf16) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *(uint32_t *)&v;
}
__device__ __forceinline__ uint32_t attn_pack(float x, float y, __half) {
  __half2 v = __floats2half2_rn(x, y);
  return *(uint32_t *)&v;
}
/* 16 loaded bytes -> 16-bit pairs of the mma type: bf16 as they are, e4m3 -> f16x2 */
__device__ __forceinline__ void attn_unpack(uint32_t w[4], uint4 u, bf16) { w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w; }
__device__ __forceinline__ void attn_unpack(uint32_t w[8], uint4 u, __half) {
  const uint32_t x[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x[i] & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x[i] >> 16), __NV_E4M3);
    w[2 * i] = (uint32_t)lo.x | ((uint32_t)lo.y << 16);
    w[2 * i + 1] = (uint32_t)hi.x | ((uint32_t)hi.y << 16);
  }
}

/* The same with all four A registers (rows g and g + 8 both in use: prefill). */
__device__ __forceinline__ void attn_mma4(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bf16) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void attn_mma4(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, __half) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- the register-fed row layout of the mma kernels (decode, per-warp prefill) ----
 * Thread (g = lane / 4, t = lane % 4) loads HD / 4 elements of each key row it takes: NP full
 * pieces of 16 bytes (EPP elements each, dims (i * 4 + t) * EPP ..), then, when HD is not a
 * multiple of 4 * EPP (head_dim 80 with a bf16 cache; 80 and 96 with e4m3), one tail piece of TE
 * elements (dims NP * 4 * EPP + t * TE ..) read with one 4- or 8-byte load (12: three 4-byte
 * loads). In 16-bit mma pairs (bf16 as stored, e4m3 -> f16), pair p of a row holds dims
 * dim(p, t) and dim(p, t) + 1; pairs 2c and 2c + 1 are the B registers of QK^T chunk c (16 dims,
 * permuted alike for Q and K, which a dot product allows), and pair p, transposed by movmatrix,
 * is the B operand of PV n-tile p, whose C fragment then holds dims dim(p, t), dim(p, t) + 1.
 * Requires HD % 16 == 0 (the tail is then a multiple of 4 elements). */
template <int HD, class E>
struct attn_rows {
  static_assert(HD % 16 == 0 && HD >= 16, "head_dim must be a multiple of 16");
  static constexpr int EPP = 16 / (int)sizeof(E);            /* elements per full piece */
  static constexpr int NP = HD / (4 * EPP);                  /* full pieces per thread */
  static constexpr int TE = (HD - NP * 4 * EPP) / 4;         /* tail elements per thread (0: none) */
  static constexpr int NPT = NP + (TE > 0 ? 1 : 0);          /* pieces per thread */
  static constexpr int R = EPP / 2;                          /* pairs per full piece */
  static constexpr int PAIRS = HD / 8;                       /* pairs per thread (PV n-tiles) */
  static constexpr int CHUNKS = HD / 16;                     /* QK^T k-chunks */
  __host__ __device__ static constexpr int elems(int i) { return i < NP ? EPP : TE; }
  __host__ __device__ static constexpr int dim0(int i, int t) { return i < NP ? (i * 4 + t) * EPP : NP * 4 * EPP + t * TE; }
  __host__ __device__ static constexpr int dim(int p, int t) { return dim0(p / R, t) + 2 * (p % R); }
  /* piece I of this thread (T) of the row at ROW (16-byte aligned), zero-extended to 16 bytes */
  __device__ static __forceinline__ uint4 load(const E *row, int i, int t) {
    const E *p = row + dim0(i, t);
    constexpr int TB = TE * (int)sizeof(E); /* tail bytes */
    if (i < NP)
      return __ldg((const uint4 *)p);
    if (TB == 8) {
      uint2 u = __ldg((const uint2 *)p);
      return make_uint4(u.x, u.y, 0u, 0u);
    }
    const unsigned *w = (const unsigned *)p;
    return make_uint4(__ldg(w), TB >= 8 ? __ldg(w + 1) : 0u, TB >= 12 ? __ldg(w + 2) : 0u, 0u);
  }
  /* The 16 keys of a warp step: thread (g, t) takes keys J0 + G and J0 + 8 + G (half hf = 0, 1) of
   * one KV head (HEAD_OFF into a block) through block table BT. Loads their K pieces, and V's when
   * WITH_V, interleaved (zeros for a key at or past K1); ROW gets their row offsets (NO_ROW past
   * K1) for a later load_v16. */
  static constexpr size_t NO_ROW = ~(size_t)0;
  template <int BS, bool WITH_V>
  __device__ static __forceinline__ void load_kv16(uint4 kr[2][NPT], uint4 vr[2][NPT], size_t row[2], const E *kc,
                                                   const E *vc, const int32_t *bt, size_t block_stride,
                                                   size_t head_off, int j0, int k1, int g, int t) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      const int j = j0 + hf * 8 + g;
      if (j < k1) {
        row[hf] = (size_t)__ldg(bt + j / BS) * block_stride + head_off + (size_t)(j % BS) * HD;
#pragma unroll
        for (int i = 0; i < NPT; i++) {
          kr[hf][i] = load(kc + row[hf], i, t);
          if (WITH_V)
            vr[hf][i] = load(vc + row[hf], i, t);
        }
      } else {
        row[hf] = NO_ROW;
#pragma unroll
        for (int i = 0; i < NPT; i++) {
          kr[hf][i] = make_uint4(0u, 0u, 0u, 0u);
          if (WITH_V)
            vr[hf][i] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  }
  /* V's pieces of the rows load_kv16 found */
  __device__ static __forceinline__ void load_v16(uint4 vr[2][NPT], const size_t row[2], const E *vc, int t) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
#pragma unroll
      for (int i = 0; i < NPT; i++)
        vr[hf][i] = row[hf] != NO_ROW ? load(vc + row[hf], i, t) : make_uint4(0u, 0u, 0u, 0u);
  }
  /* the loaded pieces as PAIRS mma pairs of type MT */
  template <class MT>
  __device__ static __forceinline__ void pairs(uint32_t w[PAIRS], const uint4 r[NPT]) {
#pragma unroll
    for (int i = 0; i < NPT; i++) {
      uint32_t x[sizeof(E) == 1 ? 8 : 4];
      attn_unpack(x, r[i], MT());
#pragma unroll
      for (int e = 0; e < elems(i) / 2; e++)
        w[i * R + e] = x[e];
    }
  }
  /* q's pairs in the same order from the bf16 row at Q (zeros when !LIVE), f16 for an e4m3 cache */
  template <class MT>
  __device__ static __forceinline__ void q_pairs(uint32_t w[PAIRS], const bf16 *q, int t, bool live) {
#pragma unroll
    for (int i = 0; i < NPT; i++)
#pragma unroll
      for (int c = 0; c < elems(i) / 4; c++) {
        uint2 u = live ? *(const uint2 *)(q + dim0(i, t) + 4 * c) : make_uint2(0u, 0u);
        const uint32_t x[2] = {u.x, u.y};
#pragma unroll
        for (int k = 0; k < 2; k++) {
          if (sizeof(E) == 1) {
            float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&x[k]);
            w[i * R + 2 * c + k] = attn_pack(f.x, f.y, MT());
          } else {
            w[i * R + 2 * c + k] = x[k];
          }
        }
      }
  }
};

/* head_dim values the tensor-core kernels (decode, per-warp and tile prefill) are compiled for */
static inline int attn_mma_hd(int hd) { return hd == 64 || hd == 80 || hd == 96 || hd == 128 || hd == 256; }

/* The split-context decode kernel (cuda_attn_decode.cu) for A when the batch is a decode batch
 * (MAX_QUERY_LEN 1) of a shape it is compiled for: 0 launched, -1 error (err_last() set), 1 not
 * applicable (the caller launches the general kernels). Fills A's split-K fields. */
int cuda_attention_decode(struct backend *be, attn_args *a, int bs, int f8, int max_query_len, int max_seq_len);

/* e4m3 with 8-byte loads (N = 8): half the registers per lane for q and the accumulators, for the
 * decode kernel's large GQA groups (cvt16 converts the 8 bytes of one load). */
struct kv_f8h {
  typedef uint8_t elem;
  typedef uint2 vec;
  static constexpr int N = 8;
  __device__ static __forceinline__ void cvt16(float f[8], uint2 u, float s) {
    kv_f8::cvt4(f, u.x, s), kv_f8::cvt4(f + 4, u.y, s);
  }
};

/* The tensor-core prefill kernels (cuda_attn_prefill.cu) for any other batch, head_dim in
 * attn_mma_hd:
 * 0 launched, -1 error, 1 not applicable (the general kernels then run). */
int cuda_attention_prefill(struct backend *be, const attn_args *a, int bs, int f8, int max_query_len);

/* The wgmma prefill kernel (cuda_attn_wgmma.cu, sm_90a; built when PAGODA_HAVE_WGMMA) for A on
 * stream ST of the current DEVICE, bf16 cache: 0 launched, 1 not applicable (head_dim other than
 * 128, a GPU other than compute capability 9.0, grid bounds; the caller takes the mma.sync kernels). */
int cuda_attention_prefill_wgmma(const attn_args *a, int bs, int max_query_len, int device, cudaStream_t st);

/* e4m3 of x (rounded to nearest even, saturated to +-448; NaN stays NaN), as the CPU's
 * f32_to_f8e4m3. */
__device__ __forceinline__ uint8_t attn_to_f8(float x) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

#endif
