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
 * Activations stay bf16 (not quantized to 8 bits as llama.cpp's MMVQ does): no quantization
 * pass and no rounding. Measured and rejected (bench/RESULTS.md, "CUDA quantized matmul"): two
 * weight rows per warp sharing each activation load was 10-50% slower at every shape, T <= 8. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_quant.cuh"

#include <stdlib.h>

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

template <int QT> struct qg_chunk {
  static const int BYTES = QG_CHUNK / cq_traits<QT>::QK * cq_traits<QT>::BYTES; /* multiple of 16 */
};

__device__ __forceinline__ void qg_cp_async16(void *smem, const void *gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void qg_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void qg_cp_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

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
    QG_ISSUE();
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
static void qgemv_staged_launch(cudaStream_t st, void *out, int out_f32, const uint8_t *W, size_t row_bytes,
                                const bf16 *x, int N, int K) {
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
  qgemv_staged_kernel<QT, NT, STAGES><<<blocks, QGEMV_WARPS * 32, sm, st>>>(out, out_f32, W, row_bytes, x, N, K);
}

template <int QT, int NT>
static void qgemv_launch(cudaStream_t st, void *out, int out_f32, const struct weight *w,
                         size_t row_bytes, const bf16 *x) {
  int N = (int)w->rows, K = (int)w->cols;
  const uint8_t *W = (const uint8_t *)w->data;
  int kc = qgemv_kernel_choice();
  if (kc != 0 && row_bytes % 16 == 0 && K % 256 == 0 && (uintptr_t)W % 16 == 0) {
    qgemv_staged_launch<QT, NT, QG_STAGES>(st, out, out_f32, W, row_bytes, x, N, K);
    return;
  }
  dim3 grid((N + QGEMV_WARPS - 1) / QGEMV_WARPS);
  qgemv_kernel<QT, NT><<<grid, QGEMV_WARPS * 32, 0, st>>>(out, out_f32, W, row_bytes, x, N, K);
}

template <int QT>
static void qgemv_dispatch_t(cudaStream_t st, void *out, int out_f32, const struct weight *w,
                             size_t row_bytes, const bf16 *x, int T) {
  switch (T) {
  case 1: qgemv_launch<QT, 1>(st, out, out_f32, w, row_bytes, x); break;
  case 2: qgemv_launch<QT, 2>(st, out, out_f32, w, row_bytes, x); break;
  case 3: qgemv_launch<QT, 3>(st, out, out_f32, w, row_bytes, x); break;
  case 4: qgemv_launch<QT, 4>(st, out, out_f32, w, row_bytes, x); break;
  case 5: qgemv_launch<QT, 5>(st, out, out_f32, w, row_bytes, x); break;
  case 6: qgemv_launch<QT, 6>(st, out, out_f32, w, row_bytes, x); break;
  case 7: qgemv_launch<QT, 7>(st, out, out_f32, w, row_bytes, x); break;
  default: qgemv_launch<QT, 8>(st, out, out_f32, w, row_bytes, x); break;
  }
}

/* out(T, N) = x(T, K) @ W^T for T rows, in passes of at most CUDA_QGEMV_MAX_T rows (each pass
 * reads the weight once). */
int cuda_quant_gemv(struct backend *be, void *out, const void *x, const struct weight *w, int T,
                    int out_f32) {
  int qt = cuda_quant_type(w->dtype);
  if (qt < 0)
    return ERR("cuda quantized matmul: weight dtype %s is not a quantized type", dtype_name(w->dtype));
  cudaStream_t st = cuda_be(be)->stream;
  size_t row_bytes = cuda_quant_row_bytes(qt, w->cols);
  size_t osz = out_f32 ? 4 : 2;
  for (int t0 = 0; t0 < T; t0 += CUDA_QGEMV_MAX_T) {
    int nt = T - t0 < CUDA_QGEMV_MAX_T ? T - t0 : CUDA_QGEMV_MAX_T;
    void *o = (char *)out + (size_t)t0 * w->rows * osz;
    const bf16 *xs = (const bf16 *)x + (size_t)t0 * w->cols;
    CQ_DISPATCH(qt, qgemv_dispatch_t<QT_>(st, o, out_f32, w, row_bytes, xs, nt));
    CUDA_LAUNCH_CHECK();
  }
  return 0;
}

/* ---- embedding of a quantized table: out(T, dim) = dequant(emb[ids[t]]); ids outside
 * [0, vocab) give a zero row. One block per token, 8 values per thread. ---- */
template <int QT>
__global__ void qembed_kernel(bf16 *out, const uint8_t *emb, size_t row_bytes, int64_t vocab,
                              const int32_t *ids, int dim) {
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
  cudaStream_t st = cuda_be(be)->stream;
  CQ_DISPATCH(qt, (qembed_kernel<QT_><<<T, 128, 0, st>>>((bf16 *)out, (const uint8_t *)emb->data,
                                                         row_bytes, emb->rows, ids, (int)emb->cols)));
  CUDA_LAUNCH_CHECK();
  return 0;
}
