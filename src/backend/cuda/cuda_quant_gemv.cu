/* cuda_quant_gemv.cu - decode-sized matmuls on quantized weights: a fused dequantize-and-
 * multiply GEMV that reads every weight byte once per call, for up to CUDA_QGEMV_MAX_T
 * activation rows, and the quantized embedding gather.
 *
 * Layout of the work: one warp per output feature (weight row) at a time; lane l dequantizes
 * the 8 values [s * 256 + 8 l, +8) of the row and multiplies them with the same 8 columns of
 * each of the T bf16 activation rows (one 16-byte load per row), so a warp step covers 256
 * columns (one K-quant super-block, or eight 32-value blocks). Sums are f32, reduced over the
 * warp by shuffles at the end. Codes become floats by cq_u8x4_f32 (a byte into a float's
 * mantissa and one FADD: no quarter-rate I2F). Two kernels:
 *  - staged (rows whose bytes are a multiple of 16, K a multiple of 256, a 16-byte-aligned
 *    weight: every matrix of the 8B shape, every type): the warp copies its row to shared
 *    memory in chunks of QG_CHUNK = 2048 values with 16-byte cp.async (fully coalesced whatever
 *    the block size; QG_STAGES - 1 chunks in flight while one is multiplied) and dequantizes
 *    from there with shared-memory loads whose alignment is known at compile time (funnel
 *    shifts for 2-byte-aligned fields, no divergent alignment branches); the 8 steps of a chunk
 *    are straight-line code and each step's dot product is two chains of 4 FMAs, so loads and
 *    arithmetic of several steps overlap. The grid is one row per warp, or, for matrices with
 *    many rows per resident warp (the output head), only the resident blocks, each warp
 *    streaming its rows through its ring without a break (see qgemv_staged_launch);
 *  - direct (any other row, e.g. 32-value blocks with K = 288): loads from global memory with
 *    the widest loads each field's alignment allows, QGEMV_UNROLL warp steps in flight.
 * On the H200 at T = 1 the staged kernel reads the 8B shape's large matrices at 2.1-3.2 TB/s
 * (Q8_0) and 1.6-2.2 TB/s (Q6_K), the copy rate being 3.8 TB/s; Q4_K / Q5_K stay at 1.0-1.2
 * TB/s, bound by the arithmetic of their scales and mins (bench/RESULTS.md).
 * Those two kernels keep the activations bf16. The default for Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and
 * Q6_K on the staged layout is a third, the integer-dot kernel further down (int8 activations,
 * __dp4a), which also runs the fused matmul_n and matmul_silu_mul on quantized weights; at T = 1
 * its ring form (qgemv_ring_kernel, one block per multiprocessor) runs matmul_add, matmul_silu_mul
 * and matmul_qkv_rope and quantizes x itself.
 * Measured and rejected (bench/RESULTS.md, "CUDA quantized matmul"): two weight rows per warp
 * sharing each activation load was 10-50% slower at every shape, T <= 8.
 *
 * Every kernel here is launched with programmatic dependent launch (cuda_pdl.cuh): the GEMVs
 * issue their first weight loads (the staged ring's first QG_STAGES - 1 chunks, into the warp's
 * own shared memory; the direct kernel: L2 prefetches) before pdl_wait(), since weights never
 * change during a step, and trigger the next kernel right after the wait. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/cuda_qkv_rope.cuh" /* gemv_rope, qkv_rope_pair, qkv_rope_store (ROPE) */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define QGEMV_WARPS 4 /* rows per block */
#ifndef QGEMV_UNROLL
#define QGEMV_UNROLL 4 /* direct kernel: warp steps (256 columns each) whose loads are in flight together */
#endif
#define QG_CHUNK 2048 /* staged kernel: values of a row per shared-memory chunk (8 warp steps) */
#ifndef QG_STAGES
#define QG_STAGES 3 /* staged kernel: chunks per warp in shared memory (STAGES - 1 in flight while one is used) */
#endif
#define QG_SLACK 16 /* bytes after each warp's buffers: cq_ld8<true> may read 3 past a chunk */
#define QG_STREAM_ROWS 8 /* rows per resident warp from which the grid is capped (see qgemv_staged_launch) */

/* Asks L2 for the 128-byte line holding P (a weight: may run before pdl_wait). */
__device__ __forceinline__ void qg_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <int QT> struct qg_chunk {
  static const int BYTES = QG_CHUNK / cq_traits<QT>::QK * cq_traits<QT>::BYTES; /* multiple of 16 */
};

/* Blocks per multiprocessor the integer-dot kernel's registers must allow (__launch_bounds__): at
 * T = 1 on Q8_0, as many as its shared memory allows (Hopper's 228 KiB per multiprocessor, 1 KiB
 * of it reserved per block: 8 with the 3-chunk ring). ptxas then stays within 64 registers (61-64
 * for sm_90, no spills) and there schedules the activation loads earlier than it does
 * unbounded: `--isq 8` at 8B measured faster (bench/RESULTS.md, "session 10"). Other types and T
 * keep no bound: the K-quants would spill, and Q4_0 / Q4_1 fit more blocks than 8. */
#define QI_SMEM_BYTES(QT, STAGES) (QGEMV_WARPS * ((STAGES) * qg_chunk<QT>::BYTES + QG_SLACK))
#define QI_MIN_BLOCKS(QT, NT)                                                                   \
  ((NT) == 1 && (QT) == CQ_Q8_0 ? (228 * 1024) / (QI_SMEM_BYTES(QT, QG_STAGES) + 1024) : 1)

template <int NT>
__device__ __forceinline__ void qg_store(void *out, int out_f32, int N, int row, int lane, float *acc) {
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

/* One warp step of the staged kernel: the 8 values [e, e + 8) of the chunk CH (shared memory)
 * times the same columns of the T activation rows at XC (global, L1-cached). The dot product
 * runs as two chains of 4 FMAs (shorter dependency chains), factored as a * (q . x) + b * sum(x). */
template <int QT, int NT>
__device__ __forceinline__ void qg_step(const uint8_t *ch, int e, const bf16 *xc, int K, float *acc) {
  float q[8], a, b;
  cq_q8<QT, true>(ch, e, q, a, b);
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float xv[8];
    cq_bf16x8_f32(__ldg((const uint4 *)(xc + (size_t)t * K)), xv);
    float d0 = q[0] * xv[0], d1 = q[1] * xv[1];
    d0 = fmaf(q[2], xv[2], d0);
    d1 = fmaf(q[3], xv[3], d1);
    d0 = fmaf(q[4], xv[4], d0);
    d1 = fmaf(q[5], xv[5], d1);
    d0 = fmaf(q[6], xv[6], d0);
    d1 = fmaf(q[7], xv[7], d1);
    acc[t] = fmaf(a, d0 + d1, acc[t]);
    if (cq_has_min<QT>::V)
      acc[t] = fmaf(b, ((xv[0] + xv[1]) + (xv[2] + xv[3])) + ((xv[4] + xv[5]) + (xv[6] + xv[7])), acc[t]);
  }
}

/* Staged kernel (see the top). Requires row_bytes % 16 == 0, K % 256 == 0, W 16-byte aligned;
 * dynamic shared memory QGEMV_WARPS * (STAGES * chunk bytes + QG_SLACK). Warp g takes rows g,
 * g + G, g + 2 G ... (G warps in the grid) and streams their chunks through its STAGES-slot
 * ring without a break between rows, so the next row's bytes are in flight while this row's
 * last chunk is multiplied (with one row per warp, G >= N, it is one row's chunks). */
template <int QT, int NT, int STAGES>
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
    qgemv_staged_kernel(void *out, int out_f32, const uint8_t *__restrict__ W, size_t row_bytes,
                        const bf16 *__restrict__ x, int N, int K) {
  extern __shared__ __align__(16) uint8_t qg_smem[];
  const int CB = qg_chunk<QT>::BYTES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = gridDim.x * QGEMV_WARPS;
  const int gw = blockIdx.x * QGEMV_WARPS + warp;
  if (gw >= N)
    return; /* no block-wide barrier below: warps are independent */
  uint8_t *buf = qg_smem + warp * (STAGES * CB + QG_SLACK);
  const int nch = (K + QG_CHUNK - 1) / QG_CHUNK;
  /* the chunk stream: chunk ic of row ir is issued into slot is */
  int ir = gw, ic = 0, is = 0;
#define QG_ISSUE()                                                                                  \
  do {                                                                                              \
    if (ir < N) {                                                                                   \
      const size_t c0 = (size_t)ic * CB;                                                            \
      const int nb = (int)(row_bytes - c0 < (size_t)CB ? row_bytes - c0 : (size_t)CB);              \
      const uint8_t *src = W + (size_t)ir * row_bytes + c0;                                         \
      uint8_t *dst = buf + is * CB;                                                                 \
      for (int o = lane * 16; o < nb; o += 512)                                                     \
        qg_cp_async16(dst + o, src + o);                                                            \
      if (++ic == nch) {                                                                            \
        ic = 0;                                                                                     \
        ir += G;                                                                                    \
      }                                                                                             \
      is = is + 1 == STAGES ? 0 : is + 1;                                                           \
    }                                                                                               \
    qg_cp_commit();                                                                                 \
  } while (0)
#pragma unroll
  for (int i = 0; i < STAGES - 1; i++)
    QG_ISSUE(); /* weights into this warp's shared memory: allowed before the wait (cuda_pdl.cuh) */
  pdl_wait();    /* x is written by the kernel before */
  pdl_trigger();
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; t++)
    acc[t] = 0.0f;
  int r = gw, c = 0, slot = 0;
  while (r < N) {
    qg_cp_wait<STAGES - 2>(); /* this lane's copies of the current chunk have landed */
    __syncwarp();             /* ... and every lane's; the slot used last round is free */
    QG_ISSUE();
    const uint8_t *ch = buf + slot * CB;
    const int v0 = c * QG_CHUNK;
    const bf16 *xc = x + v0 + lane * 8;
    if (K - v0 >= QG_CHUNK) { /* a full chunk: 8 steps in straight-line code */
#pragma unroll
      for (int s = 0; s < QG_CHUNK / 256; s++)
        qg_step<QT, NT>(ch, s * 256 + lane * 8, xc + s * 256, K, acc);
    } else {
      const int nsteps = (K - v0) / 256;
      for (int s = 0; s < nsteps; s++)
        qg_step<QT, NT>(ch, s * 256 + lane * 8, xc + s * 256, K, acc);
    }
    if (++c == nch) {
      qg_store<NT>(out, out_f32, N, r, lane, acc);
#pragma unroll
      for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
      c = 0;
      r += G;
    }
    slot = slot + 1 == STAGES ? 0 : slot + 1;
    __syncwarp(); /* every lane is done with this slot before it is refilled */
  }
#undef QG_ISSUE
}

/* Direct kernel (see the top): any row length and alignment. */
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
  /* the bytes of the first QGEMV_UNROLL warp steps into L2 */
  const size_t pf0 = (size_t)QGEMV_UNROLL * 256 / cq_traits<QT>::QK * cq_traits<QT>::BYTES;
  const size_t pf = row_bytes < pf0 ? row_bytes : pf0;
  for (size_t o = (size_t)lane * 128; o < pf; o += 32 * 128)
    qg_prefetch_l2(wr + o);
  pdl_wait(); /* x is written by the kernel before */
  pdl_trigger();
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
        cq_bf16x8_f32(__ldg((const uint4 *)(x + (size_t)t * K + e0 + u * 256)), xv);
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
      cq_bf16x8_f32(__ldg((const uint4 *)(x + (size_t)t * K + e0)), xv);
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; i++)
        s = fmaf(wv[i], xv[i], s);
      acc[t] += s;
    }
  }
  qg_store<NT>(out, out_f32, N, row, lane, acc);
}

/* Which kernel: 1 staged where it applies (the default), 0 always direct;
 * PAGODA_QGEMV_KERNEL=0|1|3|4 for A/B runs of bench/cuda_quant (3: staged, never capping the
 * grid; 4: staged, the grid always capped at what fits). */
static int qgemv_kernel_choice(void) {
  static int choice = -1;
  if (choice < 0) {
    const char *e = getenv("PAGODA_QGEMV_KERNEL");
    choice = e && *e ? atoi(e) : 1;
  }
  return choice;
}

/* Blocks of the staged kernel that fit on the GPU at once, once per instantiation and process
 * (the GPUs of one process are alike). Should a query fail, one block per SM: any grid is
 * correct, since every warp streams rows g, g + G, ... until N. */
template <int QT, int NT, int STAGES> static int qg_resident_blocks(size_t smem) {
  static int blocks = 0;
  if (!blocks) {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_staged_kernel<QT, NT, STAGES>, QGEMV_WARPS * 32,
                                                  smem);
    blocks = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  }
  return blocks;
}

template <int QT, int NT, int STAGES>
static cudaError_t qgemv_staged_launch(const struct cuda_backend *cb, void *out, int out_f32, const uint8_t *W,
                                       size_t row_bytes, const bf16 *x, int N, int K) {
  size_t sm = QGEMV_WARPS * (STAGES * qg_chunk<QT>::BYTES + QG_SLACK);
  int blocks = (N + QGEMV_WARPS - 1) / QGEMV_WARPS, fit = qg_resident_blocks<QT, NT, STAGES>(sm);
  /* Grid: one row per warp (the block scheduler balances the load) unless the matrix has more
   * than QG_STREAM_ROWS rows per resident warp (the output head): then only the resident blocks,
   * each warp streaming its rows back to back (at most 1 / QG_STREAM_ROWS of the warps idle at
   * the end). Measured on the H200 (bench/RESULTS.md): one row per warp is 9-15% faster at
   * N = 14336 (3.4 rows per resident warp), streaming reads the Q8_0 head at 3.2 TB/s.
   * PAGODA_QGEMV_BLOCKS=n (tests only) caps the grid at n blocks, so that every warp streams. */
  const char *cap = getenv("PAGODA_QGEMV_BLOCKS");
  int kc = qgemv_kernel_choice();
  if (cap && atoi(cap) > 0) {
    if (blocks > atoi(cap))
      blocks = atoi(cap);
  } else if ((kc == 4 && blocks > fit) || (kc != 3 && blocks > QG_STREAM_ROWS * fit)) {
    blocks = fit;
  }
  return cuda_pdl_launch(cb, qgemv_staged_kernel<QT, NT, STAGES>, dim3(blocks), dim3(QGEMV_WARPS * 32), sm, out,
                         out_f32, W, row_bytes, x, N, K);
}

template <int QT, int NT>
static cudaError_t qgemv_launch(const struct cuda_backend *cb, void *out, int out_f32, const struct weight *w,
                                size_t row_bytes, const bf16 *x) {
  int N = (int)w->rows, K = (int)w->cols;
  const uint8_t *W = (const uint8_t *)w->data;
  int kc = qgemv_kernel_choice();
  if (kc != 0 && row_bytes % 16 == 0 && K % 256 == 0 && (uintptr_t)W % 16 == 0)
    return qgemv_staged_launch<QT, NT, QG_STAGES>(cb, out, out_f32, W, row_bytes, x, N, K);
  dim3 grid((N + QGEMV_WARPS - 1) / QGEMV_WARPS);
  return cuda_pdl_launch(cb, qgemv_kernel<QT, NT>, grid, dim3(QGEMV_WARPS * 32), 0, out, out_f32, W, row_bytes, x,
                         N, K);
}

template <int QT>
static cudaError_t qgemv_dispatch_t(const struct cuda_backend *cb, void *out, int out_f32, const struct weight *w,
                                    size_t row_bytes, const bf16 *x, int T) {
  switch (T) {
  case 1: return qgemv_launch<QT, 1>(cb, out, out_f32, w, row_bytes, x);
  case 2: return qgemv_launch<QT, 2>(cb, out, out_f32, w, row_bytes, x);
  case 3: return qgemv_launch<QT, 3>(cb, out, out_f32, w, row_bytes, x);
  case 4: return qgemv_launch<QT, 4>(cb, out, out_f32, w, row_bytes, x);
  case 5: return qgemv_launch<QT, 5>(cb, out, out_f32, w, row_bytes, x);
  case 6: return qgemv_launch<QT, 6>(cb, out, out_f32, w, row_bytes, x);
  case 7: return qgemv_launch<QT, 7>(cb, out, out_f32, w, row_bytes, x);
  default: return qgemv_launch<QT, 8>(cb, out, out_f32, w, row_bytes, x);
  }
}

/* ---- int8 activations and integer dot products (the default for Q4_0, Q4_1, Q8_0, Q4_K, Q5_K,
 * Q6_K on the staged layout) ----
 * qx_quantize turns the T bf16 activation rows into blocks of 32 int8 values once per matmul
 * (llama.cpp's q8_1 idea): q = round(x * (127 / max|x|)), d = max|x| / 127 over the block, and
 * beside it (d, d * sum q) as a float2. The GEMV then multiplies the weight codes with __dp4a (4 int8
 * products and their sum per instruction) and applies each scale once per 32 values (16 for
 * Q6_K) instead of converting every code to float. Layout of a warp step: lane l takes the 32
 * values [1024 s + 32 l, +32) of a staged 2048-value chunk, i.e. exactly one activation block,
 * one sub-block of a K-quant super-block or one 32-value block, so a step covers 1024 columns.
 * Rounding: each activation moves by up to d / 2; for random activations the output's relative
 * error is about 1 / 254 (tests/gpu/test_cuda_quant.c, TOL_GEMV_I8). PAGODA_QGEMV_I8=0 keeps the
 * bf16-activation kernels above (for A/B runs and bisecting). On the H200 at T = 1 (bench/RESULTS.md,
 * "CUDA quantized GEMV with int8 activations and dp4a"), the x quantization included, it reads
 * the 8B shape's large Q4_K / Q5_K matrices at 1.8-1.9 TB/s (1.0-1.2 with bf16 activations),
 * Q6_K at 1.7-1.9, Q8_0 at 2.4-2.5 and the Q8_0 output head at 3.76 TB/s. */

/* Scratch for one pass of at most CUDA_QGEMV_MAX_T rows: int8 (T, K), then float2 (T, K / 32). */
size_t cuda_quant_x8_bytes(int T, int64_t K) { return (size_t)T * (size_t)K + (size_t)T * (size_t)(K / 32) * 8; }

/* Quantizes the 8 values V, the group I of 8 (counted over all T rows), into xq / xd: four lanes
 * (I % 4 = lane % 4, the same warp) hold one block of 32 and every lane of the warp calls it. */
struct qx8 {
  uint2 q;  /* the group's 8 codes */
  float2 d; /* its block's (d, d * sum q), the same on the block's four lanes */
};
__device__ __forceinline__ qx8 qx_quantize8_calc(const float *v) {
  float am = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; k++)
    am = fmaxf(am, fabsf(v[k]));
  am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
  am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
  /* IEEE divisions whatever --use_fast_math says: the test repeats this quantization on the host */
  const float d = __fdiv_rn(am, 127.0f), id = am > 0.0f ? __fdiv_rn(127.0f, am) : 0.0f;
  int s = 0;
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const int q = __float2int_rn(v[k] * id);
    s += q;
    w[k / 4] |= (uint32_t)(q & 0xFF) << (8 * (k % 4));
  }
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return qx8{make_uint2(w[0], w[1]), make_float2(d, d * (float)s)};
}
__device__ __forceinline__ void qx_quantize8(int8_t *xq, float2 *xd, const float *v, size_t i) {
  const qx8 r = qx_quantize8_calc(v);
  ((uint2 *)xq)[i] = r.q;
  if ((i & 3) == 0)
    xd[i / 4] = r.d;
}

__global__ void qx_quantize_kernel(int8_t *xq, float2 *xd, const bf16 *__restrict__ x, int n8, int early) {
  pdl_enter(early); /* x is written by the kernel before; EARLY: cb->qx_early (cuda_pdl.cuh) */
  const int i = blockIdx.x * blockDim.x + threadIdx.x; /* 8 values each, 4 threads per block of 32 */
  if (i - (threadIdx.x & 31) >= n8)
    return; /* n8 is a multiple of 32: a warp is all in or all out */
  float v[8];
  cq_bf16x8_f32(__ldg((const uint4 *)x + i), v);
  qx_quantize8(xq, xd, v, (size_t)i);
}

/* With a prenorm (struct backend_prenorm): block t takes row t of x (K values, K % 256 == 0),
 * computes its 1 / rms as rmsnorm_kernel does (norm_inv, cuda_norm.cuh: the same summation
 * order, so the same bits), rounds each x * inv * w to bf16 as rmsnorm_kernel writes it
 * (norm_elem), and quantizes those values exactly as qx_quantize_kernel quantizes a stored
 * rmsnorm output: one launch where rmsnorm + qx_quantize took two, bit for bit the same xq / xd.
 * NW warps (1024 threads: rmsnorm_kernel's count from K = 1024 on), 8 values per thread per
 * pass; K / 8 is a multiple of 32, so a warp is all in or all out of a pass. The thread's first
 * group of x is read right after the wait, beside the norm's own reads, not after its two
 * reductions (bench/RESULTS.md, "session 10": 2.904 against 2.919 ms per token at 8B `--isq 8`
 * for this form against 4 values on every thread of the block). */
#define QX_NORM_WARPS 32
template <int NW>
__global__ void __launch_bounds__(NW * 32)
    qx_norm_quantize_kernel(int8_t *xq, float2 *xd, const bf16 *__restrict__ x, const void *__restrict__ nw,
                            int nw_f32, int K, float eps, int early) {
  __shared__ float part[32];
  const int n8 = K / 8;
  /* the norm weights of the thread's first group: constant during a step, so read before the wait
   * (cuda_pdl.cuh), and their L2 round trip overlaps the kernel before */
  float w0[8];
#pragma unroll
  for (int k = 0; k < 8; k++)
    w0[k] = (int)threadIdx.x < n8 ? norm_weight_at(nw, nw_f32, (size_t)threadIdx.x * 8 + k) : 0.0f;
  pdl_enter(early); /* x is written by the kernel before; EARLY: cb->qx_early (cuda_pdl.cuh) */
  const bf16 *xr = x + (size_t)blockIdx.x * K;
  uint4 u0 = {};
  if ((int)threadIdx.x < n8)
    u0 = *((const uint4 *)xr + threadIdx.x);
  const float inv = norm_inv<NW>(xr, K, eps, part);
  for (int g = threadIdx.x; g < n8; g += NW * 32) {
    const uint4 u = g == (int)threadIdx.x ? u0 : *((const uint4 *)xr + g);
    const bf16 *xb = (const bf16 *)&u;
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
      v[k] = __bfloat162float(
          norm_elem(xb[k], inv, g == (int)threadIdx.x ? w0[k] : norm_weight_at(nw, nw_f32, (size_t)g * 8 + k)));
    qx_quantize8(xq, xd, v, (size_t)blockIdx.x * n8 + g);
  }
}

/* Types with an integer-dot step below. */
static bool qi_supported(int qt) {
  return qt == CQ_Q4_0 || qt == CQ_Q4_1 || qt == CQ_Q8_0 || qt == CQ_Q4_K || qt == CQ_Q5_K || qt == CQ_Q6_K;
}

/* NW words of a staged chunk starting at byte OFF (even; BASE 16-byte aligned): aligned word
 * loads and funnel shifts, the same instructions on every lane (reads 4 bytes past the end). */
template <int NW> __device__ __forceinline__ void qi_ldw(const uint8_t *base, int off, uint32_t *w) {
  const uint32_t *p = (const uint32_t *)(base + (off & ~3));
  const unsigned sh = (unsigned)(off & 2) * 8;
  uint32_t r[NW + 1];
#pragma unroll
  for (int i = 0; i <= NW; i++)
    r[i] = p[i];
#pragma unroll
  for (int i = 0; i < NW; i++)
    w[i] = __funnelshift_r(r[i], r[i + 1], sh);
}
/* 32 bytes at a 16-byte-aligned offset. */
__device__ __forceinline__ void qi_ld32(const uint8_t *p, uint32_t *w) {
  const uint4 a = *(const uint4 *)p, b = *(const uint4 *)(p + 16);
  w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
  w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}
__device__ __forceinline__ float qi_f16(const uint8_t *p) { /* f16 at an even smem offset */
  return __half2float(__ushort_as_half(*(const unsigned short *)p));
}
/* Bytes 0..63 (6-bit codes) to signed (code - 32), 4 per word, without carries between bytes. */
__device__ __forceinline__ int qi_sub32(uint32_t q) {
  const uint32_t t = q ^ 0x20202020u;
  return (int)(t | ((t & 0x20202020u) * 6u));
}

/* One lane's 32 weights of a step, decoded from the staged chunk: the codes as int8 (Q6_K: minus
 * 32; Q4_0: unsigned nibbles), the scale S of sum(code * xq), the factor M of the block's
 * d * sum(xq) (mins and offsets), Q6_K's two 16-value scales. */
struct qi_w {
  int q[8];
  float s, m;
  int sc0, sc1;
};
/* One activation block: 32 int8 values and (d, d * sum q). */
struct qi_x {
  int4 a, b;
  float2 d;
};
__device__ __forceinline__ qi_x qi_load_x(const int8_t *xq, const float2 *xd) {
  return qi_x{__ldg((const int4 *)xq), __ldg((const int4 *)xq + 1), __ldg(xd)};
}

/* The weights of lane's 32 values [e, e + 32) of the chunk CH (shared memory). */
template <int QT> __device__ __forceinline__ qi_w qi_weights(const uint8_t *ch, int e) {
  typedef cq_traits<QT> tr;
  const int o = (e / tr::QK) * tr::BYTES;
  qi_w res = {};
  int *wq = res.q;
  float &ws = res.s, &wm = res.m;
  int &sc0 = res.sc0, &sc1 = res.sc1;
  if (QT == CQ_Q8_0) {
    uint32_t w[8];
    qi_ldw<8>(ch, o + 2, w);
#pragma unroll
    for (int i = 0; i < 8; i++)
      wq[i] = (int)w[i];
    ws = qi_f16(ch + o);
  } else if (QT == CQ_Q4_0 || QT == CQ_Q4_1) {
    const int qo = QT == CQ_Q4_1 ? 4 : 2;
    uint32_t w[4];
    if (QT == CQ_Q4_1) { /* 20-byte blocks: 4-byte aligned */
      const uint32_t *p = (const uint32_t *)(ch + o + qo);
#pragma unroll
      for (int i = 0; i < 4; i++)
        w[i] = p[i];
    } else {
      qi_ldw<4>(ch, o + qo, w);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      wq[i] = (int)(w[i] & 0x0F0F0F0Fu);
      wq[i + 4] = (int)((w[i] >> 4) & 0x0F0F0F0Fu);
    }
    ws = qi_f16(ch + o);
    wm = QT == CQ_Q4_1 ? qi_f16(ch + o + 2) : -8.0f * ws;
  } else if (QT == CQ_Q4_K || QT == CQ_Q5_K) {
    const int s = (e % 256) / 32;
    const uint8_t *b = ch + o;
    int sc, mn;
    cq_scale_min_k4(s, b + 4, &sc, &mn);
    const uint32_t dm = *(const uint32_t *)b;
    const float d = __half2float(__ushort_as_half((unsigned short)(dm & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(dm >> 16)));
    uint32_t w[8];
    qi_ld32(b + (QT == CQ_Q4_K ? 16 : 48) + (s / 2) * 32, w);
    const int sh = 4 * (s & 1);
    if (QT == CQ_Q5_K) {
      uint32_t h[8];
      qi_ld32(b + 16, h);
#pragma unroll
      for (int i = 0; i < 8; i++)
        wq[i] = (int)(((w[i] >> sh) & 0x0F0F0F0Fu) | (((h[i] >> s) & 0x01010101u) << 4));
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++)
        wq[i] = (int)((w[i] >> sh) & 0x0F0F0F0Fu);
    }
    ws = d * (float)sc;
    wm = -dmin * (float)mn;
  } else if (QT == CQ_Q6_K) {
    const int r = e % 256, h = r / 128, quarter = (r % 128) / 32;
    uint32_t lo[8], hi[8];
    qi_ldw<8>(ch, o + h * 64 + (quarter & 1) * 32, lo);
    qi_ldw<8>(ch, o + 128 + h * 32, hi);
    const int lsh = 4 * (quarter >> 1), hsh = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 8; i++)
      wq[i] = qi_sub32(((lo[i] >> lsh) & 0x0F0F0F0Fu) | (((hi[i] >> hsh) & 0x03030303u) << 4));
    const uint32_t sw = *(const unsigned short *)(ch + o + 192 + r / 16); /* r / 16 even */
    sc0 = (int)(signed char)(sw & 0xFF);
    sc1 = (int)(signed char)(sw >> 8);
    ws = qi_f16(ch + o + 208);
  }
  return res;
}

/* acc += the block's dot product: W's codes with X's, scaled. */
template <int QT> __device__ __forceinline__ void qi_dot(const qi_w &w, const qi_x &x, float &acc) {
  const int xa[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
  int s0 = 0, s1 = 0; /* Q4_0 / Q4_1 / K-quants: unsigned codes times signed activations */
#pragma unroll
  for (int i = 0; i < 4; i++) {
    s0 = __dp4a(w.q[i], xa[i], s0);
    s1 = __dp4a(w.q[i + 4], xa[i + 4], s1);
  }
  if (QT == CQ_Q6_K) {
    acc = fmaf(w.s * x.d.x, (float)(w.sc0 * s0 + w.sc1 * s1), acc);
  } else {
    acc = fmaf(w.s * x.d.x, (float)(s0 + s1), acc);
    if (QT != CQ_Q8_0)
      acc = fmaf(w.m, x.d.y, acc);
  }
}

/* One lane's 32 values [e, e + 32) of the chunk CH (shared memory) against the T activation
 * blocks at XQ / XD (block index of e; row t at t * K values / t * K / 32 blocks). */
template <int QT, int NT>
__device__ __forceinline__ void qi_step(const uint8_t *ch, int e, const int8_t *xq, const float2 *xd, int K,
                                        float *acc) {
  const qi_w w = qi_weights<QT>(ch, e);
#pragma unroll
  for (int t = 0; t < NT; t++)
    qi_dot<QT>(w, qi_load_x(xq + (size_t)t * K, xd + (size_t)t * (K / 32)), acc[t]);
}

/* What one launch of the integer-dot kernel computes (passed by value as a __grid_constant__):
 * R = 1: units are the rows of up to BACKEND_MATMUL_N_MAX matrices of one type and K (matrix i
 * owns units [row0[i], row0[i + 1])), out[i](T, N[i]) = x @ W[i]^T, f32 when out_f32, else
 * bf16 with the bias (f32 or bf16, optional) added after the product's bf16 rounding, as the
 * separate matmul and add_bias do; with ADD (one matrix, no bias, bf16) out[0] is the residual
 * stream and each product, rounded to bf16, is added into it as rmsnorm_kernel's residual add
 * rounds it: r = bf16(float(bf16(acc)) + float(r)) (matmul_add). R = 2: unit f is gate row f
 * (W[0]) and up row f (W[1]), out[0](T, F) = silu(g) * u on the bf16-rounded products, as
 * silu_mul does. R = 2 with ROPE: unit g is the pair of q/k/v rows qkv_rope_pair(rope, g) gives,
 * finished by qkv_rope_store (cuda_qkv_rope.cuh: matmul_qkv_rope). */
struct qi_args : cuda_matmul_set { /* W, out, bias, bias_f32, N, row0: cuda_backend.h */
  int units, out_f32, add, epi_early, K; /* epi_early: ADD reads the residual right after the wait (cb->epi_early) */
  int evict_first; /* the weight copies carry L2's evict-first policy (cb->qg_evict_first) */
  size_t row_bytes;
  const int8_t *xq;
  const float2 *xd;
  gemv_rope rope; /* ROPE only */
  /* the ring kernel (qgemv_ring_kernel) only: */
  const bf16 *x;         /* the bf16 activations it quantizes itself */
  const void *norm_w;    /* PRE: the norm weight (K, f32 or bf16) */
  int norm_w_f32, ring_c, ring_late; /* ring_c: chunks per warp's ring; ring_late: cb->gemv_ring_late */
  int ring_cv; /* values per ring chunk: 1024 or 2048 (the warps per block are blockDim.x / 32) */
  float norm_eps;
};

/* The staged kernel's ring (qgemv_staged_kernel, same requirements) with qi_step: each warp
 * streams units g, g + G, ... and, per unit, R rows of nch chunks back to back. The weight copies
 * carry L2's evict-first policy (a.evict_first): read once per step, they should not push out
 * what is read again (the activations, the KV cache, the next kernels' inputs). */
template <int QT, int NT, int R, int STAGES, bool ROPE = false>
__global__ void __launch_bounds__(QGEMV_WARPS * 32, QI_MIN_BLOCKS(QT, NT))
    qgemv_i8_kernel(const __grid_constant__ qi_args a) {
  static_assert(!ROPE || R == 2, "ROPE takes a pair of rows per unit");
  extern __shared__ __align__(16) uint8_t qg_smem[];
  const int CB = qg_chunk<QT>::BYTES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = gridDim.x * QGEMV_WARPS;
  const int gw = blockIdx.x * QGEMV_WARPS + warp;
  const int U = a.units, K = a.K;
  const size_t rb = a.row_bytes;
  if (gw >= U)
    return; /* no block-wide barrier below: warps are independent */
  uint8_t *buf = qg_smem + warp * (STAGES * CB + QG_SLACK);
  uint64_t pol = 0;
  if (a.evict_first)
    pol = qg_evict_first_policy();
  const int nch = (K + QG_CHUNK - 1) / QG_CHUNK;
  /* the chunk stream: chunk ic of row ir (of R) of unit iu is issued into slot is */
  int iu = gw, ir = 0, ic = 0, is = 0;
  auto row_ptr = [&](int u, int r) -> const uint8_t * {
    if (ROPE) {
      const qkv_pair p = qkv_rope_pair(a.rope, u);
      return (const uint8_t *)a.W[p.i] + (size_t)(r ? p.r1 : p.r0) * rb;
    }
    if (R == 2)
      return (const uint8_t *)a.W[r] + (size_t)u * rb;
    int i = 0;
#pragma unroll
    for (int j = 1; j < BACKEND_MATMUL_N_MAX; j++)
      i += u >= a.row0[j];
    return (const uint8_t *)a.W[i] + (size_t)(u - a.row0[i]) * rb;
  };
  auto issue = [&]() {
    if (iu < U) {
      const size_t c0 = (size_t)ic * CB;
      const int nb = (int)(rb - c0 < (size_t)CB ? rb - c0 : (size_t)CB);
      const uint8_t *src = row_ptr(iu, ir) + c0;
      uint8_t *dst = buf + is * CB;
      if (a.evict_first)
        for (int o = lane * 16; o < nb; o += 512)
          qg_cp_async16_pol(dst + o, src + o, pol);
      else
        for (int o = lane * 16; o < nb; o += 512)
          qg_cp_async16(dst + o, src + o);
      if (++ic == nch) {
        ic = 0;
        if (++ir == R) {
          ir = 0;
          iu += G;
        }
      }
      is = is + 1 == STAGES ? 0 : is + 1;
    }
    qg_cp_commit();
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; i++)
    issue(); /* weights into this warp's shared memory: allowed before the wait (cuda_pdl.cuh) */
  pdl_wait();    /* xq / xd (and the residual of ADD) are written by the kernels before */
  pdl_trigger(); /* only now: the next kernel may launch, the one after it not yet */
  /* ADD: the residual of the warp's first row, read now, so that its L2 round trip overlaps the
   * products instead of following the reduction (one matrix: unit = row) */
  float rpre[NT];
#pragma unroll
  for (int t = 0; t < NT; t++)
    rpre[t] = R == 1 && a.epi_early && lane == 0 ? __bfloat162float(((const bf16 *)a.out[0])[(size_t)t * a.N[0] + gw])
                                                  : 0.0f;
  /* ROPE: the same for the first pair's epilogue inputs (cuda_qkv_rope.cuh) */
  qkv_rope_in rin = {};
  if (ROPE && a.rope.early)
    rin = qkv_rope_load<NT>(a, a.rope, qkv_rope_pair(a.rope, gw), lane);
  float acc[NT], g[NT];
#pragma unroll
  for (int t = 0; t < NT; t++)
    acc[t] = g[t] = 0.0f;
  int u = gw, r = 0, c = 0, slot = 0;
  while (u < U) {
    qg_cp_wait<STAGES - 2>(); /* this lane's copies of the current chunk have landed */
    __syncwarp();             /* ... and every lane's; the slot used last round is free */
    issue();
    const uint8_t *ch = buf + slot * CB;
    const int v0 = c * QG_CHUNK;
    const int8_t *xq = a.xq + v0 + lane * 32;
    const float2 *xd = a.xd + v0 / 32 + lane;
    if (K - v0 >= QG_CHUNK) {
#pragma unroll
      for (int s = 0; s < QG_CHUNK / 1024; s++)
        qi_step<QT, NT>(ch, s * 1024 + lane * 32, xq + s * 1024, xd + s * 32, K, acc);
    } else { /* K - v0 is a multiple of 256: a lane's 32 values are all in or all out */
      for (int s = 0; s * 1024 < K - v0; s++)
        if (s * 1024 + lane * 32 < K - v0)
          qi_step<QT, NT>(ch, s * 1024 + lane * 32, xq + s * 1024, xd + s * 32, K, acc);
    }
    if (++c == nch) {
      c = 0;
#pragma unroll
      for (int t = 0; t < NT; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1)
          v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = v;
      }
      if (R == 2 && r == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++)
          g[t] = acc[t];
        r = 1;
      } else if (ROPE) { /* every lane holds both totals; lane t < NT finishes token t */
        float pair[2][NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
          pair[0][t] = g[t];
          pair[1][t] = acc[t];
        }
        const qkv_pair p = qkv_rope_pair(a.rope, u);
        qkv_rope_store<NT>(a, a.rope, p, pair, lane,
                           a.rope.early && u == gw ? rin : qkv_rope_load<NT>(a, a.rope, p, lane));
        r = 0;
        u += G;
      } else {
        if (lane == 0) {
          if (R == 2) {
#pragma unroll
            for (int t = 0; t < NT; t++) { /* as silu_mul_kernel on the bf16 products */
              const float gv = __bfloat162float(__float2bfloat16(g[t])), uv = __bfloat162float(__float2bfloat16(acc[t]));
              ((bf16 *)a.out[0])[(size_t)t * U + u] = __float2bfloat16(gv / (1.0f + __expf(-gv)) * uv);
            }
          } else {
            int i = 0;
#pragma unroll
            for (int j = 1; j < BACKEND_MATMUL_N_MAX; j++)
              i += u >= a.row0[j];
            const int row = u - a.row0[i], N = a.N[i];
            const bool has_bias = a.bias[i] != NULL;
            const float bv = gemv_multi_bias(a, i, row);
#pragma unroll
            for (int t = 0; t < NT; t++) {
              if (a.out_f32) {
                ((float *)a.out[i])[(size_t)t * N + row] = acc[t];
              } else if (a.add) { /* as rmsnorm_kernel's residual add */
                bf16 *rp = (bf16 *)a.out[i] + (size_t)t * N + row;
                const float rv = a.epi_early && u == gw ? rpre[t] : __bfloat162float(*rp);
                *rp = __float2bfloat16(__bfloat162float(__float2bfloat16(acc[t])) + rv);
              } else { /* as matmul_n stores it (cuda_qkv_rope.cuh, shared with the bf16 GEMV) */
                ((bf16 *)a.out[i])[(size_t)t * N + row] = gemv_multi_value(acc[t], has_bias, bv);
              }
            }
          }
        }
        r = 0;
        u += G;
      }
#pragma unroll
      for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    }
    slot = slot + 1 == STAGES ? 0 : slot + 1;
    __syncwarp(); /* every lane is done with this slot before it is refilled */
  }
}

/* Cached per instantiation; tensor-parallel ranks (threads, GPUs of one kind) may race to fill it
 * with the same value, hence the atomics. */
template <int QT, int NT, int R, int STAGES, bool ROPE> static int qi_resident_blocks(size_t smem) {
  static int cached = 0;
  int blocks = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (!blocks) {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_i8_kernel<QT, NT, R, STAGES, ROPE>,
                                                  QGEMV_WARPS * 32, smem);
    blocks = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    __atomic_store_n(&cached, blocks, __ATOMIC_RELAXED);
  }
  return blocks;
}

/* Units per resident warp above which the integer-dot kernel's grid is capped at the resident
 * blocks (each warp streaming its units through its ring): QG_STREAM_ROWS, or
 * PAGODA_QGEMV_STREAM_ROWS=n for measuring (1: capped whenever the grid is over one wave). */
static int qi_stream_rows(void) {
  static int n = -1;
  if (n < 0) {
    const char *e = getenv("PAGODA_QGEMV_STREAM_ROWS");
    n = e && atoi(e) > 0 ? atoi(e) : QG_STREAM_ROWS;
  }
  return n;
}

/* The launch of the integer-dot kernel (grid as qgemv_staged_launch: one unit per warp unless
 * that is more than qi_stream_rows() units per resident warp). */
template <int QT, int NT, int R, bool ROPE>
static cudaError_t qi_launch(const struct cuda_backend *cb, const qi_args &a) {
  const int STAGES = QG_STAGES;
  const size_t sm = QI_SMEM_BYTES(QT, STAGES);
  int blocks = (a.units + QGEMV_WARPS - 1) / QGEMV_WARPS, fit = qi_resident_blocks<QT, NT, R, STAGES, ROPE>(sm);
  const char *cap = getenv("PAGODA_QGEMV_BLOCKS");
  if (cap && atoi(cap) > 0) {
    if (blocks > atoi(cap))
      blocks = atoi(cap);
  } else if ((long long)blocks > (long long)qi_stream_rows() * fit) {
    blocks = fit;
  }
  return cuda_pdl_launch(cb, qgemv_i8_kernel<QT, NT, R, STAGES, ROPE>, dim3(blocks), dim3(QGEMV_WARPS * 32), sm, a);
}

template <int QT, int R, bool ROPE = false>
static cudaError_t qi_dispatch_t(const struct cuda_backend *cb, const qi_args &a, int T) {
  switch (T) {
  case 1: return qi_launch<QT, 1, R, ROPE>(cb, a);
  case 2: return qi_launch<QT, 2, R, ROPE>(cb, a);
  case 3: return qi_launch<QT, 3, R, ROPE>(cb, a);
  case 4: return qi_launch<QT, 4, R, ROPE>(cb, a);
  case 5: return qi_launch<QT, 5, R, ROPE>(cb, a);
  case 6: return qi_launch<QT, 6, R, ROPE>(cb, a);
  case 7: return qi_launch<QT, 7, R, ROPE>(cb, a);
  default: return qi_launch<QT, 8, R, ROPE>(cb, a);
  }
}

#define QI_DISPATCH(qt, CALL)                                                                   \
  switch (qt) {                                                                                 \
  case CQ_Q4_0: { const int QT_ = CQ_Q4_0; CALL; } break;                                       \
  case CQ_Q4_1: { const int QT_ = CQ_Q4_1; CALL; } break;                                       \
  case CQ_Q8_0: { const int QT_ = CQ_Q8_0; CALL; } break;                                       \
  case CQ_Q4_K: { const int QT_ = CQ_Q4_K; CALL; } break;                                       \
  case CQ_Q5_K: { const int QT_ = CQ_Q5_K; CALL; } break;                                       \
  case CQ_Q6_K: { const int QT_ = CQ_Q6_K; CALL; } break;                                       \
  default: break;                                                                               \
  }

static int qi_enabled(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("PAGODA_QGEMV_I8");
    on = !(e && *e == '0') && qgemv_kernel_choice() == 1;
  }
  return on;
}

/* ---- The integer-dot ring GEMV: T = 1, one block per multiprocessor (cb->qgemv_ring) ----
 * The integer-dot kernel above gives every row its own warp (a grid of one or more waves of small
 * blocks) and takes x already quantized by a kernel of its own (qx_quantize_kernel, or
 * qx_norm_quantize_kernel with a prenorm), so every matmul of a decode step is two kernel
 * boundaries, each draining the memory pipe: the quantization waits for the GEMV before, and the
 * GEMV's blocks request their first chunks only as they start. This is the bf16 ring GEMV's
 * layout (cuda_gemv.cu, gemv_ring_kernel) on quantized weights: a grid of at most one block per
 * multiprocessor (cb->qgemv_ring_warps warps, 16 by default) takes contiguous units (two rows of
 * a matmul_add, a gate/up pair, a RoPE pair of q/k/v: R = 2 rows sharing each activation load),
 * warp w the units w, w + warps, ...; each warp streams its units' chunks (a.ring_cv values of
 * both rows per slot, 2048 by default) through a ring of a.ring_c slots in shared memory (about
 * cb->gemv_ring_kb KiB per block), the whole ring requested before pdl_wait (weights only,
 * cuda_pdl.cuh). After the wait the block quantizes x itself into shared memory, normalized first
 * with a prenorm: every block repeats qx_quantize8 on the same values (norm_inv replays
 * rmsnorm_kernel's order on the block's warps, as qx_norm_quantize_kernel does on its 32), so
 * xq / xd hold bit for bit what the quantization kernels write, and those kernels are gone: one
 * kernel per matmul, its prologue (x read from L2 with all of a thread's loads in flight, the
 * norm's strided sums from a shared-memory copy) under the ring's loads. Lane l takes the
 * 32-value blocks l, l + 32, ... of each row in order, as the integer-dot kernel does, and
 * reduces by the same shuffles: the same sums, so the same bits. Requires K % 256 == 0
 * (qi_applies) and, for ADD, an even row count.
 * Measured on the H200 at 8B batch 1 (bench/RESULTS.md, session 12): 16 warps of 2048-value
 * chunks beat 8 warps (`--isq 8` 2.87 against 3.05 ms per token; Q4_K_M 2.65 against 3.25) and
 * 1024-value chunks (2.91 / 2.71); against the per-row kernel `--isq 8` gains under 1% (2.87-2.88
 * against 2.88-2.89 ms) and Q4_K_M 3-4% (2.60-2.65 against 2.72). Alone under ncu the Q8_0
 * ring kernels stream at 1.7-3.1 TB/s where the bf16 ring reaches 2.4-4.0: the warps' arithmetic
 * and shared-memory reads (a 34-byte block per lane: two-way bank conflicts), not the ring,
 * set the pace. */
enum { QR_ADD, QR_SILU, QR_QKV };

#define QR_WARPS_MAX 16 /* up to 128 registers a thread */
#define QR_XG 8 /* groups of 8 values of x per thread loaded at once (all in flight together) */
#define QR_NWG 4 /* a prenorm's groups per thread whose norm weights are read before the wait */

/* Shared memory of the ring kernel before the rings: xq (K int8), xd (K / 32 float2), and for a
 * prenorm x itself (K bf16), for norm_inv's strided reads. */
__host__ __device__ static inline size_t qr_xs_bytes(int K, bool pre) {
  return (size_t)K + (size_t)(K / 32) * 8 + (pre ? (size_t)K * 2 : 0);
}

/* qx_quantize8 on the bf16 group U (index G) of x, each value normalized first with PRE, into the
 * ring kernel's layout: block b's first 16 codes at XQ + 16 b, its last 16 at XQ + K / 2 + 16 b
 * (so that a warp's 16-byte loads of 32 consecutive blocks are conflict-free), (d, d * sum) at XD[b]. */
template <bool PRE>
__device__ __forceinline__ void qr_quantize_group(int8_t *xq, float2 *xd, int K, uint4 u, int g, float inv,
                                                  const float *w) {
  const bf16 *xb = (const bf16 *)&u;
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; k++)
    v[k] = PRE ? __bfloat162float(norm_elem(xb[k], inv, w[k])) : __bfloat162float(xb[k]);
  const qx8 r = qx_quantize8_calc(v);
  const int b = g / 4, q = g % 4;
  *(uint2 *)(xq + (q >> 1) * (K / 2) + b * 16 + (q & 1) * 8) = r.q;
  if (q == 0)
    xd[b] = r.d;
}

template <int QT, int MODE, bool PRE>
__global__ void __launch_bounds__(QR_WARPS_MAX * 32, 1) qgemv_ring_kernel(const __grid_constant__ qi_args a) {
  constexpr int R = 2; /* ADD: rows 2u, 2u + 1; SILU: gate and up row u; QKV: RoPE pair u */
  const int QR_WARPS = blockDim.x / 32, NT = blockDim.x;
  extern __shared__ __align__(16) uint8_t qg_smem[];
  __shared__ float part[32]; /* norm_inv's per-warp sums */
  const int CV = a.ring_cv, CB = CV / cq_traits<QT>::QK * cq_traits<QT>::BYTES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K = a.K, C = a.ring_c;
  const size_t rb = a.row_bytes;
  int8_t *xq = (int8_t *)qg_smem;
  float2 *xd = (float2 *)(qg_smem + K); /* K % 256 == 0: aligned */
  uint8_t *ring = qg_smem + qr_xs_bytes(K, PRE) + (size_t)warp * (C * R * CB + QG_SLACK);
  const qg_ring_share sh = qg_ring_share_of(a.units, QR_WARPS, warp);
  const int u0 = sh.u0, nu = sh.nu; /* this warp's units: u0 + warp, u0 + warp + QR_WARPS, ... */
  const int nch = (K + CV - 1) / CV;
  uint64_t pol = 0;
  if (a.evict_first)
    pol = qg_evict_first_policy();
  qg_ring_cursor cur = {0, 0, 0}; /* the issue side */
  const uint8_t *wr[R];
  auto rows_of = [&](int k) { /* wr = the R rows of the warp's unit k */
    const int u = u0 + warp + k * QR_WARPS;
    if constexpr (MODE == QR_ADD) {
      wr[0] = (const uint8_t *)a.W[0] + (size_t)(2 * u) * rb;
      wr[1] = wr[0] + rb;
    } else if constexpr (MODE == QR_SILU) {
      wr[0] = (const uint8_t *)a.W[0] + (size_t)u * rb;
      wr[1] = (const uint8_t *)a.W[1] + (size_t)u * rb;
    } else {
      const qkv_pair p = qkv_rope_pair(a.rope, u);
      wr[0] = (const uint8_t *)a.W[p.i] + (size_t)p.r0 * rb;
      wr[1] = (const uint8_t *)a.W[p.i] + (size_t)p.r1 * rb;
    }
  };
  if (nu > 0)
    rows_of(0);
  auto issue = [&]() { /* the next chunk of the stream into the next slot (a group either way) */
    if (cur.ik < nu) {
      const size_t c0 = (size_t)cur.ic * CB;
      const int nb = (int)(rb - c0 < (size_t)CB ? rb - c0 : (size_t)CB);
      uint8_t *dst = ring + (size_t)cur.is * R * CB;
#pragma unroll
      for (int r = 0; r < R; r++)
        for (int o = lane * 16; o < nb; o += 512)
          qg_cp_async16_hint(dst + r * CB + o, wr[r] + c0 + o, a.evict_first, pol);
      if (cur.next(nch, nu, C))
        rows_of(cur.ik);
    }
    qg_cp_commit();
  };
  for (int i = 0; i < C; i++)
    issue(); /* the whole ring, before the wait: weights never change during a step */
  /* a prenorm's weights for the thread's first QR_NWG groups: constant during a step, so read
   * before the wait (cuda_pdl.cuh), as qx_norm_quantize_kernel does for its first group */
  const int ng = K / 8; /* groups of 8 values; a multiple of 32, so a warp is all in or all out */
  float nw[PRE ? QR_NWG : 1][8];
  if constexpr (PRE) {
#pragma unroll
    for (int j = 0; j < QR_NWG; j++)
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const int g = (int)threadIdx.x + j * NT;
        nw[j][k] = g < ng ? norm_weight_at(a.norm_w, a.norm_w_f32, (size_t)g * 8 + k) : 0.0f;
      }
  }
  pdl_wait(); /* x (and the residual) are written by the kernels before */
  bool trig = !a.ring_late || cur.ik == nu; /* as gemv_ring_kernel: by default once the last chunk is in flight */
  if (trig)
    pdl_trigger();
  /* x quantized into shared memory as qx_quantize_kernel / qx_norm_quantize_kernel do: QR_XG
   * groups per thread loaded at once, then quantized (no prenorm) or stored for the norm */
  uint4 *xs = (uint4 *)(qg_smem + qr_xs_bytes(K, false)); /* PRE: x (K bf16) */
  for (int g0 = threadIdx.x; g0 < ng; g0 += QR_XG * NT) {
    uint4 u[QR_XG];
#pragma unroll
    for (int j = 0; j < QR_XG; j++)
      if (g0 + j * NT < ng)
        u[j] = __ldg((const uint4 *)a.x + g0 + j * NT);
#pragma unroll
    for (int j = 0; j < QR_XG; j++)
      if (g0 + j * NT < ng) {
        if constexpr (PRE)
          xs[g0 + j * NT] = u[j];
        else
          qr_quantize_group<false>(xq, xd, K, u[j], g0 + j * NT, 0.0f, nullptr);
      }
  }
  if constexpr (PRE) {
    __syncthreads();
    const bf16 *xsb = (const bf16 *)xs; /* rmsnorm_kernel's order, replayed on the block's warps */
    const float inv = QR_WARPS == 8 ? norm_inv<8>(xsb, K, a.norm_eps, part) : norm_inv<16>(xsb, K, a.norm_eps, part);
#pragma unroll
    for (int j = 0; j < QR_NWG; j++)
      if ((int)threadIdx.x + j * NT < ng)
        qr_quantize_group<true>(xq, xd, K, xs[threadIdx.x + j * NT], threadIdx.x + j * NT, inv, nw[j]);
    for (int g = threadIdx.x + QR_NWG * NT; g < ng; g += NT) {
      float w[8];
#pragma unroll
      for (int k = 0; k < 8; k++)
        w[k] = norm_weight_at(a.norm_w, a.norm_w_f32, (size_t)g * 8 + k);
      qr_quantize_group<true>(xq, xd, K, xs[g], g, inv, w);
    }
  }
  __syncthreads();
  float acc[R];
  int slot = 0;
  for (int qk = 0; qk < nu; qk++) {
#pragma unroll
    for (int r = 0; r < R; r++)
      acc[r] = 0.0f;
    for (int c = 0; c < nch; c++) {
      qg_cp_wait_ring(C); /* this lane's copies of the chunk have landed */
      __syncwarp();       /* ... and every lane's */
      const uint8_t *ch = ring + (size_t)slot * R * CB;
      const int v0 = c * CV, nv = K - v0 < CV ? K - v0 : CV;
#pragma unroll
      for (int s = 0; s < 2; s++) {
        const int e = s * 1024 + lane * 32;
        if (e < nv) { /* nv is a multiple of 256: a lane's 32 values are all in or all out */
          const int b = (v0 + e) / 32;
          const qi_x xv = {*(const int4 *)(xq + b * 16), *(const int4 *)(xq + K / 2 + b * 16), xd[b]};
#pragma unroll
          for (int r = 0; r < R; r++)
            qi_dot<QT>(qi_weights<QT>(ch + r * CB, e), xv, acc[r]);
        }
      }
      __syncwarp(); /* every lane is done with the slot before it is refilled */
      slot = slot + 1 == C ? 0 : slot + 1;
      issue(); /* C chunks on, into the slot just read */
      if (!trig && cur.ik == nu) {
        pdl_trigger();
        trig = true;
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
      for (int o = 16; o > 0; o >>= 1)
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    const int u = u0 + warp + qk * QR_WARPS;
    if constexpr (MODE == QR_ADD) { /* as rmsnorm_kernel's residual add (the integer-dot kernel's ADD) */
      if (lane < 2) {
        bf16 *rp = (bf16 *)a.out[0] + 2 * u + lane;
        const float v = lane ? acc[1] : acc[0];
        *rp = __float2bfloat16(__bfloat162float(__float2bfloat16(v)) + __bfloat162float(*rp));
      }
    } else if constexpr (MODE == QR_SILU) { /* as silu_mul_kernel on the bf16 products */
      if (lane == 0) {
        const float gv = __bfloat162float(__float2bfloat16(acc[0])), uv = __bfloat162float(__float2bfloat16(acc[1]));
        ((bf16 *)a.out[0])[u] = __float2bfloat16(gv / (1.0f + __expf(-gv)) * uv);
      }
    } else {
      float pair[2][1] = {{acc[0]}, {acc[1]}};
      qkv_rope_store<1>(a, a.rope, qkv_rope_pair(a.rope, u), pair, lane);
    }
  }
}

/* The ring kernel's shape for type QT: warps per block (cb->qgemv_ring_warps), values per chunk
 * (cb->qgemv_ring_cv; 2048 for Q6_K, whose 1024 values take 840 bytes, not whole 16-byte
 * units), chunks per warp's ring (about cb->gemv_ring_kb KiB per block, rounded, but 2..8 chunks,
 * so more than that for small sizes: 32 KiB gives 136 KiB of Q8_0 at 16 warps) and the
 * dynamic shared memory for rows of K values (PRE: a prenorm). */
struct qr_shape {
  int warps, cv, c;
  size_t smem;
};
template <int QT> static qr_shape qr_shape_of(const struct cuda_backend *cb, int K, bool pre) {
  qr_shape q;
  q.warps = cb->qgemv_ring_warps;
  q.cv = QT == CQ_Q6_K ? 2048 : cb->qgemv_ring_cv;
  const int slot = 2 * (q.cv / cq_traits<QT>::QK * cq_traits<QT>::BYTES);
  const int C = (cb->gemv_ring_kb * 1024 + q.warps * slot / 2) / (q.warps * slot);
  q.c = C < 2 ? 2 : C > 8 ? 8 : C;
  q.smem = qr_xs_bytes(K, pre) + (size_t)q.warps * (q.c * slot + QG_SLACK);
  return q;
}

/* Whether the ring kernel takes T rows of K values of type QT (the caller has checked qi_applies:
 * K % 256 == 0, whole 16-byte rows, aligned weights): cb->qgemv_ring, T = 1, ADD_ROWS even
 * (matmul_add; -1 for the other forms) and x plus the rings within cb->smem_optin. */
static int qr_ok(const struct cuda_backend *cb, int qt, int T, int K, long long add_rows, bool pre) {
  size_t smem = 0;
  if (!cb->qgemv_ring || T != 1 || (add_rows >= 0 && add_rows % 2 != 0))
    return 0;
  QI_DISPATCH(qt, (smem = qr_shape_of<QT_>(cb, K, pre).smem))
  return smem > 0 && smem <= (size_t)cb->smem_optin;
}

template <int QT, int MODE, bool PRE> static cudaError_t qr_launch(struct cuda_backend *cb, qi_args a) {
  static unsigned long long opted = 0; /* bit d: device d has the shared-memory attribute */
  const qr_shape q = qr_shape_of<QT>(cb, a.K, PRE);
  auto fn = qgemv_ring_kernel<QT, MODE, PRE>;
  a.ring_c = q.c;
  a.ring_cv = q.cv;
  a.ring_late = cb->gemv_ring_late;
  const int sms = cuda_sm_count(cb);
  if (sms < 1)
    return cudaErrorInvalidDevice;
  const unsigned blocks = (unsigned)(a.units < sms ? a.units : sms); /* units split evenly over them */
  const cudaError_t e = cuda_smem_opt_in(cb, (const void *)fn, &opted);
  if (e != cudaSuccess)
    return e;
  return cuda_pdl_launch(cb, fn, dim3(blocks), dim3(q.warps * 32), q.smem, a);
}

/* The ring kernel for A (units, W, out, rope, row_bytes set) on x (bf16, T = 1) with PRE (or NULL). */
template <int MODE>
static int qr_run(struct cuda_backend *cb, int qt, qi_args &a, const void *x, const struct backend_prenorm *pre,
                  int K) {
  a.x = (const bf16 *)x;
  a.K = K;
  a.evict_first = cb->qg_evict_first;
  if (pre) {
    a.norm_w = pre->w->data;
    a.norm_w_f32 = pre->w->dtype == DTYPE_F32;
    a.norm_eps = pre->eps;
  }
  cudaError_t err = cudaErrorInvalidValue;
  if (pre)
    QI_DISPATCH(qt, (err = qr_launch<QT_, MODE, MODE != QR_ADD>(cb, a)))
  else
    QI_DISPATCH(qt, (err = qr_launch<QT_, MODE, false>(cb, a)))
  CUDA_CHECK(err);
  return 0;
}

/* Whether the integer-dot kernel takes weights of type QT with K columns at WDATA: a staged
 * layout (rows of whole 16-byte units, K a multiple of 256, 16-byte-aligned data) and a
 * scratch large enough for one pass of quantized activations. */
static int qi_applies(struct cuda_backend *cb, int qt, int64_t K, const void *wdata) {
  return qi_enabled() && qi_supported(qt) && cuda_quant_row_bytes(qt, K) % 16 == 0 && K % 256 == 0 &&
         K <= INT32_MAX / CUDA_QGEMV_MAX_T && (uintptr_t)wdata % 16 == 0 && cb->deq_scratch &&
         cb->deq_scratch_bytes >= cuda_quant_x8_bytes(CUDA_QGEMV_MAX_T, K);
}

/* Quantizes T <= CUDA_QGEMV_MAX_T rows of x into the scratch, first normalized as struct
 * backend_prenorm says when PRE is not NULL (qx_norm_quantize_kernel; checked by qi_prenorm_ok);
 * fills a's xq / xd / K, and its evict_first (every launch of the integer-dot kernel passes here). */
static int qx_quantize(struct cuda_backend *cb, qi_args *a, const void *x, const struct backend_prenorm *pre, int T,
                       int K) {
  int8_t *xq = (int8_t *)cb->deq_scratch;
  float2 *xd = (float2 *)(xq + (size_t)T * K);
  if (pre) {
    CUDA_CHECK(cuda_pdl_launch(cb, qx_norm_quantize_kernel<QX_NORM_WARPS>, dim3(T), dim3(QX_NORM_WARPS * 32), 0, xq,
                               xd, (const bf16 *)x, (const void *)pre->w->data, (int)(pre->w->dtype == DTYPE_F32), K,
                               pre->eps, cb->qx_early));
  } else {
    const int n8 = T * K / 8, threads = 256;
    CUDA_CHECK(cuda_pdl_launch(cb, qx_quantize_kernel, dim3((n8 + threads - 1) / threads), dim3(threads), 0, xq, xd,
                               (const bf16 *)x, n8, cb->qx_early));
  }
  a->xq = xq;
  a->evict_first = cb->qg_evict_first;
  a->xd = xd;
  a->K = K;
  return 0;
}

/* What one launch of the integer-dot kernel computes (qi_args): the rows of matrices (the kernel's
 * R = 1), gate / up pairs into silu(g) * u (R = 2), or pairs of q/k/v rows with RoPE and the KV
 * write (R = 2 with ROPE). */
enum qi_form { QI_ROWS, QI_GATE_UP, QI_QKV_ROPE };

/* One launch of the integer-dot kernel for A in FORM at T rows. */
static int qi_run(struct cuda_backend *cb, int qt, const qi_args &a, enum qi_form form, int T) {
  cudaError_t err = cudaErrorInvalidValue; /* a type without the kernel: qi_applies said no */
  if (form == QI_QKV_ROPE)
    QI_DISPATCH(qt, (err = qi_dispatch_t<QT_, 2, true>(cb, a, T)))
  else if (form == QI_GATE_UP)
    QI_DISPATCH(qt, (err = qi_dispatch_t<QT_, 2>(cb, a, T)))
  else
    QI_DISPATCH(qt, (err = qi_dispatch_t<QT_, 1>(cb, a, T)))
  CUDA_CHECK(err);
  return 0;
}

/* One pass (T <= CUDA_QGEMV_MAX_T) of the plain matmul through the integer-dot kernel: out = x @
 * w^T, or with ADD (bf16 out) out += x @ w^T as matmul_add (see qi_args). */
static int qi_gemv_pass(struct cuda_backend *cb, int qt, void *out, const void *x, const struct weight *w, int T,
                        int out_f32, int add) {
  qi_args a;
  memset(&a, 0, sizeof a);
  if (qx_quantize(cb, &a, x, NULL, T, (int)w->cols) != 0)
    return -1;
  a.W[0] = w->data;
  a.out[0] = out;
  a.N[0] = (int)w->rows;
  for (int i = 1; i <= BACKEND_MATMUL_N_MAX; i++)
    a.row0[i] = (int)w->rows;
  a.units = (int)w->rows;
  a.out_f32 = out_f32;
  a.add = add;
  a.epi_early = add && cb->epi_early;
  a.row_bytes = cuda_quant_row_bytes(qt, w->cols);
  return qi_run(cb, qt, a, QI_ROWS, T);
}

/* Fused forms on quantized weights (backend.h, "Fused small ops"; the bf16 ones are in
 * cuda_gemv.cu, which calls these first): 1 when they do not apply (mixed types or K, T over
 * the GEMV's, a type or layout without the integer-dot kernel), then the caller goes on. */
int cuda_quant_fusable(struct cuda_backend *cb, const struct weight *const *ws, int n, int T) {
  int qt = cuda_quant_type(ws[0]->dtype);
  if (!cb->fused_ops || T < 1 || T > cb->qgemv_max_t || T > CUDA_QGEMV_MAX_T || qt < 0 ||
      !qi_applies(cb, qt, ws[0]->cols, ws[0]->data))
    return 0;
  for (int i = 1; i < n; i++)
    if (ws[i]->dtype != ws[0]->dtype || ws[i]->cols != ws[0]->cols || !qi_applies(cb, qt, ws[i]->cols, ws[i]->data))
      return 0;
  return 1;
}

/* Whether the x quantization takes PRE for rows of K values (qx_norm_quantize_kernel): an f32 or
 * bf16 norm weight (the two rmsnorm_kernel reads); 0: the caller's rmsnorm first. -1 with the
 * error set when the weight's size is not K, which rmsnorm would refuse too. */
static int qi_prenorm_ok(const struct cuda_backend *cb, const struct backend_prenorm *pre, int64_t K) {
  if (!pre)
    return 1;
  if (!cb->fused_norm) /* PAGODA_FUSED_NORM=0 (cuda_backend.h) */
    return 0;
  if (pre->w->rows * pre->w->cols != K)
    return ERR("cuda matmul prenorm: norm weight has %lld elements, the matrices %lld columns",
               (long long)(pre->w->rows * pre->w->cols), (long long)K);
  return pre->w->dtype == DTYPE_F32 || pre->w->dtype == DTYPE_BF16;
}

/* A (zeroed here) for the N matrices WS of one quantized type with their BIASES at T rows: 0
 * ready, *ROWS the matrices' total rows; 1 when the integer-dot GEMV does not take them (nothing
 * enqueued); -1 with the error set. x is not quantized yet. For matmul_n and matmul_qkv_rope. */
static int qi_set_prepare(struct cuda_backend *cb, qi_args *a, int n, void *const outs[],
                          const struct backend_prenorm *pre, const struct weight *const ws[],
                          const struct weight *const biases[], int T, long long *rows) {
  if (cb->base.act_dtype != DTYPE_BF16 || !cuda_quant_fusable(cb, ws, n, T))
    return 1;
  int ok = qi_prenorm_ok(cb, pre, ws[0]->cols);
  if (ok <= 0)
    return ok < 0 ? -1 : 1;
  memset(a, 0, sizeof *a);
  *rows = cuda_matmul_set_fill(a, n, outs, ws, biases, INT32_MAX - 2 * QGEMV_WARPS);
  if (*rows <= 0)
    return *rows < 0 ? -1 : 1;
  a->row_bytes = cuda_quant_row_bytes(cuda_quant_type(ws[0]->dtype), ws[0]->cols);
  return 0;
}

int cuda_quant_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                        const struct weight *const ws[], const struct weight *const biases[], int T) {
  struct cuda_backend *cb = cuda_be(be);
  qi_args a;
  long long rows = 0;
  int rc = qi_set_prepare(cb, &a, n, outs, pre, ws, biases, T, &rows);
  if (rc != 0)
    return rc;
  if (qx_quantize(cb, &a, x, pre, T, (int)ws[0]->cols) != 0)
    return -1;
  a.units = (int)rows;
  return qi_run(cb, cuda_quant_type(ws[0]->dtype), a, QI_ROWS, T);
}

int cuda_quant_matmul_silu_mul(struct backend *be, void *out, const void *x, const struct backend_prenorm *pre,
                               const struct weight *gate, const struct weight *up, int T) {
  struct cuda_backend *cb = cuda_be(be);
  const struct weight *ws[2] = {gate, up};
  if (gate->rows != up->rows)
    return ERR("cuda matmul_silu_mul: gate has %lld rows, up %lld", (long long)gate->rows, (long long)up->rows);
  if (be->act_dtype != DTYPE_BF16 || !cb->fused_silu || gate->rows > INT32_MAX || !cuda_quant_fusable(cb, ws, 2, T))
    return 1;
  int ok = qi_prenorm_ok(cb, pre, gate->cols);
  if (ok <= 0)
    return ok < 0 ? -1 : 1;
  qi_args a;
  memset(&a, 0, sizeof a);
  a.W[0] = gate->data;
  a.W[1] = up->data;
  a.out[0] = out;
  a.units = (int)gate->rows;
  int qt = cuda_quant_type(gate->dtype);
  a.row_bytes = cuda_quant_row_bytes(qt, gate->cols);
  if (qr_ok(cb, qt, T, (int)gate->cols, -1, pre != NULL))
    return qr_run<QR_SILU>(cb, qt, a, x, pre, (int)gate->cols);
  if (qx_quantize(cb, &a, x, pre, T, (int)gate->cols) != 0)
    return -1;
  return qi_run(cb, qt, a, QI_GATE_UP, T);
}

int cuda_quant_matmul_qkv_rope(struct backend *be, void *const outs[3], const void *x, const struct backend_prenorm *pre,
                               const struct weight *const ws[3], const struct weight *const biases[3],
                               const struct gemv_rope *r, int T) {
  struct cuda_backend *cb = cuda_be(be);
  qi_args a;
  long long rows = 0;
  int rc = qi_set_prepare(cb, &a, 3, outs, pre, ws, biases, T, &rows);
  if (rc != 0)
    return rc;
  a.units = (int)(rows / 2); /* r->pq + 2 * r->pk pairs */
  a.rope = *r;
  const int qt = cuda_quant_type(ws[0]->dtype), K = (int)ws[0]->cols;
  if (qr_ok(cb, qt, T, K, -1, pre != NULL))
    return qr_run<QR_QKV>(cb, qt, a, x, pre, K);
  if (qx_quantize(cb, &a, x, pre, T, K) != 0)
    return -1;
  return qi_run(cb, qt, a, QI_QKV_ROPE, T);
}

int cuda_quant_matmul_add(struct backend *be, void *resid, const void *x, const struct weight *w, int T) {
  struct cuda_backend *cb = cuda_be(be);
  const struct weight *ws[1] = {w};
  if (be->act_dtype != DTYPE_BF16 || !cb->fused_norm || w->rows > INT32_MAX - QGEMV_WARPS ||
      !cuda_quant_fusable(cb, ws, 1, T))
    return 1;
  const int qt = cuda_quant_type(w->dtype), K = (int)w->cols;
  if (qr_ok(cb, qt, T, K, w->rows, false)) {
    qi_args a;
    memset(&a, 0, sizeof a);
    a.W[0] = w->data;
    a.out[0] = resid;
    a.N[0] = (int)w->rows;
    a.units = (int)(w->rows / 2);
    a.row_bytes = cuda_quant_row_bytes(qt, w->cols);
    return qr_run<QR_ADD>(cb, qt, a, x, NULL, K);
  }
  return qi_gemv_pass(cb, cuda_quant_type(w->dtype), resid, x, w, T, 0, 1) != 0 ? -1 : 0;
}

/* out(T, N) = x(T, K) @ W^T for T rows, in passes of at most CUDA_QGEMV_MAX_T rows (each pass
 * reads the weight once): the integer-dot kernel where qi_applies, else the bf16-activation ones. */
int cuda_quant_gemv(struct backend *be, void *out, const void *x, const struct weight *w, int T,
                    int out_f32) {
  int qt = cuda_quant_type(w->dtype);
  if (qt < 0)
    return ERR("cuda quantized matmul: weight dtype %s is not a quantized type", dtype_name(w->dtype));
  struct cuda_backend *cb = cuda_be(be);
  size_t row_bytes = cuda_quant_row_bytes(qt, w->cols);
  size_t osz = out_f32 ? 4 : 2;
  const int i8 = qi_applies(cb, qt, w->cols, w->data);
  for (int t0 = 0; t0 < T; t0 += CUDA_QGEMV_MAX_T) {
    int nt = T - t0 < CUDA_QGEMV_MAX_T ? T - t0 : CUDA_QGEMV_MAX_T;
    void *o = (char *)out + (size_t)t0 * w->rows * osz;
    const bf16 *xs = (const bf16 *)x + (size_t)t0 * w->cols;
    if (i8) {
      if (qi_gemv_pass(cb, qt, o, xs, w, nt, out_f32, 0) != 0)
        return -1;
      continue;
    }
    cudaError_t err = cudaErrorInvalidValue;
    CQ_DISPATCH(qt, (err = qgemv_dispatch_t<QT_>(cb, o, out_f32, w, row_bytes, xs, nt)));
    CUDA_CHECK(err);
  }
  return 0;
}

/* ---- embedding of a quantized table: out(T, dim) = dequant(emb[ids[t]]); ids outside
 * [0, vocab) give a zero row. One block per token, 8 values per thread. ---- */
template <int QT>
__global__ void qembed_kernel(bf16 *out, const uint8_t *emb, size_t row_bytes, int64_t vocab,
                              const int32_t *ids, int dim) {
  PDL_ENTER(); /* ids (and out) belong to the step (cuda_pdl.cuh) */
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
  cudaError_t err = cudaErrorInvalidValue;
  CQ_DISPATCH(qt, (err = cuda_pdl_launch(cuda_be(be), qembed_kernel<QT_>, dim3(T), dim3(128), 0, (bf16 *)out,
                                         (const uint8_t *)emb->data, row_bytes, emb->rows, ids, (int)emb->cols)));
  CUDA_CHECK(err);
  return 0;
}

CUDA_PRELOAD_ANCHOR(quant_gemv)
