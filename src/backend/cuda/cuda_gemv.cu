/* cuda_gemv.cu - decode-sized bf16 matmuls: out(T, N) = x(T, K) @ W(N, K)^T for T up to
 * CUDA_GEMV_MAX_T rows, reading every weight byte once per call at close to the memory
 * bandwidth, where cuBLAS's GEMM kernels (tiled for large T) leave most of it unused.
 *
 * One warp per output feature (weight row): lane l multiplies the 8 columns [e + 8 l, +8) of
 * the row (one 16-byte load) with the same columns of each of the T activation rows, a warp
 * step covering 256 columns; the loop issues four steps' weight loads before using them, so
 * each warp keeps 4 x 512 bytes in flight (8 was measured with PDL: slower on both shapes, the
 * registers costing more occupancy than the loads gain; bench/RESULTS.md, "Programmatic dependent
 * launch"). The first four steps are loaded into registers before pdl_wait() (cuda_pdl.cuh;
 * PAGODA_GEMV_REG=0 prefetches them into L2 instead: gemv_rows).
 * Sums are f32 (fma), reduced over the warp by shuffles. K must be a multiple of 8 (16-byte
 * rows); callers fall back to cuBLAS otherwise.
 *
 * Fused forms (backend.h, "Fused small ops"): matmul_n runs one grid over the rows of several
 * matrices that read the same x (q/k/v with their biases, gate/up), and matmul_silu_mul gives
 * each warp a gate row and its up row and writes silu(g) * u, so the (T, F) products never go
 * to memory. Both round like the separate ops (the product to bf16, then + bias to bf16; g and
 * u to bf16 before silu_mul's f32 arithmetic), so they equal them up to summation order.
 *
 * The residual stream's forms (blocks.c, struct block_res): with a struct backend_prenorm both
 * normalize x themselves in a prologue (gemv_prenorm, below: rmsnorm_kernel's arithmetic bit for
 * bit, into shared memory), and matmul_add adds its product into the residual stream in the
 * epilogue (gemv_kernel<NT, true>), so the add + rmsnorm launch between the sub-blocks goes.
 *
 * matmul_qkv_rope (gemv_qkv_rope_kernel, below) is matmul_n over q/k/v with each warp taking the two
 * rows of a RoPE pair, whose epilogue rotates them and writes k and v into the paged cache too, so
 * the rope_kv_write launch goes (with or without the prologue). */
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_quant.cuh" /* cq_bf16x8_f32, shared with the quantized GEMV */
#include "backend/cuda/cuda_qkv_rope.cuh" /* gemv_rope, qkv_rope_pair, qkv_rope_store: shared with the quantized GEMV */
#include "backend/cuda/cuda_rope.cuh"  /* rope_sincos, rope_rotate, kv_store, shared with rope_kv_write */

typedef __nv_bfloat16 bf16;

#define GEMV_WARPS 4 /* rows per block */
#define GEMV_OUT_F32 1 /* gemv_kernel's flags */
#define GEMV_REG 2
#define GEMV_EPI_EARLY 4 /* ADD: the residual read right after the wait (cb->epi_early) */

/* One weight step: acc[t] += the dot product of the 8 weights WU with columns [e, e + 8) of x's
 * row t. SX: x is the block's normalized copy in shared memory (the prenorm kernels), else the
 * activations in global memory, read through the read-only cache. */
template <int NT, bool SX = false>
__device__ __forceinline__ void gemv_step(uint4 wu, const bf16 *x, int K, int e, float *acc) {
  float wv[8];
  cq_bf16x8_f32(wu, wv);
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float xv[8];
    const uint4 *xp = (const uint4 *)(x + (size_t)t * K + e);
    cq_bf16x8_f32(SX ? *xp : __ldg(xp), xv);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
      s = fmaf(wv[i], xv[i], s);
    acc[t] += s;
  }
}

__device__ __forceinline__ float warp_total(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Asks L2 for the 128-byte line holding P, without waiting for it or holding a register. */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* ---- The summation order, the same for every form and every split of a row ----
 * K's columns fall into GEMV_SEGS segments of gemv_seg_len(K) columns (a multiple of 1024, so
 * whole groups of four steps; the last segments may be short or empty). Lane l's sum over a
 * segment adds its steps (columns s0 + 8 l + 256 i) in column order from zero, each step a fresh
 * fma chain (gemv_step); the lane's total is its segments' sums added in segment order,
 * ((p0 + p1) + p2) + p3; the warp's xor tree then adds the lanes. A warp that takes a whole row
 * does just that (gemv_loop); a split row (gemv_kernel with S warps per row, for matrices of too
 * few rows to fill the GPU) has each warp sum some segments and keep each segment's lane sums
 * apart, in shared memory, and one warp then adds them in the same order. So every form and every
 * split gives the same bits, and which one runs is free to follow the shape. */
#define GEMV_SEGS 4
__host__ __device__ __forceinline__ int gemv_seg_len(int K) { return (K + GEMV_SEGS * 1024 - 1) / (GEMV_SEGS * 1024) * 1024; }

/* Onto acc[r][t]: lane E's steps of R rows from column E to END (exclusive), in column order,
 * four steps' loads first. SX as gemv_step. */
template <int NT, int R, bool SX>
__device__ __forceinline__ void gemv_steps(const bf16 *const *wr, const bf16 *x, int K, int e, int end,
                                           float (*acc)[NT]) {
  for (; e + 768 < end; e += 1024) { /* four steps, loads first */
    uint4 w[R][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int j = 0; j < 4; j++)
        w[r][j] = __ldg((const uint4 *)(wr[r] + e + 256 * j));
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int j = 0; j < 4; j++)
        gemv_step<NT, SX>(w[r][j], x, K, e + 256 * j, acc[r]);
  }
  for (; e < end; e += 256)
#pragma unroll
    for (int r = 0; r < R; r++)
      gemv_step<NT, SX>(__ldg((const uint4 *)(wr[r] + e)), x, K, e, acc[r]);
}

/* A whole row's totals in the order above, into acc[r][t] on every lane (the xor tree adds the
 * same pairs on every lane). E = lane * 8 + C0, C0 a multiple of 256 within segment 0 (0, or 1024
 * after the prenorm kernels' first four steps), and acc holds the lane's sums of segment 0's
 * steps before C0 (zeros for C0 = 0). SX as gemv_step. */
template <int NT, int R, bool SX>
__device__ __forceinline__ void gemv_loop(const bf16 *const *wr, const bf16 *x, int K, int e, float (*acc)[NT]) {
  const int L = gemv_seg_len(K), off = e & 255;
  float run[R][NT];
  gemv_steps<NT, R, SX>(wr, x, K, e, L < K ? L : K, acc);
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      run[r][t] = acc[r][t];
  for (int s0 = L; s0 < K; s0 += L) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int t = 0; t < NT; t++)
        acc[r][t] = 0.0f;
    gemv_steps<NT, R, SX>(wr, x, K, s0 + off, s0 + L < K ? s0 + L : K, acc);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int t = 0; t < NT; t++)
        run[r][t] += acc[r][t];
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      acc[r][t] = warp_total(run[r][t]);
}

/* Lane E's first four steps of R rows WR[r] (columns E + 256 j < END) into W0[r][j] (zeros past
 * END): issued before pdl_wait, so the loads are in flight while the kernel waits for the one
 * before it (weights never change during a step, cuda_pdl.cuh). */
template <int R>
__device__ __forceinline__ void gemv_first4_load(const bf16 *const *wr, int e, int end, bool valid, uint4 (*w0)[4]) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      w0[r][j] = valid && e + 256 * j < end ? __ldg((const uint4 *)(wr[r] + e + 256 * j)) : make_uint4(0, 0, 0, 0);
}

/* gemv_first4_load's steps prefetched into L2 instead (no registers held across the wait). */
template <int R>
__device__ __forceinline__ void gemv_first4_prefetch(const bf16 *const *wr, int e, int end, bool valid) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (valid && e + 256 * j < end)
        prefetch_l2(wr[r] + e + 256 * j);
}

/* Onto acc[r][t]: the steps of W0 (gemv_first4_load) in column order, those before END. SX as gemv_step. */
template <int NT, int R, bool SX>
__device__ __forceinline__ void gemv_first4_steps(const uint4 (*w0)[4], const bf16 *x, int K, int e, int end,
                                                  float (*acc)[NT]) {
#pragma unroll
  for (int j = 0; j < 4; j++)
    if (e + 256 * j < end)
#pragma unroll
      for (int r = 0; r < R; r++)
        gemv_step<NT, SX>(w0[r][j], x, K, e + 256 * j, acc[r]);
}

/* matmul_add's residual for lane t (token t < NT) of one row: RES points at token 0's element,
 * STRIDE apart. Loaded right after the wait, so its L2 round trip overlaps the products instead of
 * following the reduction. */
template <int NT>
__device__ __forceinline__ void gemv_res_load(const bf16 *res, int stride, int lane, float *v) {
#pragma unroll
  for (int t = 0; t < NT; t++)
    v[t] = lane == t ? __bfloat162float(res[(size_t)t * stride]) : 0.0f;
}

/* What a GEMV does right after its wait besides the products (gemv_rows' AFTER): nothing, or a
 * lambda starting the epilogue's reads of batch data (cb->epi_early). */
struct gemv_after_none {
  __device__ __forceinline__ void operator()() const {}
};

/* The dot products of R weight rows WR[r] with the T activation rows of x into acc[r][t], summed
 * over the warp (gemv_loop: every lane holds the totals). Four steps' loads per row go out first.
 * Before pdl_wait() the rows' first four steps are requested (the weights never change during a
 * step, cuda_pdl.cuh), so the matrix starts streaming while the kernel before this one drains:
 * REG (cb->gemv_reg, PAGODA_GEMV_REG) loads them into registers, which stay live across the wait,
 * as the prenorm kernels do; else they are prefetched into L2 (no registers held: the depth-8
 * form that held eight steps measured slower, bench/RESULTS.md, "Programmatic dependent launch").
 * The trigger comes after the wait: the next kernel's blocks may launch (and prefetch) while this
 * one streams, the kernel after that only once this one's wait has passed. Either way the steps
 * are added in gemv_loop's order, so the sums have the same bits. AFTER() runs right after the
 * wait (gemv_after_none). */
template <int NT, int R, class After = gemv_after_none>
__device__ __forceinline__ void gemv_rows(const bf16 *const *wr, const bf16 *x, int K, int lane, bool reg,
                                          float (*acc)[NT], const After &after = After()) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      acc[r][t] = 0.0f;
  const int e = lane * 8;
  uint4 w0[R][4];
  if (reg)
    gemv_first4_load<R>(wr, e, K, true, w0);
  else
    gemv_first4_prefetch<R>(wr, e, K, true);
  pdl_wait();    /* x is written by the kernel before */
  pdl_trigger(); /* only now: the next kernel may launch, the one after it not yet */
  after(); /* the epilogue's early reads (gemv_res_load, qkv_rope_load), in flight during the products */
  if (reg) {
    gemv_first4_steps<NT, R, false>(w0, x, K, e, K, acc);
    gemv_loop<NT, R, false>(wr, x, K, e + 1024, acc);
  } else {
    gemv_loop<NT, R, false>(wr, x, K, e, acc);
  }
}

/* out(T, N) = x @ W^T (f32 when FLAGS has GEMV_OUT_F32, else bf16; GEMV_REG: the first steps into
 * registers before the wait, see gemv_rows). ADD (matmul_add): out is the residual
 * stream instead, and each sum, rounded to bf16 as matmul stores it, is added as rmsnorm_kernel's
 * residual add does (bf16(product + resid), f32 sum), in place; lane t updates token t (every
 * lane holds the totals), so the T read-modify-writes overlap. S warps per row (1, 2 or 4;
 * gemv_split picks it): GEMV_WARPS / S rows per block, warp p of a row summing segments p, p + S,
 * ... (the non-empty segments come first, so they are spread over the warps: at K = 2048 only two
 * are) into shared memory, then the row's first warp adding them in segment order (the same bits
 * as S = 1) and storing. */
template <int NT, bool ADD, int S>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(void *out, int flags, const bf16 *W, const bf16 *x, int N, int K) {
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const bool reg = flags & GEMV_REG, early = ADD && (flags & GEMV_EPI_EARLY);
  const int row = blockIdx.x * (GEMV_WARPS / S) + wi / S;
  float acc[1][NT], res_v[NT];
  if constexpr (S == 1) {
    if (row >= N)
      return;
    const bf16 *wr[1] = {W + (size_t)row * K};
    gemv_rows<NT, 1>(wr, x, K, lane, reg, acc, [&] {
      if (early) /* lane t's residual of token t, read while the products run */
        gemv_res_load<NT>((const bf16 *)out + row, N, lane, res_v);
    });
  } else {
    /* sp[row in block][segment][t][lane]: each segment's lane sums */
    __shared__ float sp[GEMV_WARPS / S][GEMV_SEGS][NT][32];
    const int part = wi % S, L = gemv_seg_len(K);
    const bool valid = row < N;
    const bf16 *wr[1] = {W + (size_t)(valid ? row : 0) * K};
    const int e0 = part * L + lane * 8; /* segments part, part + S, ...: the first ones are the non-empty ones */
    const int f1 = (part + 1) * L < K ? (part + 1) * L : K; /* the end of the first */
    uint4 w0[1][4];
    if (reg)
      gemv_first4_load<1>(wr, e0, f1, valid, w0);
    else
      gemv_first4_prefetch<1>(wr, e0, f1, valid);
    pdl_wait();
    pdl_trigger();
    if (early && valid && part == 0)
      gemv_res_load<NT>((const bf16 *)out + row, N, lane, res_v);
    if (valid) {
#pragma unroll
      for (int q = 0; q < GEMV_SEGS / S; q++) {
        const int s0 = (part + q * S) * L, s1 = s0 + L < K ? s0 + L : K;
#pragma unroll
        for (int t = 0; t < NT; t++)
          acc[0][t] = 0.0f;
        int e = s0 + lane * 8;
        if (reg && q == 0) { /* the first four steps, loaded before the wait */
          gemv_first4_steps<NT, 1, false>(w0, x, K, e, s1, acc);
          e += 1024;
        }
        if (s0 < K)
          gemv_steps<NT, 1, false>(wr, x, K, e, s1, acc);
#pragma unroll
        for (int t = 0; t < NT; t++)
          sp[wi / S][part + q * S][t][lane] = acc[0][t];
      }
    }
    __syncthreads();
    if (!valid || part != 0)
      return;
#pragma unroll
    for (int t = 0; t < NT; t++) {
      float run = sp[wi / S][0][t][lane];
      for (int q = 1; q < GEMV_SEGS && q * L < K; q++)
        run += sp[wi / S][q][t][lane];
      acc[0][t] = warp_total(run);
    }
  }
  if (ADD) {
#pragma unroll
    for (int t = 0; t < NT; t++)
      if (lane == t) {
        bf16 *r = (bf16 *)out + (size_t)t * N + row;
        const float rv = early ? res_v[t] : __bfloat162float(*r);
        *r = __float2bfloat16(__bfloat162float(__float2bfloat16(acc[0][t])) + rv);
      }
  } else if (lane == 0) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (flags & GEMV_OUT_F32)
        ((float *)out)[(size_t)t * N + row] = acc[0][t];
      else
        ((bf16 *)out)[(size_t)t * N + row] = __float2bfloat16(acc[0][t]);
    }
  }
}

long long cuda_matmul_set_fill(struct cuda_matmul_set *s, int n, void *const outs[], const struct weight *const ws[],
                               const struct weight *const biases[], long long max_rows) {
  memset(s, 0, sizeof *s);
  long long rows = 0;
  for (int i = 0; i < n; i++) {
    const struct weight *b = biases ? biases[i] : NULL;
    if (b && b->rows * b->cols != ws[i]->rows)
      return ERR("cuda matmul_n: bias %d has %lld elements for %lld rows", i, (long long)(b->rows * b->cols),
                 (long long)ws[i]->rows);
    if (b && b->dtype != DTYPE_F32 && b->dtype != DTYPE_BF16)
      return 0;
    s->W[i] = ws[i]->data;
    s->out[i] = outs[i];
    s->bias[i] = b ? b->data : NULL;
    s->bias_f32[i] = b && b->dtype == DTYPE_F32;
    s->N[i] = (int)ws[i]->rows;
    s->row0[i] = (int)rows;
    rows += ws[i]->rows;
    if (rows > max_rows)
      return 0;
  }
  for (int i = n; i <= BACKEND_MATMUL_N_MAX; i++)
    s->row0[i] = (int)rows;
  return rows;
}

/* The matrix of grid row G of M (past the last row: the last slot, a placeholder). */
__device__ __forceinline__ int gemv_multi_matrix(const gemv_multi &m, int g) {
  int i = 0;
#pragma unroll
  for (int j = 1; j < BACKEND_MATMUL_N_MAX; j++)
    i += g >= m.row0[j];
  return i;
}

/* Row ROW of matrix I of M: its T sums ACC, as gemv_multi_value makes them, into its output. */
template <int NT>
__device__ __forceinline__ void gemv_multi_store(const gemv_multi &m, int i, int row, const float *acc) {
  const bool has_bias = m.bias[i] != NULL;
  const int N = m.N[i];
  const float b = gemv_multi_bias(m, i, row);
#pragma unroll
  for (int t = 0; t < NT; t++)
    ((bf16 *)m.out[i])[(size_t)t * N + row] = gemv_multi_value(acc[t], has_bias, b);
}

template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_multi_kernel(const __grid_constant__ gemv_multi m, const bf16 *x, int K, int reg) {
  const int lane = threadIdx.x & 31;
  const int g = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (g >= m.row0[BACKEND_MATMUL_N_MAX])
    return;
  const int i = gemv_multi_matrix(m, g);
  const int row = g - m.row0[i];
  const bf16 *wr[1] = {(const bf16 *)m.W[i] + (size_t)row * K};
  float acc[1][NT];
  gemv_rows<NT, 1>(wr, x, K, lane, reg, acc);
  if (lane == 0)
    gemv_multi_store<NT>(m, i, row, acc[0]);
}

/* out[t][row] = silu(g) * u from the gate and up sums ACC[0][t], ACC[1][t], as silu_mul_kernel
 * computes it on the bf16 products. */
template <int NT>
__device__ __forceinline__ void gemv_silu_store(bf16 *out, int row, int F, const float (*acc)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float gv = __bfloat162float(__float2bfloat16(acc[0][t])), uv = __bfloat162float(__float2bfloat16(acc[1][t]));
    out[(size_t)t * F + row] = __float2bfloat16(gv / (1.0f + __expf(-gv)) * uv);
  }
}

/* out(T, F) = silu(x Wg^T) * (x Wu^T): warp f takes gate row f and up row f. */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_silu_mul_kernel(bf16 *out, const bf16 *Wg, const bf16 *Wu, const bf16 *x, int F, int K, int reg) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (row >= F)
    return;
  const bf16 *wr[2] = {Wg + (size_t)row * K, Wu + (size_t)row * K};
  float acc[2][NT];
  gemv_rows<NT, 2>(wr, x, K, lane, reg, acc);
  if (lane == 0)
    gemv_silu_store<NT>(out, row, F, acc);
}

/* ---- The RMSNorm in the GEMV's prologue (struct backend_prenorm) ----
 * A prenorm kernel's thread block first normalizes x's T rows into shared memory (T * K bf16, at
 * most CUDA_GEMV_PRE_SMEM bytes): a copy of x (16-byte loads), each row's 1 / rms by norm_inv
 * (cuda_norm.cuh: rmsnorm_kernel's summation order replayed on NW warps), then every element
 * rounded as rmsnorm_kernel writes it (norm_elem), in place. The GEMV then reads x from there.
 * Its weight rows' first four steps are requested before pdl_wait (the weights never change
 * during a step, cuda_pdl.cuh), so they stream while the block normalizes: by default
 * (CUDA_GEMV_PRE_L2 0) loaded into registers, which then stay live across the prologue (64 at
 * T = 1: fewer warps per SM, but the first steps are at hand after it; 1.010 against 1.074 ms per
 * token at 1B batch 1 on the H200), or with PAGODA_GEMV_PRE_L2=1 prefetched into L2, as
 * gemv_rows does (44 registers at 8 warps, the plain kernel's 38). The products are those of
 * rmsnorm followed by the plain GEMV bit for bit: the same bf16 inputs, gemv_loop's summation
 * order. Every block normalizes for itself (T * K * 2 bytes read from L2 per block), so blocks
 * of NW = cb->gemv_pre_rows warps (PAGODA_GEMV_PRE_ROWS: 4, 8 or 16) each taking RPW =
 * cb->gemv_pre_loop weight rows, or gate/up pairs, one after the other (PAGODA_GEMV_PRE_LOOP: 1,
 * 2 or 4) spread that over more rows; bench/prenorm_probe_h200.sh measured which pays (bench/RESULTS.md).
 * The ring kernel (below) also loads the norm weight's elements its threads will scale before its
 * wait (gemv_prenorm_w; PRE_NWC chunks of 8 per thread in registers) and requests the rest of its
 * weight ring between x's loads and their use (AFTER_X): of the prologue's global reads, only x's
 * are waited for after the wait. */
struct gemv_pre {
  const void *w; /* the norm weight (K), f32 or bf16 */
  int w_f32;
  float eps;
};

extern __shared__ uint4 gemv_xs[]; /* the prenorm kernels' normalized x: (T, K) bf16 */

#define PRE_NWC 4  /* gemv_prenorm_w: chunks of 8 norm weight elements per thread (K <= 8192 at 256 threads) */
#define PRE_XREG 4 /* gemv_prenorm with AFTER_X: x's 16-byte pieces per thread loaded into registers first */

/* W = the norm weight's elements [8 C, 8 C + 8) as float, or zeros unless IN. */
__device__ __forceinline__ void gemv_norm_w8(const gemv_pre &pre, int c, bool in, float *w) {
#pragma unroll
  for (int j = 0; j < 8; j++)
    w[j] = in ? norm_weight_at(pre.w, pre.w_f32, (size_t)c * 8 + j) : 0.0f;
}

/* The norm weight's elements of this thread's first PRE_NWC chunks (gemv_prenorm's element loop:
 * chunk c = threadIdx.x + k NW 32), for NWR. Weights: may be read before the wait. */
template <int NW>
__device__ __forceinline__ void gemv_prenorm_w(float (*nw)[8], const gemv_pre &pre, int K) {
#pragma unroll
  for (int k = 0; k < PRE_NWC; k++) {
    const int c = threadIdx.x + k * NW * 32;
    gemv_norm_w8(pre, c, c < K / 8, nw[k]);
  }
}

/* XS(T, K) = rmsnorm(x(T, K)) * pre.w, rounded to bf16, as rmsnorm_kernel (residual NULL) writes
 * it. Every thread of the block calls it, after pdl_wait; it ends with a barrier. NWR: NW holds
 * the thread's first PRE_NWC chunks of the norm weight (gemv_prenorm_w), else they are read here.
 * AFTER_X runs once x's loads are in flight, before they are waited for (the ring kernel requests
 * the rest of its ring there, so x's loads do not queue behind it and the pipe does not run dry
 * during the prologue). */
template <int NT, int NW, bool NWR = false, class AfterX = gemv_after_none>
__device__ __forceinline__ void gemv_prenorm(bf16 *xs, const bf16 *x, const gemv_pre &pre, int K,
                                             const float (*nw)[8] = nullptr, const AfterX &after_x = AfterX()) {
  __shared__ float part[32]; /* norm_inv's per-warp sums */
  uint4 *xs4 = (uint4 *)xs;
  const int c16 = K / 8; /* 16-byte chunks per row */
  int i0 = threadIdx.x;
  if constexpr (!std::is_same<AfterX, gemv_after_none>::value) { /* the first pieces via registers */
    uint4 xr[PRE_XREG];
#pragma unroll
    for (int k = 0; k < PRE_XREG; k++) {
      const int i = threadIdx.x + k * NW * 32;
      if (i < NT * c16)
        xr[k] = __ldg((const uint4 *)x + i);
    }
    after_x();
#pragma unroll
    for (int k = 0; k < PRE_XREG; k++) {
      const int i = threadIdx.x + k * NW * 32;
      if (i < NT * c16)
        xs4[i] = xr[k];
    }
    i0 += PRE_XREG * NW * 32;
  }
  for (int i = i0; i < NT * c16; i += NW * 32)
    xs4[i] = __ldg((const uint4 *)x + i);
  __syncthreads();
  float inv[NT];
#pragma unroll
  for (int t = 0; t < NT; t++)
    inv[t] = norm_inv<NW, NWR>(xs + (size_t)t * K, K, pre.eps, part); /* NWR: the ring kernel, registers to spare */
  auto elems = [&](int c, const float *w) { /* chunk c of every row, scaled by its weights W */
#pragma unroll
    for (int t = 0; t < NT; t++) {
      uint4 u = xs4[t * c16 + c];
      uint32_t wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int k = 0; k < 4; k++) { /* element 2k in the low half, 2k + 1 in the high half */
        bf16 lo = norm_elem(__ushort_as_bfloat16((unsigned short)(wd[k] & 0xffffu)), inv[t], w[2 * k]);
        bf16 hi = norm_elem(__ushort_as_bfloat16((unsigned short)(wd[k] >> 16)), inv[t], w[2 * k + 1]);
        wd[k] = (uint32_t)__bfloat16_as_ushort(lo) | (uint32_t)__bfloat16_as_ushort(hi) << 16;
      }
      xs4[t * c16 + c] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
    }
  };
  int c = threadIdx.x;
  if constexpr (NWR) {
#pragma unroll
    for (int k = 0; k < PRE_NWC; k++, c += NW * 32)
      if (c < c16)
        elems(c, nw[k]);
  }
  for (; c < c16; c += NW * 32) {
    float w[8];
    gemv_norm_w8(pre, c, true, w);
    elems(c, w);
  }
  __syncthreads();
}

/* gemv_rows with the prologue: the first four steps of the R rows WR[r] requested before the
 * wait, then gemv_prenorm (every warp of the block, VALID or not: it has barriers), then the sums
 * over the normalized x into acc[r][t] (warps whose row is past the matrix, !VALID, stop after the
 * prologue and must not store). REG (cb->gemv_pre_l2 0): those four steps are loaded into
 * registers, which stay live across the prologue (more registers, fewer warps per SM); else
 * prefetched into L2 as gemv_rows does, and loaded from there after it. */
template <int NT, int R, int NW, bool REG, class After = gemv_after_none>
__device__ __forceinline__ void gemv_rows_pre(const bf16 *const *wr, bool valid, const bf16 *x, const gemv_pre &pre,
                                              int K, int lane, float (*acc)[NT], const After &after = After()) {
  bf16 *xs = (bf16 *)gemv_xs;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      acc[r][t] = 0.0f;
  const int e = lane * 8;
  if constexpr (!REG) {
    gemv_first4_prefetch<R>(wr, e, K, valid);
    pdl_wait();    /* x is written by the kernel before */
    pdl_trigger(); /* as gemv_rows */
    after();
    gemv_prenorm<NT, NW>(xs, x, pre, K);
    if (valid)
      gemv_loop<NT, R, true>(wr, xs, K, e, acc);
  } else {
    uint4 w0[R][4];
    gemv_first4_load<R>(wr, e, K, valid, w0);
    pdl_wait();
    pdl_trigger();
    after();
    gemv_prenorm<NT, NW>(xs, x, pre, K);
    if (!valid)
      return;
    gemv_first4_steps<NT, R, true>(w0, xs, K, e, K, acc); /* the first four steps, in gemv_loop's order */
    gemv_loop<NT, R, true>(wr, xs, K, e + 1024, acc);
  }
}

/* A prenorm kernel's further rows (RPW > 1), after the prologue: the sums of the R rows WR[r] over
 * the block's normalized x in shared memory into acc[r][t], from zero (gemv_loop's order). */
template <int NT, int R>
__device__ __forceinline__ void gemv_rows_xs(const bf16 *const *wr, int K, int lane, float (*acc)[NT]) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      acc[r][t] = 0.0f;
  gemv_loop<NT, R, true>(wr, (const bf16 *)gemv_xs, K, lane * 8, acc);
}

/* gemv_rows_pre for a row group split over S > 1 warps (PAGODA_GEMV_SPLIT; gemv_pre_split picks
 * S): warp PART of the group sums the segments PART, PART + S, ... (the non-empty ones first
 * spread over the warps) of its R rows over the normalized x (its first segment's first four steps requested before the
 * wait, into registers or L2 as REG says), each segment's lane sums into SP (GEMV_SEGS * R * NT * 32
 * floats, the group's slice of the dynamic shared memory after x), then after the barrier the
 * group's first warp adds them in segment order and reduces over the warp: gemv_loop's bits. Every
 * warp of the block calls it (barriers); acc[r][t] is meaningful on PART 0 of a VALID group only. */
template <int NT, int R, int NW, bool REG, int S, class After = gemv_after_none>
__device__ __forceinline__ void gemv_rows_pre_split(const bf16 *const *wr, bool valid, const bf16 *x, const gemv_pre &pre,
                                                    int K, int lane, int part, float *sp, float (*acc)[NT],
                                                    const After &after = After()) {
  bf16 *xs = (bf16 *)gemv_xs;
  const int L = gemv_seg_len(K), f0 = part * L, f1 = f0 + L < K ? f0 + L : K;
  const int e0 = f0 + lane * 8;
  uint4 w0[R][4];
  if constexpr (REG)
    gemv_first4_load<R>(wr, e0, f1, valid, w0);
  else
    gemv_first4_prefetch<R>(wr, e0, f1, valid);
  pdl_wait();
  pdl_trigger();
  after();
  gemv_prenorm<NT, NW>(xs, x, pre, K);
  if (valid) {
#pragma unroll
    for (int q = 0; q < GEMV_SEGS / S; q++) {
      const int s0 = (part + q * S) * L, s1 = s0 + L < K ? s0 + L : K;
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
          acc[r][t] = 0.0f;
      int e = s0 + lane * 8;
      if (REG && q == 0) { /* the first four steps, loaded before the prologue */
        gemv_first4_steps<NT, R, true>(w0, xs, K, e, s1, acc);
        e += 1024;
      }
      if (s0 < K)
        gemv_steps<NT, R, true>(wr, xs, K, e, s1, acc);
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
          sp[(((part + q * S) * R + r) * NT + t) * 32 + lane] = acc[r][t];
    }
  }
  __syncthreads();
  if (!valid || part != 0)
    return;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++) {
      float run = sp[(r * NT + t) * 32 + lane];
      for (int q = 1; q < GEMV_SEGS && q * L < K; q++)
        run += sp[((q * R + r) * NT + t) * 32 + lane];
      acc[r][t] = warp_total(run);
    }
}

/* The group slice of the split partials in dynamic shared memory: after x's T rows (16-byte aligned). */
template <int NT, int R>
__device__ __forceinline__ float *gemv_split_slice(int K, int group) {
  return (float *)((char *)gemv_xs + (((size_t)NT * K * 2 + 15) & ~(size_t)15)) + (size_t)group * GEMV_SEGS * R * NT * 32;
}

/* matmul_n with the prenorm: gemv_multi_kernel over the normalized x. A block of NW warps takes
 * NW * RPW consecutive grid rows, warp w the rows w, w + NW, ... (RPW = cb->gemv_pre_loop): the
 * first with the weights loaded before the prologue, the others after it, so the prologue is paid
 * once per NW * RPW rows. */
template <int NT, int NW, bool REG, int S = 1>
__global__ void __launch_bounds__(NW * 32)
    gemv_multi_pre_kernel(const __grid_constant__ gemv_multi m, const bf16 *x, int K, const __grid_constant__ gemv_pre pre,
                          int rpw) {
  const int lane = threadIdx.x & 31, total = m.row0[BACKEND_MATMUL_N_MAX];
  if constexpr (S > 1) { /* NW / S rows per block, S warps each (rpw is 1) */
    const int wi = threadIdx.x >> 5, g = blockIdx.x * (NW / S) + wi / S;
    const bool valid = g < total;
    const int i = gemv_multi_matrix(m, valid ? g : 0), row = valid ? g - m.row0[i] : 0;
    const bf16 *wr[1] = {(const bf16 *)m.W[i] + (size_t)row * K};
    float acc[1][NT];
    gemv_rows_pre_split<NT, 1, NW, REG, S>(wr, valid, x, pre, K, lane, wi % S, gemv_split_slice<NT, 1>(K, wi / S), acc);
    if (valid && wi % S == 0 && lane == 0)
      gemv_multi_store<NT>(m, i, row, acc[0]);
    return;
  }
  int g = blockIdx.x * NW * rpw + (threadIdx.x >> 5);
  const bool valid = g < total;
  int i = gemv_multi_matrix(m, g);
  int row = valid ? g - m.row0[i] : 0;
  const bf16 *wr[1] = {(const bf16 *)m.W[i] + (size_t)row * K};
  float acc[1][NT];
  gemv_rows_pre<NT, 1, NW, REG>(wr, valid, x, pre, K, lane, acc);
  if (!valid)
    return;
  if (lane == 0)
    gemv_multi_store<NT>(m, i, row, acc[0]);
  for (int k = 1; k < rpw && (g += NW) < total; k++) {
    i = gemv_multi_matrix(m, g);
    row = g - m.row0[i];
    wr[0] = (const bf16 *)m.W[i] + (size_t)row * K;
    gemv_rows_xs<NT, 1>(wr, K, lane, acc);
    if (lane == 0)
      gemv_multi_store<NT>(m, i, row, acc[0]);
  }
}

/* matmul_silu_mul with the prenorm: gemv_silu_mul_kernel over the normalized x, NW warps per
 * block, RPW gate/up pairs per warp as gemv_multi_pre_kernel. */
template <int NT, int NW, bool REG, int S = 1>
__global__ void __launch_bounds__(NW * 32)
    gemv_silu_mul_pre_kernel(bf16 *out, const bf16 *Wg, const bf16 *Wu, const bf16 *x, int F, int K,
                             const __grid_constant__ gemv_pre pre, int rpw) {
  const int lane = threadIdx.x & 31;
  if constexpr (S > 1) { /* NW / S gate/up pairs per block, S warps each (rpw is 1) */
    const int wi = threadIdx.x >> 5, row = blockIdx.x * (NW / S) + wi / S;
    const bool valid = row < F;
    const size_t off = (size_t)(valid ? row : 0) * K;
    const bf16 *wr[2] = {Wg + off, Wu + off};
    float acc[2][NT];
    gemv_rows_pre_split<NT, 2, NW, REG, S>(wr, valid, x, pre, K, lane, wi % S, gemv_split_slice<NT, 2>(K, wi / S), acc);
    if (valid && wi % S == 0 && lane == 0)
      gemv_silu_store<NT>(out, row, F, acc);
    return;
  }
  int row = blockIdx.x * NW * rpw + (threadIdx.x >> 5);
  const bool valid = row < F;
  size_t off = (size_t)(valid ? row : 0) * K;
  const bf16 *wr[2] = {Wg + off, Wu + off};
  float acc[2][NT];
  gemv_rows_pre<NT, 2, NW, REG>(wr, valid, x, pre, K, lane, acc);
  if (!valid)
    return;
  if (lane == 0)
    gemv_silu_store<NT>(out, row, F, acc);
  for (int k = 1; k < rpw && (row += NW) < F; k++) {
    off = (size_t)row * K;
    wr[0] = Wg + off;
    wr[1] = Wu + off;
    gemv_rows_xs<NT, 2>(wr, K, lane, acc);
    if (lane == 0)
      gemv_silu_store<NT>(out, row, F, acc);
  }
}

/* ---- q/k/v, RoPE and the KV write in one kernel (backend.h matmul_qkv_rope): the pairing and the
 * epilogue are in cuda_qkv_rope.cuh, shared with the integer-dot GEMV on quantized weights ---- */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_qkv_rope_kernel(const __grid_constant__ gemv_multi m, const __grid_constant__ gemv_rope r, const bf16 *x,
                         int K, int reg) {
  const int lane = threadIdx.x & 31;
  const int g = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (g >= r.pq + 2 * r.pk)
    return;
  const qkv_pair p = qkv_rope_pair(r, g);
  const bf16 *W = (const bf16 *)m.W[p.i];
  const bf16 *wr[2] = {W + (size_t)p.r0 * K, W + (size_t)p.r1 * K};
  float acc[2][NT];
  qkv_rope_in in = {};
  gemv_rows<NT, 2>(wr, x, K, lane, reg, acc, [&] {
    if (r.early)
      in = qkv_rope_load<NT>(m, r, p, lane);
  });
  qkv_rope_store<NT>(m, r, p, acc, lane, r.early ? in : qkv_rope_load<NT>(m, r, p, lane));
}

/* With the prenorm: NW warps per block, RPW pairs per warp, as gemv_multi_pre_kernel. */
template <int NT, int NW, bool REG, int S = 1>
__global__ void __launch_bounds__(NW * 32)
    gemv_qkv_rope_pre_kernel(const __grid_constant__ gemv_multi m, const __grid_constant__ gemv_rope r, const bf16 *x,
                             int K, const __grid_constant__ gemv_pre pre, int rpw) {
  const int lane = threadIdx.x & 31, total = r.pq + 2 * r.pk;
  if constexpr (S > 1) { /* NW / S pairs per block, S warps each (rpw is 1) */
    const int wi = threadIdx.x >> 5, g = blockIdx.x * (NW / S) + wi / S;
    const bool valid = g < total;
    const qkv_pair p = qkv_rope_pair(r, valid ? g : 0);
    const bf16 *W = (const bf16 *)m.W[p.i];
    const bf16 *wr[2] = {W + (size_t)p.r0 * K, W + (size_t)p.r1 * K};
    float acc[2][NT];
    qkv_rope_in in = {};
    const bool early = r.early && valid && wi % S == 0;
    gemv_rows_pre_split<NT, 2, NW, REG, S>(wr, valid, x, pre, K, lane, wi % S, gemv_split_slice<NT, 2>(K, wi / S), acc,
                                           [&] {
                                             if (early)
                                               in = qkv_rope_load<NT>(m, r, p, lane);
                                           });
    if (valid && wi % S == 0)
      qkv_rope_store<NT>(m, r, p, acc, lane, early ? in : qkv_rope_load<NT>(m, r, p, lane));
    return;
  }
  int g = blockIdx.x * NW * rpw + (threadIdx.x >> 5);
  const bool valid = g < total;
  qkv_pair p = qkv_rope_pair(r, valid ? g : 0);
  const bf16 *W = (const bf16 *)m.W[p.i];
  const bf16 *wr[2] = {W + (size_t)p.r0 * K, W + (size_t)p.r1 * K};
  float acc[2][NT];
  qkv_rope_in in = {};
  const bool early = r.early && valid;
  gemv_rows_pre<NT, 2, NW, REG>(wr, valid, x, pre, K, lane, acc, [&] {
    if (early)
      in = qkv_rope_load<NT>(m, r, p, lane);
  });
  if (!valid)
    return;
  qkv_rope_store<NT>(m, r, p, acc, lane, early ? in : qkv_rope_load<NT>(m, r, p, lane));
  for (int k = 1; k < rpw && (g += NW) < total; k++) {
    p = qkv_rope_pair(r, g);
    W = (const bf16 *)m.W[p.i];
    wr[0] = W + (size_t)p.r0 * K;
    wr[1] = W + (size_t)p.r1 * K;
    gemv_rows_xs<NT, 2>(wr, K, lane, acc);
    qkv_rope_store<NT>(m, r, p, acc, lane);
  }
}

/* ---- The ring GEMV: T = 1, one thread block per multiprocessor streaming its share (cb->gemv_ring) ----
 * The kernels above give every row (or pair) a warp of its own, a grid of one or more waves that
 * fills the multiprocessors with small blocks: each one's first weight loads go out only when it
 * starts, so every kernel boundary drains the memory pipe (6-10 us per kernel at 8B, 166 kernels a
 * token; bench/RESULTS.md). Here a grid of at most one block per multiprocessor takes contiguous
 * units (two rows of a matmul_add or of a plain matmul, RING_STORE: the output head, tensor
 * parallelism's o and down; a gate/up pair; a RoPE pair of q/k/v: R = 2 rows whose chunks share
 * each x load), RING_WARPS warps per block, warp w the units w, w + RING_WARPS, ...; each
 * warp streams its units' weights, chunk by chunk (RING_COLS columns of both rows), through a ring
 * of C chunks in shared memory by cp.async (lane l copies the 16-byte pieces it will itself
 * multiply: columns 8 l + 256 j, so no barrier guards a chunk). The whole ring, cb->gemv_ring_kb
 * KiB per block (128 by default), is requested before pdl_wait (weights only, cuda_pdl.cuh): as a
 * block of the kernel before exits, this kernel's block takes the multiprocessor with 128 KiB in
 * flight at once, so the pipe stays full across the boundary. A block takes over half of a
 * multiprocessor's shared memory on purpose: with 96-112 KiB rings, two consecutive ring kernels'
 * blocks sat side by side and the 8B step took 5.1 ms against 4.2 (bench/RESULTS.md, session 11).
 * The sums follow gemv_loop's order (chunks in column order; a segment of gemv_seg_len(K) columns
 * is whole chunks), so every form gives the same bits as the kernels above. */
#define RING_WARPS 8
#define RING_COLS 1024 /* columns per chunk: four warp steps */
#define RING_SLOT_BYTES (RING_COLS * 2) /* one row's piece of a chunk */
enum { RING_ADD, RING_SILU, RING_QKV, RING_STORE };

struct gemv_ring {
  const bf16 *W0, *W1; /* ADD: W; SILU: the gate and up matrices (QKV: m.W) */
  void *out;           /* ADD: the residual stream (N = 2 units); SILU: (F = units); STORE: (N = 2 units) */
  int out_f32;         /* STORE: f32 out, else bf16 */
  int units, K, C; /* units (block b takes [b U / G, (b + 1) U / G)); columns; chunks per warp's ring */
  int evict_first;
  int late; /* cb->gemv_ring_late: trigger once the warp's last chunk is in flight, not after the wait */
  int ahead; /* chunks per warp requested before the wait (C, or fewer with the prenorm: cb->gemv_ring_pre_ahead) */
};

/* XS: x in shared memory (the prenorm's normalized copy, or for ADD a plain copy when it takes at
 * most RING_ADD_XS bytes), else read through the read-only cache. */
#define RING_ADD_XS 16384
template <int MODE, bool PRE, bool XS>
__global__ void __launch_bounds__(RING_WARPS * 32, 1)
    gemv_ring_kernel(const __grid_constant__ gemv_ring g, const __grid_constant__ gemv_multi m,
                     const __grid_constant__ gemv_rope rp, const bf16 *x, const __grid_constant__ gemv_pre pre) {
  constexpr int R = 2; /* ADD, STORE: rows 2u, 2u + 1; SILU: gate and up row u; QKV: RoPE pair u */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K = g.K, C = g.C;
  const size_t xs_bytes = XS ? (((size_t)K * 2 + 15) & ~(size_t)15) : 0;
  uint4 *ring = (uint4 *)((char *)gemv_xs + xs_bytes) + (size_t)warp * C * R * 4 * 32;
  const qg_ring_share sh = qg_ring_share_of(g.units, RING_WARPS, warp);
  const int u0 = sh.u0, nu = sh.nu; /* this warp's units: u0 + warp, u0 + warp + RING_WARPS, ... */
  const int cpu = K / RING_COLS;    /* chunks per unit */
  uint64_t pol = 0;
  if (g.evict_first)
    pol = qg_evict_first_policy();
  qg_ring_cursor cur = {0, 0, 0}; /* the issue side */
  const bf16 *wr[R];
  auto rows_of = [&](int k) { /* wr = the R rows of the warp's unit k */
    const int u = u0 + warp + k * RING_WARPS;
    if constexpr (MODE == RING_ADD || MODE == RING_STORE) {
      wr[0] = g.W0 + (size_t)(2 * u) * K;
      wr[1] = wr[0] + K;
    } else if constexpr (MODE == RING_SILU) {
      wr[0] = g.W0 + (size_t)u * K;
      wr[1] = g.W1 + (size_t)u * K;
    } else {
      const qkv_pair p = qkv_rope_pair(rp, u);
      const bf16 *W = (const bf16 *)m.W[p.i];
      wr[0] = W + (size_t)p.r0 * K;
      wr[1] = W + (size_t)p.r1 * K;
    }
  };
  if (nu > 0)
    rows_of(0);
  auto issue = [&]() { /* the next chunk of the stream into the next slot (a group either way) */
    if (cur.ik < nu) {
      const int c0 = cur.ic * RING_COLS + lane * 8;
      uint4 *dst = ring + (size_t)cur.is * R * 4 * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          qg_cp_async16_hint(dst + (r * 4 + j) * 32, wr[r] + c0 + 256 * j, g.evict_first, pol);
      if (cur.next(cpu, nu, C))
        rows_of(cur.ik);
    }
    qg_cp_commit();
  };
  for (int i = 0; i < g.ahead; i++)
    issue(); /* the ring (or with PRE its first g.ahead chunks) before the wait: weights never change during a step */
  float nw[PRE ? PRE_NWC : 1][8];
  if constexpr (PRE) /* the thread's norm weight elements, into registers: a round trip less after the wait */
    gemv_prenorm_w<RING_WARPS>(nw, pre, K);
  pdl_wait(); /* x (and the residual) are written by the kernels before */
  /* g.late (the default): the trigger comes once the warp's last chunk is in flight, not right
   * after the wait, so the next kernel is launched as this one drains (within 0.3% of the early
   * trigger at 8B, bench/RESULTS.md; it was written for blocks side by side, where it mattered). */
  bool trig = !g.late || cur.ik == nu;
  if (trig)
    pdl_trigger();
  const bf16 *xv = x;
  if constexpr (PRE) {
    /* the rest of the ring goes out once x's loads are in flight: a prologue's loads queue behind
     * the chunks its multiprocessor has in flight (with the whole ring requested before the wait,
     * gate/up's prologue took 5.5 us of its 56: a per-block timeline, bench/RESULTS.md, session
     * 16), and requested after the prologue the ring ran dry during it (sessions 16-18) */
    gemv_prenorm<1, RING_WARPS, true>((bf16 *)gemv_xs, x, pre, K, nw, [&]() {
      for (int i = g.ahead; i < C; i++)
        issue();
    });
    xv = (const bf16 *)gemv_xs;
  } else if constexpr (XS) {
    for (int i = threadIdx.x; i < K / 8; i += RING_WARPS * 32)
      gemv_xs[i] = __ldg((const uint4 *)x + i);
    __syncthreads();
    xv = (const bf16 *)gemv_xs;
  }
  if (!trig && cur.ik == nu) {
    pdl_trigger();
    trig = true;
  }
  const int L = gemv_seg_len(K);
  float acc[R][1], run[R][1];
  int slot = 0;
  for (int qk = 0; qk < nu; qk++) {
    for (int c = 0; c < cpu; c++) {
      qg_cp_wait_ring(C); /* this lane's pieces of the chunk have landed */
      const int col = c * RING_COLS;
      if (c == 0) {
#pragma unroll
        for (int r = 0; r < R; r++)
          acc[r][0] = run[r][0] = 0.0f;
      } else if (col % L == 0) { /* a segment ends: added in segment order, as gemv_loop does */
#pragma unroll
        for (int r = 0; r < R; r++) {
          run[r][0] = col == L ? acc[r][0] : run[r][0] + acc[r][0];
          acc[r][0] = 0.0f;
        }
      }
      const uint4 *src = ring + (size_t)slot * R * 4 * 32 + lane;
      uint4 w[R][4];
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          w[r][j] = src[(r * 4 + j) * 32];
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int r = 0; r < R; r++)
          gemv_step<1, XS>(w[r][j], xv, K, col + lane * 8 + 256 * j, acc[r]);
      slot = slot + 1 == C ? 0 : slot + 1;
      issue(); /* C chunks on, into the slot just read (this lane's own pieces) */
      if (!trig && cur.ik == nu) {
        pdl_trigger();
        trig = true;
      }
    }
    /* the unit's totals, then its epilogue */
#pragma unroll
    for (int r = 0; r < R; r++)
      acc[r][0] = warp_total(K <= L ? acc[r][0] : run[r][0] + acc[r][0]);
    const int u = u0 + warp + qk * RING_WARPS;
    if constexpr (MODE == RING_ADD) {
      if (lane < 2) {
        bf16 *res = (bf16 *)g.out + 2 * u + lane;
        const float a = lane ? acc[1][0] : acc[0][0];
        *res = __float2bfloat16(__bfloat162float(__float2bfloat16(a)) + __bfloat162float(*res));
      }
    } else if constexpr (MODE == RING_STORE) { /* as gemv_kernel stores */
      if (lane < 2) {
        const float a = lane ? acc[1][0] : acc[0][0];
        if (g.out_f32)
          ((float *)g.out)[2 * u + lane] = a;
        else
          ((bf16 *)g.out)[2 * u + lane] = __float2bfloat16(a);
      }
    } else if constexpr (MODE == RING_SILU) {
      if (lane == 0)
        gemv_silu_store<1>((bf16 *)g.out, u, g.units, acc);
    } else {
      qkv_rope_store<1>(m, rp, qkv_rope_pair(rp, u), acc, lane);
    }
  }
}

#define GEMV_SWITCH(T, CASE)                                                                        \
  switch (T) {                                                                                      \
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)                                 \
  }

/* Warps per row for an N x K matrix (gemv_kernel's S): 1, or with PAGODA_GEMV_SPLIT on (the
 * default; cb->gemv_split) the fewest of 2 and 4 that put 32 warps per multiprocessor to work,
 * at most one per non-empty segment (warp p takes segments p, p + S, ...: each has columns). The
 * bits are the same either way (the order above). */
static int gemv_split(struct cuda_backend *cb, int N, int K) {
  if (!cb->gemv_split)
    return 1;
  const long long want = 32LL * cuda_sm_count(cb);
  const int L = gemv_seg_len(K), segs = (K + L - 1) / L;
  int s = 1;
  while (s < 4 && (long long)N * s < want && 2 * s <= segs)
    s *= 2;
  return s;
}

/* The ring GEMV (gemv_ring_kernel) takes T = 1 with rows of whole chunks, when cb->gemv_ring is on
 * and the device lets a block have its shared memory (at most x, 2 K bytes, and the ring). */
static int gemv_ring_ok(const struct cuda_backend *cb, int T, long long K) {
  return cb->gemv_ring && T == 1 && K % RING_COLS == 0 && K >= RING_COLS && K >= cb->gemv_ring_min_k &&
         K * 2 + 16 + (long long)(cb->gemv_ring_kb > 64 ? cb->gemv_ring_kb : 64) * 1024 <= cb->smem_optin;
}

/* gemv_ring_kernel<MODE, PRE, XS> for launching (XS: PRE, or ADD's / STORE's x within RING_ADD_XS bytes). */
template <int MODE, bool PRE>
static void (*gemv_ring_fn(int K))(gemv_ring, gemv_multi, gemv_rope, const bf16 *, gemv_pre) {
  if constexpr (PRE) /* the prologue normalizes into shared memory: always XS */
    return gemv_ring_kernel<MODE, true, true>;
  else if ((MODE == RING_ADD || MODE == RING_STORE) && (size_t)K * 2 <= RING_ADD_XS)
    return gemv_ring_kernel<MODE, false, true>;
  else
    return gemv_ring_kernel<MODE, false, false>;
}

/* gemv_ring_kernel<MODE, PRE> over G.units units of G.K columns (G's W0, W1, out, units and K set):
 * one block per multiprocessor at most, each with a ring of about cb->gemv_ring_kb KiB per block. */
template <int MODE, bool PRE>
static cudaError_t gemv_ring_launch(struct cuda_backend *cb, gemv_ring g, const gemv_multi &m, const gemv_rope &rp,
                                    const bf16 *x, const gemv_pre &pre) {
  constexpr int R = 2;
  static unsigned long long opted[2] = {0, 0}; /* [XS] bit d: device d has the shared-memory attribute */
  auto fn = gemv_ring_fn<MODE, PRE>(g.K);
  const bool xs = fn == gemv_ring_kernel<MODE, PRE, true>;
  const int sms = cuda_sm_count(cb);
  const unsigned blocks = (unsigned)(g.units < sms ? g.units : sms); /* units split evenly over them */
  int C = cb->gemv_ring_kb * 1024 / (RING_WARPS * R * RING_SLOT_BYTES);
  g.C = C < 2 ? 2 : C > 8 ? 8 : C;
  g.evict_first = cb->qg_evict_first;
  g.late = cb->gemv_ring_late;
  g.ahead = !PRE ? g.C : cb->gemv_ring_pre_ahead > 0 ? (cb->gemv_ring_pre_ahead < g.C ? cb->gemv_ring_pre_ahead : g.C)
                                                     : g.C / 2;
  const size_t smem = (xs ? (((size_t)g.K * 2 + 15) & ~(size_t)15) : 0) + (size_t)RING_WARPS * g.C * R * RING_SLOT_BYTES;
  const cudaError_t e = cuda_smem_opt_in(cb, (const void *)fn, &opted[xs]);
  if (e != cudaSuccess)
    return e;
  return cuda_pdl_launch(cb, fn, dim3(blocks), dim3(RING_WARPS * 32), smem, g, m, rp, x, pre);
}

/* gemv_kernel<T, ADD, S> over N rows of K (S by gemv_split). */
template <bool ADD>
static cudaError_t gemv_launch(struct cuda_backend *cb, void *out, int out_f32, const bf16 *W, const bf16 *X, int N,
                               int K, int T) {
  const int S = gemv_split(cb, N, K), rows = GEMV_WARPS / S;
  const dim3 grid((unsigned)((N + rows - 1) / rows)), thr(GEMV_WARPS * 32);
  const int flags =
      (out_f32 ? GEMV_OUT_F32 : 0) | (cb->gemv_reg ? GEMV_REG : 0) | (cb->epi_early ? GEMV_EPI_EARLY : 0);
  cudaError_t err = cudaSuccess;
#define GEMV_CASE(n)                                                                                           \
  case n:                                                                                                      \
    err = S == 4   ? cuda_pdl_launch(cb, gemv_kernel<n, ADD, 4>, grid, thr, 0, out, flags, W, X, N, K)       \
          : S == 2 ? cuda_pdl_launch(cb, gemv_kernel<n, ADD, 2>, grid, thr, 0, out, flags, W, X, N, K)       \
                   : cuda_pdl_launch(cb, gemv_kernel<n, ADD, 1>, grid, thr, 0, out, flags, W, X, N, K);      \
    break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  return err;
}

int cuda_gemv_bf16(struct backend *be, void *out, const void *x, const struct weight *w, int T, int out_f32) {
  struct cuda_backend *cb = cuda_be(be);
  int N = (int)w->rows, K = (int)w->cols;
  if (T < 1 || T > CUDA_GEMV_MAX_T || K % 8 || w->dtype != DTYPE_BF16)
    return ERR("cuda gemv: T %d (1..%d), K %d (a multiple of 8), dtype %s (bf16)", T, CUDA_GEMV_MAX_T, K,
               dtype_name(w->dtype));
  if (cb->gemv_ring_store && gemv_ring_ok(cb, T, K) && N % 2 == 0) {
    gemv_ring g = {};
    g.W0 = (const bf16 *)w->data;
    g.out = out;
    g.out_f32 = out_f32;
    g.units = N / 2;
    g.K = K;
    CUDA_CHECK((gemv_ring_launch<RING_STORE, false>(cb, g, gemv_multi{}, gemv_rope{}, (const bf16 *)x, gemv_pre{})));
    return 0;
  }
  CUDA_CHECK(gemv_launch<false>(cb, out, out_f32, (const bf16 *)w->data, (const bf16 *)x, N, K, T));
  return 0;
}

/* The fused kernels take bf16 matrices of one K (a multiple of 8) at T <= gemv_max_t. */
static int gemv_fusable(struct cuda_backend *cb, const struct weight *const *ws, int n, int T) {
  if (!cb->fused_ops || T < 1 || T > cb->gemv_max_t || ws[0]->cols % 8 || ws[0]->cols > INT32_MAX)
    return 0;
  for (int i = 0; i < n; i++)
    if (ws[i]->dtype != DTYPE_BF16 || ws[i]->cols != ws[0]->cols || ws[i]->rows > INT32_MAX / 4)
      return 0;
  return 1;
}

/* The prologue's terms for PRE over T rows of K (struct gemv_pre into P): 1 when it takes them (a
 * norm weight of f32 or bf16 values, x's rows within CUDA_GEMV_PRE_SMEM bytes of shared memory),
 * 0 when not (the caller's rmsnorm first), -1 when the norm weight does not have K elements. */
static int gemv_pre_terms(struct cuda_backend *cb, const struct backend_prenorm *pre, int64_t K, int T,
                          gemv_pre *p) {
  const struct weight *w = pre->w;
  if (w->rows * w->cols != K)
    return ERR("cuda prenorm: the norm weight has %lld elements, the matrices have %lld columns",
               (long long)(w->rows * w->cols), (long long)K);
  if (!cb->fused_norm || (w->dtype != DTYPE_F32 && w->dtype != DTYPE_BF16) ||
      (size_t)T * (size_t)K * 2 > CUDA_GEMV_PRE_SMEM || (cb->gemv_pre_max_k > 0 && K > cb->gemv_pre_max_k))
    return 0;
  p->w = w->data;
  p->w_f32 = w->dtype == DTYPE_F32;
  p->eps = pre->eps;
  return 1;
}

/* Warps per row group (S) of a prenorm kernel over UNITS groups of R rows of K at T, NW warps per
 * block: 2 where gemv_split would split a plain GEMV of that many rows and each warp gets two
 * segments or more (four non-empty ones: at K = 2048, the 1B shape's q/k/v, a warp of one segment
 * measured 0.015 ms per token slower than no split, which 8B's K = 4096 gains 0.04 ms from:
 * bench/RESULTS.md), for T <= CUDA_GEMV_PRE_SPLIT_T with one row group per warp
 * (PAGODA_GEMV_PRE_LOOP 1) and x plus the partials within 48 KiB of shared memory; else 1.
 * *SMEM: the dynamic shared memory for that S. */
static int gemv_pre_split(struct cuda_backend *cb, long long units, int K, int T, int NW, int R, size_t *smem) {
  const size_t xs = ((size_t)T * K * 2 + 15) & ~(size_t)15;
  *smem = (size_t)T * K * 2;
  const int L = gemv_seg_len(K);
  if (!cb->gemv_pre_split || T > CUDA_GEMV_PRE_SPLIT_T || cb->gemv_pre_loop != 1 || units > INT32_MAX ||
      (K + L - 1) / L < 4 || gemv_split(cb, (int)units, K) < 2)
    return 1;
  const size_t sp = (size_t)(NW / 2) * GEMV_SEGS * R * T * 32 * sizeof(float);
  if (xs + sp + 32 * sizeof(float) > 48 * 1024) /* + gemv_prenorm's static part[32] */
    return 1;
  *smem = xs + sp;
  return 2;
}

/* Launches KERNEL<T, NW, REG, 2> over UNITS row groups when S is 2 (and T within the split's
 * instantiations), else KERNEL<T, NW, REG, 1> at rpw row groups per warp; ARGS after the shape. */
#define GEMV_PRE_CASE(c, kernel, units, S, smem, ...)                                                             \
  case c:                                                                                                          \
    if constexpr (c <= CUDA_GEMV_PRE_SPLIT_T) {                                                                    \
      if ((S) == 2)                                                                                                \
        return cuda_pdl_launch(cb, kernel<c, NW, REG, 2>, dim3((unsigned)(((units) + NW / 2 - 1) / (NW / 2))),     \
                               dim3(NW * 32), smem, __VA_ARGS__, 1);                                               \
    }                                                                                                              \
    return cuda_pdl_launch(cb, kernel<c, NW, REG, 1>, dim3((unsigned)(((units) + NW * rpw - 1) / (NW * rpw))),     \
                           dim3(NW * 32), smem, __VA_ARGS__, rpw);

/* The prenorm kernels for NW warps per block and REG (a template so the switch over T names them). */
template <int NW, bool REG>
static cudaError_t gemv_multi_pre_launch(struct cuda_backend *cb, unsigned rows, const gemv_multi &m, const bf16 *X,
                                         int K, const gemv_pre &p, int T) {
  const int rpw = cb->gemv_pre_loop;
  size_t smem;
  const int S = gemv_pre_split(cb, rows, K, T, NW, 1, &smem);
#define GEMV_CASE(c) GEMV_PRE_CASE(c, gemv_multi_pre_kernel, rows, S, smem, m, X, K, p)
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  return cudaErrorInvalidValue;
}

template <int NW, bool REG>
static cudaError_t gemv_silu_pre_launch(struct cuda_backend *cb, bf16 *out, const bf16 *Wg, const bf16 *Wu,
                                        const bf16 *X, int F, int K, const gemv_pre &p, int T) {
  const int rpw = cb->gemv_pre_loop;
  size_t smem;
  const int S = gemv_pre_split(cb, F, K, T, NW, 2, &smem);
#define GEMV_CASE(c) GEMV_PRE_CASE(c, gemv_silu_mul_pre_kernel, F, S, smem, out, Wg, Wu, X, F, K, p)
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  return cudaErrorInvalidValue;
}

/* F(nw, reg) for the prenorm kernels' shape, as std::integral_constant<int, NW> and std::bool_constant<REG>
 * (the launchers name their kernel template by decltype(nw)::value, decltype(reg)::value): NW =
 * cb->gemv_pre_rows warps per block (4, 8 or 16), REG = !cb->gemv_pre_l2. */
template <class F>
static cudaError_t gemv_pre_shape(const struct cuda_backend *cb, F f) {
  auto rows = [&](auto reg) {
    return cb->gemv_pre_rows == 4    ? f(std::integral_constant<int, 4>(), reg)
           : cb->gemv_pre_rows == 16 ? f(std::integral_constant<int, 16>(), reg)
                                     : f(std::integral_constant<int, 8>(), reg);
  };
  return cb->gemv_pre_l2 ? rows(std::false_type()) : rows(std::true_type());
}

/* matmul_n with PRE: bf16 weights the GEMV takes (gemv_fusable) and the prologue's terms, else 1
 * (quantized weights: cuda_quant_matmul_n, which takes the prologue into its x quantization). */
static int gemv_multi_pre(struct cuda_backend *cb, int n, void *const outs[], const void *x,
                          const struct backend_prenorm *pre, const struct weight *const ws[],
                          const struct weight *const biases[], int T) {
  gemv_pre p = {};
  if (cuda_quant_type(ws[0]->dtype) >= 0 || cb->base.act_dtype != DTYPE_BF16 || !gemv_fusable(cb, ws, n, T))
    return 1;
  int terms = gemv_pre_terms(cb, pre, ws[0]->cols, T, &p);
  if (terms <= 0)
    return terms < 0 ? -1 : 1;
  gemv_multi m;
  long long rows = cuda_matmul_set_fill(&m, n, outs, ws, biases, INT32_MAX - CUDA_GEMV_PRE_ROWS_MAX * 4);
  if (rows <= 0)
    return rows < 0 ? -1 : 1;
  const bf16 *X = (const bf16 *)x;
  const int K = (int)ws[0]->cols;
  CUDA_CHECK(gemv_pre_shape(cb, [&](auto nw, auto reg) {
    return gemv_multi_pre_launch<decltype(nw)::value, decltype(reg)::value>(cb, (unsigned)rows, m, X, K, p, T);
  }));
  return 0;
}

int cuda_op_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                     const struct weight *const ws[], const struct weight *const biases[], int T) {
  struct cuda_backend *cb = cuda_be(be);
  if (n < 1 || n > BACKEND_MATMUL_N_MAX)
    return ERR("cuda matmul_n: n = %d (1..%d)", n, BACKEND_MATMUL_N_MAX);
  if (cuda_quant_type(ws[0]->dtype) >= 0) /* quantized weights: cuda_quant_gemv.cu */
    return cuda_quant_matmul_n(be, n, outs, x, pre, ws, biases, T);
  if (pre) /* 1: the caller's rmsnorm first, then this op again without PRE */
    return gemv_multi_pre(cb, n, outs, x, pre, ws, biases, T);
  if (be->act_dtype != DTYPE_BF16 || !gemv_fusable(cb, ws, n, T))
    return 1; /* the separate matmuls */
  gemv_multi m;
  long long rows = cuda_matmul_set_fill(&m, n, outs, ws, biases, INT32_MAX - GEMV_WARPS);
  if (rows <= 0)
    return rows < 0 ? -1 : 1;
  dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS));
  const bf16 *X = (const bf16 *)x;
  int K = (int)ws[0]->cols;
  const dim3 thr(GEMV_WARPS * 32);
  cudaError_t err = cudaSuccess;
#define GEMV_CASE(c) \
  case c: err = cuda_pdl_launch(cb, gemv_multi_kernel<c>, grid, thr, 0, m, X, K, cb->gemv_reg); break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  CUDA_CHECK(err);
  return 0;
}

int cuda_op_matmul_silu_mul(struct backend *be, void *out, const void *x, const struct backend_prenorm *pre,
                            const struct weight *gate, const struct weight *up, int T) {
  struct cuda_backend *cb = cuda_be(be);
  const struct weight *ws[2] = {gate, up};
  if (gate->rows != up->rows)
    return ERR("cuda matmul_silu_mul: gate has %lld rows, up %lld", (long long)gate->rows, (long long)up->rows);
  if (cuda_quant_type(gate->dtype) >= 0) /* quantized weights: cuda_quant_gemv.cu */
    return cuda_quant_matmul_silu_mul(be, out, x, pre, gate, up, T);
  if (be->act_dtype != DTYPE_BF16 || !cb->fused_silu || !gemv_fusable(cb, ws, 2, T))
    return 1; /* matmul_n, then silu_mul */
  int F = (int)gate->rows, K = (int)gate->cols;
  const bf16 *Wg = (const bf16 *)gate->data, *Wu = (const bf16 *)up->data, *X = (const bf16 *)x;
  cudaError_t err = cudaSuccess;
  gemv_ring g = {};
  g.W0 = Wg;
  g.W1 = Wu;
  g.out = out;
  g.units = F;
  g.K = K;
  if (pre) { /* 1: matmul_n with PRE next (blocks.c), then the caller's rmsnorm */
    gemv_pre p = {};
    int terms = gemv_pre_terms(cb, pre, K, T, &p);
    if (terms <= 0)
      return terms < 0 ? -1 : 1;
    if (gemv_ring_ok(cb, T, K)) {
      CUDA_CHECK((gemv_ring_launch<RING_SILU, true>(cb, g, gemv_multi{}, gemv_rope{}, X, p)));
      return 0;
    }
    bf16 *o = (bf16 *)out;
    CUDA_CHECK(gemv_pre_shape(cb, [&](auto nw, auto reg) {
      return gemv_silu_pre_launch<decltype(nw)::value, decltype(reg)::value>(cb, o, Wg, Wu, X, F, K, p, T);
    }));
    return 0;
  }
  if (gemv_ring_ok(cb, T, K)) {
    CUDA_CHECK((gemv_ring_launch<RING_SILU, false>(cb, g, gemv_multi{}, gemv_rope{}, X, gemv_pre{})));
    return 0;
  }
  dim3 grid((unsigned)((F + GEMV_WARPS - 1) / GEMV_WARPS));
  const dim3 thr(GEMV_WARPS * 32);
#define GEMV_CASE(c) \
  case c: err = cuda_pdl_launch(cb, gemv_silu_mul_kernel<c>, grid, thr, 0, (bf16 *)out, Wg, Wu, X, F, K, cb->gemv_reg); break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  CUDA_CHECK(err);
  return 0;
}

int cuda_op_matmul_add(struct backend *be, void *resid, const void *x, const struct weight *w, void *scratch, int T) {
  struct cuda_backend *cb = cuda_be(be);
  (void)scratch; /* the product stays on chip */
  const struct weight *ws[1] = {w};
  if (cuda_quant_type(w->dtype) >= 0) /* quantized weights: cuda_quant_gemv.cu */
    return cuda_quant_matmul_add(be, resid, x, w, T);
  /* what matmul would not run on the GEMV, or off */
  if (!cb->fused_norm || be->act_dtype != DTYPE_BF16 || !gemv_fusable(cb, ws, 1, T))
    return 1;
  if (gemv_ring_ok(cb, T, w->cols) && w->rows % 2 == 0) {
    gemv_ring g = {};
    g.W0 = (const bf16 *)w->data;
    g.out = resid;
    g.units = (int)(w->rows / 2);
    g.K = (int)w->cols;
    CUDA_CHECK((gemv_ring_launch<RING_ADD, false>(cb, g, gemv_multi{}, gemv_rope{}, (const bf16 *)x, gemv_pre{})));
    return 0;
  }
  CUDA_CHECK(gemv_launch<true>(cb, resid, 0, (const bf16 *)w->data, (const bf16 *)x, (int)w->rows, (int)w->cols, T));
  return 0;
}

/* The q/k/v + RoPE + KV-write kernels (gemv_qkv_rope_pre_kernel for NW warps per block and REG). */
template <int NW, bool REG>
static cudaError_t qkv_rope_pre_launch(struct cuda_backend *cb, unsigned pairs, const gemv_multi &m, const gemv_rope &r,
                                       const bf16 *X, int K, const gemv_pre &p, int T) {
  const int rpw = cb->gemv_pre_loop;
  size_t smem;
  const int S = gemv_pre_split(cb, pairs, K, T, NW, 2, &smem);
#define GEMV_CASE(c) GEMV_PRE_CASE(c, gemv_qkv_rope_pre_kernel, pairs, S, smem, m, r, X, K, p)
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  return cudaErrorInvalidValue;
}

/* backend.h matmul_qkv_rope: 1 (nothing enqueued) for what gemv_qkv_rope_kernel (or, for quantized
 * weights, qgemv_i8_kernel with ROPE) does not cover,
 * which the caller then runs as matmul_n (or its matmuls) and rope_kv_write (or rope, kv_write):
 * cb->fused_rope 0 (PAGODA_FUSED_ROPE=0 or PAGODA_FUSED_OPS=0), weights the GEMV does not take
 * (gemv_fusable: bf16 of one K, a multiple of 8, T <= gemv_max_t; quantized weights go to
 * cuda_quant_matmul_qkv_rope, which answers 1 where its GEMV does not take them), a KV
 * dtype other than bf16 / f8e4m3 or a block size the cache kernels are not built for, an odd
 * head_dim, rot_dim not even or past head_dim, LongRoPE (rp->inv_freq_long), and with PRE what
 * the prologue does not take (gemv_pre_terms). */
int cuda_op_matmul_qkv_rope(struct backend *be, void *q, void *k, void *v, const void *x,
                            const struct backend_prenorm *pre, const struct weight *const ws[3],
                            const struct weight *const biases[3], const struct kv_layer *kv, const struct batch *b,
                            int n_heads, const struct rope_params *rp) {
  struct cuda_backend *cb = cuda_be(be);
  const int T = b->num_tokens, hd = kv->head_dim, nkv = kv->n_kv_heads;
  const int quant = cuda_quant_type(ws[0]->dtype) >= 0; /* then the integer-dot GEMV (cuda_quant_gemv.cu) */
  if (!cb->fused_rope || be->act_dtype != DTYPE_BF16 ||
      (quant ? !cuda_quant_fusable(cb, ws, 3, T) : !gemv_fusable(cb, ws, 3, T)) ||
      (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3) ||
      !cuda_block_size_ok(kv->block_size) || hd <= 0 || hd % 2 || rp->rot_dim <= 0 || rp->rot_dim > hd ||
      rp->rot_dim % 2 || rp->inv_freq_long)
    return 1;
  if (ws[0]->rows != (int64_t)n_heads * hd || ws[1]->rows != (int64_t)nkv * hd || ws[2]->rows != (int64_t)nkv * hd)
    return ERR("cuda matmul_qkv_rope: q/k/v weights have %lld/%lld/%lld rows for %d/%d/%d heads of %d",
               (long long)ws[0]->rows, (long long)ws[1]->rows, (long long)ws[2]->rows, n_heads, nkv, nkv, hd);
  const int f8 = kv->dtype == DTYPE_F8E4M3;
  if (f8 && !(kv->k_scale > 0.0f && kv->v_scale > 0.0f))
    return ERR("cuda matmul_qkv_rope: f8e4m3 KV scales %g / %g must be > 0", (double)kv->k_scale,
               (double)kv->v_scale);
  gemv_rope r = {};
  r.positions = b->positions;
  r.slots = b->slot_mapping;
  r.inv_freq = rp->inv_freq;
  r.kc = kv->k;
  r.vc = kv->v;
  r.num_slots = (long long)kv->num_blocks * kv->block_size;
  r.k_scale = f8 ? kv->k_scale : 1.0f;
  r.v_scale = f8 ? kv->v_scale : 1.0f;
  r.mscale = rp->mscale;
  r.hd = hd;
  r.rot_dim = rp->rot_dim;
  r.neox = rp->neox;
  r.n_kv = nkv;
  r.bs = kv->block_size;
  r.kv_f8 = f8;
  r.pq = n_heads * hd / 2;
  r.pk = nkv * hd / 2;
  r.early = cb->epi_early;
  void *const outs[3] = {q, k, v};
  if (quant)
    return cuda_quant_matmul_qkv_rope(be, outs, x, pre, ws, biases, &r, T);
  const int K = (int)ws[0]->cols;
  gemv_pre p = {};
  if (pre) {
    int terms = gemv_pre_terms(cb, pre, K, T, &p);
    if (terms <= 0)
      return terms < 0 ? -1 : 1;
  }
  gemv_multi m;
  long long rows = cuda_matmul_set_fill(&m, 3, outs, ws, biases, INT32_MAX - 2 * CUDA_GEMV_PRE_ROWS_MAX * 4);
  if (rows <= 0)
    return rows < 0 ? -1 : 1;
  const unsigned pairs = (unsigned)(rows / 2);
  const bf16 *X = (const bf16 *)x;
  if (gemv_ring_ok(cb, T, K)) {
    gemv_ring g = {};
    g.units = (int)pairs;
    g.K = K;
    CUDA_CHECK((pre ? gemv_ring_launch<RING_QKV, true>(cb, g, m, r, X, p)
                    : gemv_ring_launch<RING_QKV, false>(cb, g, m, r, X, p)));
    return 0;
  }
  if (pre) {
    CUDA_CHECK(gemv_pre_shape(cb, [&](auto nw, auto reg) {
      return qkv_rope_pre_launch<decltype(nw)::value, decltype(reg)::value>(cb, pairs, m, r, X, K, p, T);
    }));
    return 0;
  }
  const dim3 grid((pairs + GEMV_WARPS - 1) / GEMV_WARPS), thr(GEMV_WARPS * 32);
  cudaError_t err = cudaSuccess;
#define GEMV_CASE(c) \
  case c: err = cuda_pdl_launch(cb, gemv_qkv_rope_kernel<c>, grid, thr, 0, m, r, X, K, cb->gemv_reg); break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  CUDA_CHECK(err);
  return 0;
}

CUDA_PRELOAD_ANCHOR(gemv)
