/* cuda_ops.cu - the CUDA backend's element-wise and row kernels: embedding gather, RMSNorm with
 * fused residual add, RoPE, SiLU-mul, KV write through slot_mapping, row gather, bias add.
 * Activations are BF16; all arithmetic is f32. Part 1 kernels: plain and correct, one thread per
 * element or per pair, grid-stride loops; faster versions replace them behind the same launchers.
 * Every kernel here is launched with programmatic dependent launch and starts with PDL_ENTER()
 * (cuda_pdl.cuh): it reads nothing before the kernel ahead of it has completed. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_rope.cuh" /* rope_freqs, rope_sincos, rope_rotate, kv_store */

typedef __nv_bfloat16 bf16;

/* Element i of a weight that is F32 or BF16 (the two dtypes cuda_weight_from_host makes). */
__device__ __forceinline__ float weight_at(const void *p, int is_f32, size_t i) {
  return is_f32 ? ((const float *)p)[i] : __bfloat162float(((const bf16 *)p)[i]);
}

static int check_act(struct backend *be, const char *op) {
  if (be->act_dtype != DTYPE_BF16)
    return ERR("cuda %s: activation dtype %s (expected bf16)", op, dtype_name(be->act_dtype));
  return 0;
}

static int grid_for(size_t n, int threads) {
  size_t g = (n + threads - 1) / threads;
  return g > 65535 * 32 ? 65535 * 32 : (int)(g ? g : 1);
}

/* ---- embedding: out(T, dim) = emb[ids[t]]; ids outside [0, vocab) give a zero row ---- */
__global__ void embed_kernel(bf16 *out,          /* (T, dim) */
                             const void *emb,    /* (vocab, dim) f32 or bf16 */
                             int emb_f32, int64_t vocab,
                             const int32_t *ids, /* (T) */
                             int dim) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  int t = blockIdx.x;
  int32_t id = ids[t];
  bool ok = id >= 0 && id < vocab;
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    out[(size_t)t * dim + d] = __float2bfloat16(ok ? weight_at(emb, emb_f32, (size_t)id * dim + d) : 0.0f);
}

int cuda_op_embed(struct backend *be, void *out, const struct weight *emb, const int32_t *ids, int T) {
  if (check_act(be, "embed"))
    return -1;
  if (T <= 0)
    return T == 0 ? 0 : ERR("cuda embed: T = %d", T);
  if (cuda_quant_type(emb->dtype) >= 0)
    return cuda_quant_embed(be, out, emb, ids, T);
  CUDA_CHECK(cuda_pdl_launch(cuda_be(be), embed_kernel, dim3(T), dim3(256), 0, (bf16 *)out, emb->data,
                             (int)(emb->dtype == DTYPE_F32), (int64_t)emb->rows, ids, (int)emb->cols));
  return 0;
}

/* ---- block reduction helpers ---- */
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. */
__device__ float block_sum(float v) {
  __shared__ float part[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads(); /* part[] may still be read by a previous call */
  if (lane == 0)
    part[wid] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : 0.0f;
  return warp_sum(v);
}

/* ---- RMSNorm: with residual, residual += x (rounded to bf16, as an HF bf16 model stores its
 * residual stream), then out = residual * rsqrt(mean(residual^2) + eps) * w. Each thread reads
 * and writes the same indices in both passes, so out may alias x. ---- */
__global__ void rmsnorm_kernel(bf16 *out,      /* (T, dim) */
                               bf16 *residual, /* (T, dim) or NULL */
                               const bf16 *x,  /* (T, dim) */
                               const void *w,  /* (dim) f32 or bf16 */
                               int w_f32, int dim, float eps) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  size_t row = (size_t)blockIdx.x * dim;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float v = __bfloat162float(x[row + d]);
    if (residual) {
      bf16 r = __float2bfloat16(v + __bfloat162float(residual[row + d]));
      residual[row + d] = r;
      v = __bfloat162float(r);
    }
    ss = __fmaf_rn(v, v, ss); /* as norm_inv (cuda_norm.cuh) */
  }
  float inv = norm_inv_of(block_sum(ss), dim, eps); /* cuda_norm.cuh: the prologues' arithmetic */
  const bf16 *src = residual ? residual : x;
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    out[row + d] = norm_elem(src[row + d], inv, weight_at(w, w_f32, d));
}

int cuda_op_rmsnorm(struct backend *be, void *out, void *residual, const void *x, const struct weight *w,
                    int T, int dim, float eps) {
  if (check_act(be, "rmsnorm"))
    return -1;
  if (T <= 0)
    return T == 0 ? 0 : ERR("cuda rmsnorm: T = %d", T);
  if (w->rows * w->cols != dim)
    return ERR("cuda rmsnorm: weight has %lld elements, dim is %d", (long long)(w->rows * w->cols), dim);
  int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
  CUDA_CHECK(cuda_pdl_launch(cuda_be(be), rmsnorm_kernel, dim3(T), dim3(threads), 0, (bf16 *)out, (bf16 *)residual,
                             (const bf16 *)x, w->data, (int)(w->dtype == DTYPE_F32), dim, eps));
  return 0;
}

/* ---- RoPE, in place on q(T, n_heads, hd) and k(T, n_kv, hd). One block per token, one thread
 * per frequency i < rot_dim/2, looping over heads so that each angle's sin/cos is computed once.
 * The angle is the f32 product pos * inv_freq (as HF computes it); its sin/cos are taken in double
 * because --use_fast_math would turn sincosf into the intrinsic, which is inaccurate for the
 * large angles of long contexts (the helpers: cuda_rope.cuh, shared with the fused GEMV). ---- */
__global__ void rope_kernel(bf16 *q,                  /* (T, n_heads, hd) */
                            bf16 *k,                  /* (T, n_kv, hd) */
                            const int32_t *positions, /* (T) */
                            int n_heads, int n_kv, int hd,
                            const float *inv_freq,    /* (rot_dim / 2) */
                            int rot_dim, int neox,
                            const float *inv_freq_long, /* LongRoPE (see rope_params) or NULL */
                            int long_after, const int32_t *query_start, const int32_t *seq_lens,
                            int num_seqs, float mscale) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  int t = blockIdx.x;
  int half = rot_dim / 2;
  inv_freq = rope_freqs(t, inv_freq, inv_freq_long, long_after, query_start, seq_lens, num_seqs);
  float pos = (float)positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float sf, cf;
    rope_sincos(pos, inv_freq[i], mscale, &sf, &cf);
    int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    for (int h = 0; h < n_heads + n_kv; h++) {
      bf16 *p = h < n_heads ? q + ((size_t)t * n_heads + h) * hd : k + ((size_t)t * n_kv + (h - n_heads)) * hd;
      rope_rotate(p + i0, p + i1, cf, sf);
    }
  }
}

int cuda_op_rope(struct backend *be, void *q, void *k, const int32_t *positions, int T, int n_heads,
                 int n_kv_heads, int head_dim, const struct rope_params *rp) {
  if (check_act(be, "rope"))
    return -1;
  if (T <= 0)
    return T == 0 ? 0 : ERR("cuda rope: T = %d", T);
  if (rp->rot_dim <= 0 || rp->rot_dim > head_dim || rp->rot_dim % 2)
    return ERR("cuda rope: rot_dim %d with head_dim %d", rp->rot_dim, head_dim);
  int half = rp->rot_dim / 2;
  int threads = half >= 128 ? 128 : ((half + 31) / 32) * 32;
  CUDA_CHECK(cuda_pdl_launch(cuda_be(be), rope_kernel, dim3(T), dim3(threads), 0, (bf16 *)q, (bf16 *)k, positions,
                             n_heads, n_kv_heads, head_dim, rp->inv_freq, rp->rot_dim, rp->neox, rp->inv_freq_long,
                             rp->long_after, rp->query_start, rp->seq_lens, rp->num_seqs, rp->mscale));
  return 0;
}

/* ---- SiLU-mul: out = silu(gate) * up, element-wise; out may alias gate ---- */
__global__ void silu_mul_kernel(bf16 *out,        /* (n) */
                                const bf16 *gate, /* (n) */
                                const bf16 *up,   /* (n) */
                                size_t n) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = __bfloat162float(gate[i]);
    out[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * __bfloat162float(up[i]));
  }
}

int cuda_op_silu_mul(struct backend *be, void *out, const void *gate, const void *up, int T, int F) {
  if (check_act(be, "silu_mul"))
    return -1;
  size_t n = (size_t)T * F;
  if (n == 0)
    return 0;
  CUDA_CHECK(cuda_pdl_launch(cuda_be(be), silu_mul_kernel, dim3(grid_for(n, 256)), dim3(256), 0, (bf16 *)out,
                             (const bf16 *)gate, (const bf16 *)up, n));
  return 0;
}

/* ---- reshape and cache: k,v(T, n_kv, hd) -> cache (num_blocks, n_kv, bs, hd) at slot_mapping.
 * Slots < 0 (padding) and slots past the pool are skipped. One block per token. An f8e4m3 cache
 * gets e4m3(x / scale) (nearest even, saturated to +-448, as the CPU's f32_to_f8e4m3). ---- */
template <class E>
__global__ void kv_write_kernel(E *kc,                /* (num_blocks, n_kv, bs, hd) */
                                E *vc,                /* (num_blocks, n_kv, bs, hd) */
                                const bf16 *k,        /* (T, n_kv, hd) */
                                const bf16 *v,        /* (T, n_kv, hd) */
                                const int32_t *slots, /* (T) */
                                int n_kv, int bs, int hd, int64_t num_slots, float k_scale, float v_scale) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  int t = blockIdx.x;
  int32_t slot = slots[t];
  if (slot < 0 || slot >= num_slots)
    return;
  int blk = slot / bs, off = slot % bs;
  int n = n_kv * hd;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int h = i / hd, d = i % hd;
    size_t dst = (((size_t)blk * n_kv + h) * bs + off) * hd + d;
    kv_store(kc, dst, k[(size_t)t * n + i], k_scale);
    kv_store(vc, dst, v[(size_t)t * n + i], v_scale);
  }
}

int cuda_op_kv_write(struct backend *be, const struct kv_layer *kv, const void *k, const void *v,
                     const struct batch *b) {
  if (check_act(be, "kv_write"))
    return -1;
  if (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3)
    return ERR("cuda kv_write: kv cache dtype %s is not supported (bf16 or f8e4m3)", dtype_name(kv->dtype));
  if (!cuda_block_size_ok(kv->block_size))
    return ERR("--pa-block-size %d is not supported on CUDA (use " CUDA_BLOCK_SIZES ")", kv->block_size);
  if (kv->dtype == DTYPE_F8E4M3 && !(kv->k_scale > 0.0f && kv->v_scale > 0.0f))
    return ERR("cuda kv_write: f8e4m3 KV scales %g / %g must be > 0", (double)kv->k_scale, (double)kv->v_scale);
  if (b->num_tokens <= 0)
    return 0;
  int n = kv->n_kv_heads * kv->head_dim;
  int threads = n >= 256 ? 256 : ((n + 31) / 32) * 32;
  int64_t slots = (int64_t)kv->num_blocks * kv->block_size;
  struct cuda_backend *cb = cuda_be(be);
  const dim3 grid(b->num_tokens), thr(threads);
  if (kv->dtype == DTYPE_F8E4M3)
    CUDA_CHECK(cuda_pdl_launch(cb, kv_write_kernel<uint8_t>, grid, thr, 0, (uint8_t *)kv->k, (uint8_t *)kv->v,
                               (const bf16 *)k, (const bf16 *)v, b->slot_mapping, kv->n_kv_heads, kv->block_size,
                               kv->head_dim, slots, kv->k_scale, kv->v_scale));
  else
    CUDA_CHECK(cuda_pdl_launch(cb, kv_write_kernel<bf16>, grid, thr, 0, (bf16 *)kv->k, (bf16 *)kv->v,
                               (const bf16 *)k, (const bf16 *)v, b->slot_mapping, kv->n_kv_heads, kv->block_size,
                               kv->head_dim, slots, 1.0f, 1.0f));
  return 0;
}

/* ---- RoPE fused with the KV write (backend.h, rope_kv_write): gridDim.y blocks per token
 * (blockIdx.x), which share its items. Each block puts the token's sin/cos in shared memory
 * first; then each thread rotates (head, pair) items of q and k, a rotated k element going both
 * back to k and into the cache; last, v and k's unrotated dims (Phi-3's partial rotary) are
 * stored. Items are dealt to the token's blocks round robin, and no item depends on another, so
 * the split changes no bit. Same arithmetic and roundings as rope_kernel followed by
 * kv_write_kernel, so the cache holds the same bytes. At decode (few tokens) the token's 2,560
 * pairs (8B shape) in one block of 256 threads were ten dependent load/store rounds on one SM:
 * rope_kv_split spreads them over several blocks (cuda_backend.h). ---- */
#define ROPE_KV_MAX_HALF 256 /* rot_dim / 2 (ROPE_MAX_FACTORS) */

template <class E>
__global__ void rope_kv_write_kernel(bf16 *q,                  /* (T, n_heads, hd) */
                                     bf16 *k,                  /* (T, n_kv, hd) */
                                     const bf16 *v,            /* (T, n_kv, hd) */
                                     E *kc, E *vc,             /* (num_blocks, n_kv, bs, hd) */
                                     const int32_t *positions, /* (T) */
                                     const int32_t *slots,     /* (T) */
                                     int n_heads, int n_kv, int hd, int bs, int64_t num_slots, float k_scale,
                                     float v_scale, const float *inv_freq, int rot_dim, int neox,
                                     const float *inv_freq_long, int long_after, const int32_t *query_start,
                                     const int32_t *seq_lens, int num_seqs, float mscale) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  __shared__ float s_sin[ROPE_KV_MAX_HALF], s_cos[ROPE_KV_MAX_HALF];
  const int t = blockIdx.x, half = rot_dim / 2;
  const int i0 = blockIdx.y * blockDim.x + threadIdx.x, stride = gridDim.y * blockDim.x; /* this block's items */
  inv_freq = rope_freqs(t, inv_freq, inv_freq_long, long_after, query_start, seq_lens, num_seqs);
  const float pos = (float)positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_sincos(pos, inv_freq[i], mscale, &s_sin[i], &s_cos[i]);
  __syncthreads();
  const int32_t slot = slots[t];
  const bool store = slot >= 0 && slot < num_slots;
  const int blk = store ? slot / bs : 0, off = store ? slot % bs : 0;
  const int nk = n_kv * hd;
  for (int j = i0; j < (n_heads + n_kv) * half; j += stride) {
    const int h = j / half, i = j % half;
    const int e0 = neox ? i : 2 * i, e1 = neox ? i + half : 2 * i + 1;
    const float sf = s_sin[i], cf = s_cos[i];
    bf16 *p = h < n_heads ? q + ((size_t)t * n_heads + h) * hd : k + ((size_t)t * n_kv + (h - n_heads)) * hd;
    rope_rotate(p + e0, p + e1, cf, sf);
    if (h >= n_heads && store) {
      size_t dst = (((size_t)blk * n_kv + (h - n_heads)) * bs + off) * hd;
      kv_store(kc, dst + e0, p[e0], k_scale);
      kv_store(kc, dst + e1, p[e1], k_scale);
    }
  }
  if (!store)
    return;
  for (int i = i0; i < nk; i += stride) {
    int h = i / hd, d = i % hd;
    size_t dst = (((size_t)blk * n_kv + h) * bs + off) * hd + d;
    kv_store(vc, dst, v[(size_t)t * nk + i], v_scale);
    if (d >= rot_dim)
      kv_store(kc, dst, k[(size_t)t * nk + i], k_scale);
  }
}

int cuda_op_rope_kv_write(struct backend *be, void *q, void *k, const void *v, const struct kv_layer *kv,
                          const struct batch *b, int n_heads, const struct rope_params *rp) {
  if (!cuda_be(be)->fused_ops || be->act_dtype != DTYPE_BF16 ||
      (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3) || !cuda_block_size_ok(kv->block_size) ||
      rp->rot_dim <= 0 || rp->rot_dim > kv->head_dim || rp->rot_dim % 2 || rp->rot_dim / 2 > ROPE_KV_MAX_HALF)
    return 1; /* rope then kv_write, which check (and name) what is wrong */
  if (kv->dtype == DTYPE_F8E4M3 && !(kv->k_scale > 0.0f && kv->v_scale > 0.0f))
    return ERR("cuda rope_kv_write: f8e4m3 KV scales %g / %g must be > 0", (double)kv->k_scale,
               (double)kv->v_scale);
  const int T = b->num_tokens;
  if (T <= 0)
    return T == 0 ? 0 : ERR("cuda rope_kv_write: T = %d", T);
  const int64_t slots = (int64_t)kv->num_blocks * kv->block_size;
  struct cuda_backend *cb = cuda_be(be);
#define ROPE_KV_ARGS(E)                                                                                     \
  (bf16 *)q, (bf16 *)k, (const bf16 *)v, (E *)kv->k, (E *)kv->v, b->positions, b->slot_mapping, n_heads,          \
      kv->n_kv_heads, kv->head_dim, kv->block_size, slots, kv->dtype == DTYPE_F8E4M3 ? kv->k_scale : 1.0f,         \
      kv->dtype == DTYPE_F8E4M3 ? kv->v_scale : 1.0f, rp->inv_freq, rp->rot_dim, rp->neox, rp->inv_freq_long,     \
      rp->long_after, rp->query_start, rp->seq_lens, rp->num_seqs, rp->mscale
  /* blocks per token: one per 256 (head, pair) items, while T * blocks stays within one block per
   * multiprocessor */
  const int pairs = (n_heads + kv->n_kv_heads) * (rp->rot_dim / 2);
  int parts = cb->rope_kv_split ? (pairs + 255) / 256 : 1;
  const int sms = cuda_sm_count(cb);
  if (parts > 1 && (int64_t)T * parts > sms)
    parts = T >= sms ? 1 : sms / T;
  const dim3 grid((unsigned)T, (unsigned)(parts > 0 ? parts : 1));
  if (kv->dtype == DTYPE_F8E4M3)
    CUDA_CHECK(cuda_pdl_launch(cb, rope_kv_write_kernel<uint8_t>, grid, dim3(256), 0, ROPE_KV_ARGS(uint8_t)));
  else
    CUDA_CHECK(cuda_pdl_launch(cb, rope_kv_write_kernel<bf16>, grid, dim3(256), 0, ROPE_KV_ARGS(bf16)));
#undef ROPE_KV_ARGS
  return 0;
}

/* ---- gather rows: out(n, dim) = x[idx[i]] ---- */
__global__ void gather_rows_kernel(bf16 *out,          /* (n, dim) */
                                   const bf16 *x,      /* (rows, dim) */
                                   const int32_t *idx, /* (n) */
                                   int dim) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  int i = blockIdx.x;
  size_t src = (size_t)idx[i] * dim, dst = (size_t)i * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    out[dst + d] = x[src + d];
}

int cuda_op_gather_rows(struct backend *be, void *out, const void *x, const int32_t *idx, int n, int dim) {
  if (check_act(be, "gather_rows"))
    return -1;
  if (n <= 0)
    return n == 0 ? 0 : ERR("cuda gather_rows: n = %d", n);
  CUDA_CHECK(cuda_pdl_launch(cuda_be(be), gather_rows_kernel, dim3(n), dim3(256), 0, (bf16 *)out, (const bf16 *)x,
                             idx, dim));
  return 0;
}

/* ---- bias: out(T, N) += bias(N), out bf16 or f32 ---- */
__global__ void add_bias_kernel(void *out,        /* (T, N) f32 or bf16; n = T * N elements */
                                int out_f32,
                                const void *bias, /* (N) f32 or bf16 */
                                int b_f32, int N, size_t n) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float b = weight_at(bias, b_f32, i % N);
    if (out_f32)
      ((float *)out)[i] += b;
    else
      ((bf16 *)out)[i] = __float2bfloat16(__bfloat162float(((bf16 *)out)[i]) + b);
  }
}

int cuda_op_add_bias(struct backend *be, void *out, int out_f32, const struct weight *bias, int T) {
  int N = (int)(bias->rows * bias->cols);
  size_t n = (size_t)T * N;
  if (n == 0)
    return 0;
  CUDA_CHECK(cuda_pdl_launch(cuda_be(be), add_bias_kernel, dim3(grid_for(n, 256)), dim3(256), 0, out, out_f32,
                             (const void *)bias->data, (int)(bias->dtype == DTYPE_F32), N, n));
  return 0;
}

CUDA_PRELOAD_ANCHOR(ops)
