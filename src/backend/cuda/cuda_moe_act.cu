/* cuda_moe_act.cu - the CUDA backend's ops of Gemma 2 and Mixtral: GeGLU (tanh GELU), scale,
 * logit softcapping, MoE routing and combine. Semantics and the CPU reference: backend.h,
 * cpu_act.c, cpu_moe.c. Activations are BF16, arithmetic f32. */
#include "backend/cuda/cuda_backend.h"

typedef __nv_bfloat16 bf16;

#define MOE_MAX_EXPERTS 256 /* the same bound as the CPU's CPU_MOE_MAX_EXPERTS */
#define MOE_MAX_K 8         /* chosen experts per token the routing kernel keeps in registers */
#define MOE_THREADS 1024    /* one block routes every token: 32 warps */

static int grid_for(size_t n, int threads) {
  size_t g = (n + threads - 1) / threads;
  return g > 65535 * 32 ? 65535 * 32 : (int)(g ? g : 1);
}

static int check_act(struct backend *be, const char *op) {
  if (be->act_dtype != DTYPE_BF16)
    return ERR("cuda %s: activation dtype %s (expected bf16)", op, dtype_name(be->act_dtype));
  return 0;
}

/* ---- GeGLU: out = gelu_tanh(gate) * up; out may alias gate ---- */
__global__ void gelu_tanh_mul_kernel(bf16 *out,        /* (n) */
                                     const bf16 *gate, /* (n) */
                                     const bf16 *up,   /* (n) */
                                     size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float x = __bfloat162float(gate[i]);
    float g = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    out[i] = __float2bfloat16(g * __bfloat162float(up[i]));
  }
}

int cuda_op_gelu_tanh_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F) {
  if (check_act(be, "gelu_tanh_mul"))
    return -1;
  if (T < 0 || F < 0)
    return ERR("cuda gelu_tanh_mul: T = %d, F = %d", T, F);
  size_t n = (size_t)T * F;
  if (n == 0)
    return 0;
  gelu_tanh_mul_kernel<<<grid_for(n, 256), 256, 0, cuda_be(be)->stream>>>((bf16 *)out, (const bf16 *)gate,
                                                                          (const bf16 *)up, n);
  CUDA_LAUNCH_CHECK();
  return 0;
}

/* ---- scale: x *= bf16(s), rounded to bf16 (HF multiplies by a normalizer tensor of x's dtype) ---- */
__global__ void scale_kernel(bf16 *x, /* (n) */
                             float s, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(__bfloat162float(x[i]) * s);
}

int cuda_op_scale(struct backend *be, void *x, size_t n, float s) {
  if (check_act(be, "scale"))
    return -1;
  if (n == 0)
    return 0;
  float sb = bf16_to_f32(f32_to_bf16(s));
  scale_kernel<<<grid_for(n, 256), 256, 0, cuda_be(be)->stream>>>((bf16 *)x, sb, n);
  CUDA_LAUNCH_CHECK();
  return 0;
}

/* ---- final logit softcapping on F32 logits: x = cap * tanh(x / cap) ---- */
__global__ void softcap_kernel(float *x, /* (n) */
                               float cap, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

int cuda_op_softcap(struct backend *be, float *logits, int n, int vocab, float cap) {
  if (!(cap > 0) || n < 0 || vocab < 0)
    return ERR("cuda softcap: cap %g (must be > 0), %d rows of %d", (double)cap, n, vocab);
  size_t total = (size_t)n * vocab;
  if (total == 0)
    return 0;
  softcap_kernel<<<grid_for(total, 256), 256, 0, cuda_be(be)->stream>>>(logits, cap, total);
  CUDA_LAUNCH_CHECK();
  return 0;
}

/* ---- MoE routing. One block of MOE_THREADS threads, one thread per token (chunks of
 * MOE_THREADS tokens). Each token's choice is computed twice, identically: pass 1 counts rows
 * per expert (shared atomics: the counts do not depend on order), then the exclusive scan gives
 * expert_start; pass 2 places rows stably: a token's rank among the chunk's tokens that chose
 * expert e comes from warp ballots (rank in the warp + the counts of earlier warps), after the
 * rows of earlier chunks (base[e]). So the layout equals the CPU's counting sort exactly. ---- */
__device__ void moe_choose(const float *l, /* (E) router logits of one token */
                           int E, int k, int *sel, float *w) {
  float m = l[0];
  for (int e = 1; e < E; e++)
    m = fmaxf(m, l[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; e++)
    sum += expf(l[e] - m);
  /* the k largest logits (softmax is monotone), lowest id first on ties, then in id order */
  int n = 0;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < n; i++)
        taken |= sel[i] == e;
      if (!taken && (best < 0 || l[e] > l[best]))
        best = e;
    }
    sel[n++] = best;
  }
  for (int a = 1; a < k; a++) /* insertion sort by id */
    for (int b = a; b > 0 && sel[b - 1] > sel[b]; b--) {
      int t = sel[b];
      sel[b] = sel[b - 1];
      sel[b - 1] = t;
    }
  float ws = 0.0f;
  for (int j = 0; j < k; j++) {
    w[j] = expf(l[sel[j]] - m) / sum;
    ws += w[j];
  }
  for (int j = 0; j < k; j++)
    w[j] /= ws;
}

__global__ void __launch_bounds__(MOE_THREADS) moe_route_kernel(
    const float *logits,   /* (T, E) */
    int T, int E, int k,
    int32_t *row_token,    /* (T * k) */
    float *row_weight,     /* (T * k) */
    int32_t *token_rows,   /* (T, k) */
    int32_t *expert_start) /* (E + 1) */ {
  __shared__ int count[MOE_MAX_EXPERTS + 1];
  __shared__ int base[MOE_MAX_EXPERTS];
  __shared__ unsigned short wcnt[MOE_MAX_EXPERTS][MOE_THREADS / 32];
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e <= E; e += blockDim.x)
    count[e] = 0;
  __syncthreads();
  int sel[MOE_MAX_K];
  float w[MOE_MAX_K];
  for (int t = tid; t < T; t += blockDim.x) {
    moe_choose(logits + (size_t)t * E, E, k, sel, w);
    for (int j = 0; j < k; j++)
      atomicAdd(&count[sel[j]], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int e = 0; e < E; e++) {
      int c = count[e];
      base[e] = run;
      expert_start[e] = run;
      run += c;
    }
    expert_start[E] = run;
  }
  __syncthreads();
  for (int t0 = 0; t0 < T; t0 += blockDim.x) {
    int t = t0 + tid;
    bool live = t < T;
    if (live)
      moe_choose(logits + (size_t)t * E, E, k, sel, w);
    unsigned lt = (1u << lane) - 1u;
    int rank[MOE_MAX_K];
    for (int e = 0; e < E; e++) {
      bool mine = false;
      int jj = 0;
      for (int j = 0; j < k; j++)
        if (live && sel[j] == e) {
          mine = true;
          jj = j;
        }
      unsigned bal = __ballot_sync(0xffffffffu, mine);
      if (lane == 0)
        wcnt[e][warp] = (unsigned short)__popc(bal);
      if (mine)
        rank[jj] = __popc(bal & lt);
    }
    __syncthreads();
    if (live) {
      for (int j = 0; j < k; j++) {
        int e = sel[j], r = base[e] + rank[j];
        for (int v = 0; v < warp; v++)
          r += wcnt[e][v];
        row_token[r] = t;
        row_weight[r] = w[j];
        token_rows[(size_t)t * k + j] = r;
      }
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) {
      int s = 0;
      for (int v = 0; v < (int)(blockDim.x >> 5); v++)
        s += wcnt[e][v];
      base[e] += s;
    }
    __syncthreads();
  }
}

int cuda_op_moe_route(struct backend *be, const float *router_logits, int T, int E, int k, int32_t *row_token,
                      float *row_weight, int32_t *token_rows, int32_t *expert_start, int32_t *expert_start_host) {
  struct cuda_backend *cb = cuda_be(be);
  if (E < 1 || E > MOE_MAX_EXPERTS || k < 1 || k > E || k > MOE_MAX_K || T < 0)
    return ERR("cuda moe_route: %d experts, top %d, %d tokens (need 1 <= k <= E <= %d, k <= %d)", E, k, T,
               MOE_MAX_EXPERTS, MOE_MAX_K);
  moe_route_kernel<<<1, MOE_THREADS, 0, cb->stream>>>(router_logits, T, E, k, row_token, row_weight, token_rows,
                                                      expert_start);
  CUDA_LAUNCH_CHECK();
  CUDA_CHECK(cudaMemcpyAsync(expert_start_host, expert_start, sizeof(int32_t) * (size_t)(E + 1),
                             cudaMemcpyDeviceToHost, cb->stream));
  CUDA_CHECK(cudaStreamSynchronize(cb->stream));
  return 0;
}

/* ---- MoE combine: out[t] = sum_j w[r] * y[r], r = token_rows[t, j]; one block per token ---- */
__global__ void moe_combine_kernel(bf16 *out,                /* (T, D) */
                                   const bf16 *y,            /* (T * k, D) */
                                   const int32_t *token_rows, /* (T, k) */
                                   const float *row_weight,  /* (T * k) */
                                   int k, int D) {
  int t = blockIdx.x;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      int r = token_rows[(size_t)t * k + j];
      acc += row_weight[r] * __bfloat162float(y[(size_t)r * D + d]);
    }
    out[(size_t)t * D + d] = __float2bfloat16(acc);
  }
}

int cuda_op_moe_combine(struct backend *be, void *out, const void *y, const int32_t *token_rows,
                        const float *row_weight, int T, int k, int D) {
  if (check_act(be, "moe_combine"))
    return -1;
  if (T <= 0)
    return T == 0 ? 0 : ERR("cuda moe_combine: T = %d", T);
  int threads = D >= 256 ? 256 : ((D + 31) / 32) * 32;
  moe_combine_kernel<<<T, threads, 0, cuda_be(be)->stream>>>((bf16 *)out, (const bf16 *)y, token_rows, row_weight,
                                                             k, D);
  CUDA_LAUNCH_CHECK();
  return 0;
}

CUDA_PRELOAD_ANCHOR(moe_act)
