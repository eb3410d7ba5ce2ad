/* cuda_gemv.cu - decode-sized bf16 matmuls: out(T, N) = x(T, K) @ W(N, K)^T for T up to
 * CUDA_GEMV_MAX_T rows, reading every weight byte once per call at close to the memory
 * bandwidth, where cuBLAS's GEMM kernels (tiled for large T) leave most of it unused.
 *
 * One warp per output feature (weight row): lane l multiplies the 8 columns [e + 8 l, +8) of
 * the row (one 16-byte load) with the same columns of each of the T activation rows, a warp
 * step covering 256 columns; the loop issues four steps' weight loads before using them, so
 * each warp keeps 4 x 512 bytes in flight (8 was measured with PDL: slower on both shapes, the
 * registers costing more occupancy than the loads gain; bench/RESULTS.md, "Programmatic dependent
 * launch"). The first four steps are prefetched into L2 before pdl_wait() (cuda_pdl.cuh).
 * Sums are f32 (fma), reduced over the warp by shuffles. K must be a multiple of 8 (16-byte
 * rows); callers fall back to cuBLAS otherwise.
 *
 * Fused forms (backend.h, "Fused small ops"): matmul_n runs one grid over the rows of several
 * matrices that read the same x (q/k/v with their biases, gate/up), and matmul_silu_mul gives
 * each warp a gate row and its up row and writes silu(g) * u, so the (T, F) products never go
 * to memory. Both round like the separate ops (the product to bf16, then + bias to bf16; g and
 * u to bf16 before silu_mul's f32 arithmetic), so they equal them up to summation order. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_quant.cuh" /* cq_bf16x8_f32, shared with the quantized GEMV */

typedef __nv_bfloat16 bf16;

#define GEMV_WARPS 4 /* rows per block */

template <int NT>
__device__ __forceinline__ void gemv_step(uint4 wu, const bf16 *x, int K, int e, float *acc) {
  float wv[8];
  cq_bf16x8_f32(wu, wv);
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float xv[8];
    cq_bf16x8_f32(__ldg((const uint4 *)(x + (size_t)t * K + e)), xv);
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

/* The dot products of R weight rows WR[r] with the T activation rows of x, lane LANE's share
 * into acc[r][t] (not yet reduced over the warp). Four steps' loads per row go out first.
 * Before pdl_wait() the rows' first four steps are prefetched into L2 (the weights never change
 * during a step, cuda_pdl.cuh), so the matrix starts streaming while the kernel before this one
 * drains; into L2 rather than registers, because holding them in registers across the wait
 * takes registers, so warps per SM (the depth-8 form that did so measured slower: bench/RESULTS.md,
 * "Programmatic dependent launch"). The trigger comes after the wait: the next kernel's blocks may launch
 * (and prefetch) while this one streams, the kernel after that only once this one's wait has
 * passed. The loop itself is the one from before PDL, so the sums have the same bits. */
template <int NT, int R>
__device__ __forceinline__ void gemv_rows(const bf16 *const *wr, const bf16 *x, int K, int lane,
                                          float (*acc)[NT]) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      acc[r][t] = 0.0f;
  int e = lane * 8;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (e + 256 * j < K)
        prefetch_l2(wr[r] + e + 256 * j);
  pdl_wait();    /* x is written by the kernel before */
  pdl_trigger(); /* only now: the next kernel may launch, the one after it not yet */
  for (; e + 768 < K; e += 1024) { /* four steps, loads first */
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
        gemv_step<NT>(w[r][j], x, K, e + 256 * j, acc[r]);
  }
  for (; e < K; e += 256)
#pragma unroll
    for (int r = 0; r < R; r++)
      gemv_step<NT>(__ldg((const uint4 *)(wr[r] + e)), x, K, e, acc[r]);
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++)
      acc[r][t] = warp_total(acc[r][t]);
}

template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(void *out, int out_f32, const bf16 *W, const bf16 *x, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (row >= N)
    return;
  const bf16 *wr[1] = {W + (size_t)row * K};
  float acc[1][NT];
  gemv_rows<NT, 1>(wr, x, K, lane, acc);
  if (lane == 0)
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (out_f32)
        ((float *)out)[(size_t)t * N + row] = acc[0][t];
      else
        ((bf16 *)out)[(size_t)t * N + row] = __float2bfloat16(acc[0][t]);
    }
}

/* Up to BACKEND_MATMUL_N_MAX matrices in one grid (struct cuda_matmul_set, cuda_backend.h). */
typedef struct cuda_matmul_set gemv_multi;

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

template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_multi_kernel(const __grid_constant__ gemv_multi m, const bf16 *x, int K) {
  const int lane = threadIdx.x & 31;
  const int g = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (g >= m.row0[BACKEND_MATMUL_N_MAX])
    return;
  int i = 0;
#pragma unroll
  for (int j = 1; j < BACKEND_MATMUL_N_MAX; j++)
    i += g >= m.row0[j];
  const int row = g - m.row0[i], N = m.N[i];
  const bf16 *wr[1] = {(const bf16 *)m.W[i] + (size_t)row * K};
  float acc[1][NT];
  gemv_rows<NT, 1>(wr, x, K, lane, acc);
  if (lane == 0) {
    const void *bias = m.bias[i];
    float b = !bias ? 0.0f : m.bias_f32[i] ? ((const float *)bias)[row] : __bfloat162float(((const bf16 *)bias)[row]);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      bf16 v = __float2bfloat16(acc[0][t]);
      if (bias)
        v = __float2bfloat16(__bfloat162float(v) + b);
      ((bf16 *)m.out[i])[(size_t)t * N + row] = v;
    }
  }
}

/* out(T, F) = silu(x Wg^T) * (x Wu^T): warp f takes gate row f and up row f. */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_silu_mul_kernel(bf16 *out, const bf16 *Wg, const bf16 *Wu, const bf16 *x, int F, int K) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (row >= F)
    return;
  const bf16 *wr[2] = {Wg + (size_t)row * K, Wu + (size_t)row * K};
  float acc[2][NT];
  gemv_rows<NT, 2>(wr, x, K, lane, acc);
  if (lane == 0)
#pragma unroll
    for (int t = 0; t < NT; t++) { /* as silu_mul_kernel on the bf16 products */
      float gv = __bfloat162float(__float2bfloat16(acc[0][t])), uv = __bfloat162float(__float2bfloat16(acc[1][t]));
      out[(size_t)t * F + row] = __float2bfloat16(gv / (1.0f + __expf(-gv)) * uv);
    }
}

#define GEMV_SWITCH(T, CASE)                                                                        \
  switch (T) {                                                                                      \
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)                                 \
  }

int cuda_gemv_bf16(struct backend *be, void *out, const void *x, const struct weight *w, int T, int out_f32) {
  struct cuda_backend *cb = cuda_be(be);
  int N = (int)w->rows, K = (int)w->cols;
  if (T < 1 || T > CUDA_GEMV_MAX_T || K % 8 || w->dtype != DTYPE_BF16)
    return ERR("cuda gemv: T %d (1..%d), K %d (a multiple of 8), dtype %s (bf16)", T, CUDA_GEMV_MAX_T, K,
               dtype_name(w->dtype));
  dim3 grid((unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS));
  const bf16 *W = (const bf16 *)w->data, *X = (const bf16 *)x;
  const dim3 thr(GEMV_WARPS * 32);
  cudaError_t err = cudaSuccess;
#define GEMV_CASE(n) \
  case n: err = cuda_pdl_launch(cb, gemv_kernel<n>, grid, thr, 0, out, out_f32, W, X, N, K); break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  CUDA_CHECK(err);
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

int cuda_op_matmul_n(struct backend *be, int n, void *const outs[], const void *x, const struct backend_prenorm *pre,
                     const struct weight *const ws[], const struct weight *const biases[], int T) {
  struct cuda_backend *cb = cuda_be(be);
  if (n < 1 || n > BACKEND_MATMUL_N_MAX)
    return ERR("cuda matmul_n: n = %d (1..%d)", n, BACKEND_MATMUL_N_MAX);
  if (cuda_quant_type(ws[0]->dtype) >= 0) /* quantized weights: cuda_quant_gemv.cu */
    return cuda_quant_matmul_n(be, n, outs, x, pre, ws, biases, T);
  if (pre)
    return 1; /* the caller's rmsnorm first */
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
  case c: err = cuda_pdl_launch(cb, gemv_multi_kernel<c>, grid, thr, 0, m, X, K); break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  CUDA_CHECK(err);
  return 0;
}

int cuda_op_matmul_silu_mul(struct backend *be, void *out, const void *x, const struct backend_prenorm *pre,
                            const struct weight *gate, const struct weight *up, int T) {
  struct cuda_backend *cb = cuda_be(be);
  if (cuda_quant_type(gate->dtype) >= 0) /* quantized weights: cuda_quant_gemv.cu */
    return cuda_quant_matmul_silu_mul(be, out, x, pre, gate, up, T);
  if (pre)
    return 1; /* the caller's rmsnorm first */
  const struct weight *ws[2] = {gate, up};
  if (gate->rows != up->rows)
    return ERR("cuda matmul_silu_mul: gate has %lld rows, up %lld", (long long)gate->rows, (long long)up->rows);
  if (be->act_dtype != DTYPE_BF16 || !cb->fused_silu || !gemv_fusable(cb, ws, 2, T))
    return 1; /* matmul_n, then silu_mul */
  int F = (int)gate->rows, K = (int)gate->cols;
  dim3 grid((unsigned)((F + GEMV_WARPS - 1) / GEMV_WARPS));
  const bf16 *Wg = (const bf16 *)gate->data, *Wu = (const bf16 *)up->data, *X = (const bf16 *)x;
  const dim3 thr(GEMV_WARPS * 32);
  cudaError_t err = cudaSuccess;
#define GEMV_CASE(c) \
  case c: err = cuda_pdl_launch(cb, gemv_silu_mul_kernel<c>, grid, thr, 0, (bf16 *)out, Wg, Wu, X, F, K); break;
  GEMV_SWITCH(T, GEMV_CASE)
#undef GEMV_CASE
  CUDA_CHECK(err);
  return 0;
}
