/* cuda_attention.cu - paged attention over the block-table KV cache, for any mix of decode tokens
 * and prompt chunks (varlen queries, causal, GQA), with an online softmax in f32.
 *
 * Query token t of sequence b (query_start[b] <= t < query_start[b+1]) sees keys 0 .. ctx-1
 * with ctx = seq_lens[b] - q_len + (t - query_start[b]) + 1, i.e. its own position and everything
 * before it. The block size is a template parameter, so the logical -> physical slot split is a
 * shift and mask. With a sliding window (struct attn_params) the walk starts at key
 * ctx - window; with softcapping each score s becomes softcap * tanh(s / softcap).
 * Three part-1 kernels, chosen by shape:
 * - paged_attention_group_kernel: one warp per (token, KV head) for all its query heads, for
 *   n_heads / n_kv_heads in {1, 2, 4, 8} and head_dim in {8, 16, 32, 64, 128} (real models);
 * - paged_attention_lanes_kernel: one warp per (token, query head), other group sizes;
 * - paged_attention_kernel: any other head_dim (a multiple of 8 up to 256). */
#include "backend/cuda/cuda_backend.h"

typedef __nv_bfloat16 bf16;

#define ATTN_WARPS 4      /* warps (query heads) per thread block */
#define ATTN_MAX_HD 256   /* head_dim limit: q in shared memory and head_dim/32 accumulators per lane */

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

/* q . k for one key row k(hd) of bf16 (16-byte aligned, hd a multiple of 8), q(hd) in shared f32. */
__device__ __forceinline__ float attn_dot(const float *qs, const bf16 *k, int hd) {
  float s = 0.0f;
  const uint4 *k4 = (const uint4 *)k;
  for (int c = 0; c < hd / 8; c++) {
    uint4 u = k4[c];
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float2 f = __bfloat1622float2(p[j]);
      s += qs[c * 8 + 2 * j] * f.x + qs[c * 8 + 2 * j + 1] * f.y;
    }
  }
  return s;
}

/* The generic kernel (any head_dim, a multiple of 8 up to 256): the warp walks the keys in chunks
 * of 32, one key per lane for the scores (q . k, q scaled in shared memory), then folds the
 * chunk into the running max / sum / output, each lane owning head_dim/32 output dims. */
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

template <int BS>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
    paged_attention_kernel(bf16 *out,                  /* (T, n_heads, hd) */
                           const bf16 *q,              /* (T, n_heads, hd) */
                           const bf16 *kc,             /* (num_blocks, n_kv, BS, hd) */
                           const bf16 *vc,             /* (num_blocks, n_kv, BS, hd) */
                           const int32_t *query_start, /* (B+1) */
                           const int32_t *seq_lens,    /* (B) */
                           const int32_t *block_tables, /* (B, max_blocks) */
                           int T, int B, int max_blocks, int n_heads, int n_kv, int hd, float scale,
                           float softcap, int window) {
  __shared__ float q_sh[ATTN_WARPS][ATTN_MAX_HD];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t gw = (int64_t)blockIdx.x * ATTN_WARPS + warp;
  if (gw >= (int64_t)T * n_heads)
    return; /* whole warp leaves together; no block-wide barrier follows */
  int t = (int)(gw / n_heads), h = (int)(gw % n_heads);
  int b = attn_seq_of(query_start, B, t);
  int qs0 = query_start[b], q_len = query_start[b + 1] - qs0;
  int ctx = seq_lens[b] - q_len + (t - qs0) + 1;
  int kvh = h / (n_heads / n_kv);
  const bf16 *qrow = q + ((size_t)t * n_heads + h) * hd;
  float *qs = q_sh[warp];
  for (int d = lane; d < hd; d += 32)
    qs[d] = __bfloat162float(qrow[d]) * scale;
  __syncwarp();

  const int32_t *bt = block_tables + (size_t)b * max_blocks;
  const size_t head_stride = (size_t)BS * hd;  /* one kv head of one block */
  const size_t block_stride = (size_t)n_kv * head_stride;
  float m = -INFINITY, l = 0.0f;
  float acc[ATTN_MAX_HD / 32];
#pragma unroll
  for (int a = 0; a < ATTN_MAX_HD / 32; a++)
    acc[a] = 0.0f;

  for (int base = attn_first_key(ctx, window); base < ctx; base += 32) {
    int j = base + lane;
    float s = -INFINITY;
    size_t row = 0; /* element offset of key j's row in kc / vc */
    if (j < ctx) {
      int blk = bt[j / BS];
      row = (size_t)blk * block_stride + (size_t)kvh * head_stride + (size_t)(j % BS) * hd;
      s = attn_cap(attn_dot(qs, kc + row, hd), softcap);
    }
    float m_new = fmaxf(m, attn_warp_max(s)); /* finite: key `base` < ctx is always valid */
    float alpha = __expf(m - m_new);
    float p = j < ctx ? __expf(s - m_new) : 0.0f;
    l = l * alpha + attn_warp_sum(p);
#pragma unroll
    for (int a = 0; a < ATTN_MAX_HD / 32; a++)
      acc[a] *= alpha;
    int nvalid = ctx - base < 32 ? ctx - base : 32;
    for (int jj = 0; jj < nvalid; jj++) {
      float pj = __shfl_sync(0xffffffffu, p, jj);
      size_t rj = __shfl_sync(0xffffffffu, row, jj);
      const bf16 *vrow = vc + rj;
#pragma unroll
      for (int a = 0; a < ATTN_MAX_HD / 32; a++) {
        int d = lane + 32 * a;
        if (d < hd)
          acc[a] += pj * __bfloat162float(vrow[d]);
      }
    }
    m = m_new;
  }
  bf16 *orow = out + ((size_t)t * n_heads + h) * hd;
  float inv = ctx > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int a = 0; a < ATTN_MAX_HD / 32; a++) {
    int d = lane + 32 * a;
    if (d < hd)
      orow[d] = __float2bfloat16(acc[a] * inv);
  }
}

/* One warp per (token, query head), for head_dim HD in {8, 16, 32, 64, 128} when the group size
 * is not one the grouped kernel is compiled for: lanes own keys for the whole walk.
 * Lane i takes keys i, i + 32, ...: it computes q . k for its key, and adds p * v of its key
 * into its own full-length accumulator acc[HD] (registers), so a chunk's K and V rows are read
 * by 32 independent 16-byte loads with no per-key dependency chain. The running max is shared
 * by the warp (one warp max per chunk); each lane keeps its own partial sum of p. At the end the
 * lanes' accumulators and sums are added across the warp. */
template <int BS, int HD>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
    paged_attention_lanes_kernel(bf16 *out,                   /* (T, n_heads, HD) */
                                 const bf16 *q,               /* (T, n_heads, HD) */
                                 const bf16 *kc,              /* (num_blocks, n_kv, BS, HD) */
                                 const bf16 *vc,              /* (num_blocks, n_kv, BS, HD) */
                                 const int32_t *query_start,  /* (B+1) */
                                 const int32_t *seq_lens,     /* (B) */
                                 const int32_t *block_tables, /* (B, max_blocks) */
                                 int T, int B, int max_blocks, int n_heads, int n_kv, float scale,
                                 float softcap, int window) {
  __shared__ float q_sh[ATTN_WARPS][HD];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t gw = (int64_t)blockIdx.x * ATTN_WARPS + warp;
  if (gw >= (int64_t)T * n_heads)
    return; /* whole warp leaves together; no block-wide barrier follows */
  int t = (int)(gw / n_heads), h = (int)(gw % n_heads);
  int b = attn_seq_of(query_start, B, t);
  int qs0 = query_start[b], q_len = query_start[b + 1] - qs0;
  int ctx = seq_lens[b] - q_len + (t - qs0) + 1;
  int kvh = h / (n_heads / n_kv);
  const bf16 *qrow = q + ((size_t)t * n_heads + h) * HD;
  float *qs = q_sh[warp];
  for (int d = lane; d < HD; d += 32)
    qs[d] = __bfloat162float(qrow[d]) * scale;
  __syncwarp();

  const int32_t *bt = block_tables + (size_t)b * max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD;
  const size_t block_stride = (size_t)n_kv * BS * HD;
  float acc[HD];
#pragma unroll
  for (int d = 0; d < HD; d++)
    acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f; /* m: warp-wide running max; l: this lane's sum of p */
  for (int base = attn_first_key(ctx, window); base < ctx; base += 32) {
    int j = base + lane;
    bool valid = j < ctx;
    float s = -INFINITY;
    size_t row = 0;
    if (valid) {
      row = (size_t)bt[j / BS] * block_stride + head_off + (size_t)(j % BS) * HD;
      s = attn_cap(attn_dot(qs, kc + row, HD), softcap);
    }
    float m_new = fmaxf(m, attn_warp_max(s)); /* finite: key `base` < ctx is always valid */
    float alpha = __expf(m - m_new);
    float p = valid ? __expf(s - m_new) : 0.0f;
    l = l * alpha + p;
    m = m_new;
    const uint4 *v4 = (const uint4 *)(vc + row);
#pragma unroll
    for (int c = 0; c < HD / 8; c++) {
      uint4 u = valid ? v4[c] : make_uint4(0, 0, 0, 0);
      const __nv_bfloat162 *pv = (const __nv_bfloat162 *)&u;
#pragma unroll
      for (int k2 = 0; k2 < 4; k2++) {
        float2 f = __bfloat1622float2(pv[k2]);
        acc[c * 8 + 2 * k2] = acc[c * 8 + 2 * k2] * alpha + p * f.x;
        acc[c * 8 + 2 * k2 + 1] = acc[c * 8 + 2 * k2 + 1] * alpha + p * f.y;
      }
    }
  }
  l = attn_warp_sum(l);
  float inv = ctx > 0 ? 1.0f / l : 0.0f;
  bf16 *orow = out + ((size_t)t * n_heads + h) * HD;
#pragma unroll
  for (int d = 0; d < HD; d++) {
    float v = attn_warp_sum(acc[d]);
    if ((d & 31) == lane)
      orow[d] = __float2bfloat16(v * inv);
  }
}

/* The main kernel, for G = n_heads / n_kv_heads in {1, 2, 4, 8} and head_dim HD in
 * {8, 16, 32, 64, 128}: one warp per (query token, KV head) serves the G query heads that share
 * the KV head, so each K/V row is read once for all of them. A key's row is split over
 * LPR = HD / 8 lanes (16 bytes each, so a warp's loads of KPW = 32 / LPR consecutive rows are
 * coalesced); lane group `sub` walks keys j = sub, sub + KPW, ... with its own online softmax
 * (max m, sum l, and the 8 output dims of its slice in acc, per head), a dot product being LPR
 * partial sums added by shuffles within the group. At the end the KPW groups' states are merged
 * (rescaled to the larger max and added) by a butterfly over the warp. */
template <int BS, int HD, int G>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
    paged_attention_group_kernel(bf16 *out,                   /* (T, n_heads, HD) */
                                 const bf16 *q,               /* (T, n_heads, HD) */
                                 const bf16 *kc,              /* (num_blocks, n_kv, BS, HD) */
                                 const bf16 *vc,              /* (num_blocks, n_kv, BS, HD) */
                                 const int32_t *query_start,  /* (B+1) */
                                 const int32_t *seq_lens,     /* (B) */
                                 const int32_t *block_tables, /* (B, max_blocks) */
                                 int T, int B, int max_blocks, int n_heads, int n_kv, float scale,
                                 float softcap, int window) {
  constexpr int LPR = HD / 8;   /* lanes per key row */
  constexpr int KPW = 32 / LPR; /* keys per warp step */
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t gw = (int64_t)blockIdx.x * ATTN_WARPS + warp;
  if (gw >= (int64_t)T * n_kv)
    return; /* whole warp leaves together; no block-wide barrier follows */
  int t = (int)(gw / n_kv), kvh = (int)(gw % n_kv);
  int b = attn_seq_of(query_start, B, t);
  int qs0 = query_start[b], q_len = query_start[b + 1] - qs0;
  int ctx = seq_lens[b] - q_len + (t - qs0) + 1;
  int sub = lane / LPR, part = lane % LPR;

  float qv[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    uint4 u = *(const uint4 *)(q + ((size_t)t * n_heads + kvh * G + g) * HD + part * 8);
    const __nv_bfloat162 *p2 = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int k2 = 0; k2 < 4; k2++) {
      float2 f = __bfloat1622float2(p2[k2]);
      qv[g][2 * k2] = f.x * scale;
      qv[g][2 * k2 + 1] = f.y * scale;
    }
  }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; d++)
      acc[g][d] = 0.0f;
  }
  const int32_t *bt = block_tables + (size_t)b * max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD + (size_t)part * 8;
  const size_t block_stride = (size_t)n_kv * BS * HD;
  /* warp-uniform bounds (the shuffles need every lane); unrolled so that the loads of the next
   * steps are issued before this step's arithmetic waits on its own */
#pragma unroll 4
  for (int j0 = attn_first_key(ctx, window); j0 < ctx; j0 += KPW) {
    int j = j0 + sub;
    bool valid = j < ctx;
    uint4 ku = make_uint4(0, 0, 0, 0), vu = make_uint4(0, 0, 0, 0);
    if (valid) {
      size_t row = (size_t)bt[j / BS] * block_stride + head_off + (size_t)(j % BS) * HD;
      ku = *(const uint4 *)(kc + row);
      vu = *(const uint4 *)(vc + row);
    }
    float kf[8], vf[8];
    const __nv_bfloat162 *k2p = (const __nv_bfloat162 *)&ku, *v2p = (const __nv_bfloat162 *)&vu;
#pragma unroll
    for (int k2 = 0; k2 < 4; k2++) {
      float2 a = __bfloat1622float2(k2p[k2]), c = __bfloat1622float2(v2p[k2]);
      kf[2 * k2] = a.x, kf[2 * k2 + 1] = a.y, vf[2 * k2] = c.x, vf[2 * k2 + 1] = c.y;
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < 8; d++)
        s += qv[g][d] * kf[d];
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) /* within the aligned group of LPR lanes */
        s += __shfl_xor_sync(0xffffffffu, s, o);
      s = attn_cap(s, softcap);
      if (valid) {
        float m_new = fmaxf(m[g], s);
        float alpha = __expf(m[g] - m_new); /* m = -inf at the group's first key: alpha = 0 */
        float p = __expf(s - m_new);
        l[g] = l[g] * alpha + p;
#pragma unroll
        for (int d = 0; d < 8; d++)
          acc[g][d] = acc[g][d] * alpha + p * vf[d];
        m[g] = m_new;
      }
    }
  }
  /* merge the KPW groups: lanes with the same `part` hold the same dims */
#pragma unroll
  for (int g = 0; g < G; g++) {
#pragma unroll
    for (int o = LPR; o < 32; o <<= 1) {
      float m2 = __shfl_xor_sync(0xffffffffu, m[g], o), l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      float mm = fmaxf(m[g], m2);
      float a1 = mm == -INFINITY ? 0.0f : __expf(m[g] - mm), a2 = mm == -INFINITY ? 0.0f : __expf(m2 - mm);
      l[g] = l[g] * a1 + l2 * a2;
#pragma unroll
      for (int d = 0; d < 8; d++)
        acc[g][d] = acc[g][d] * a1 + __shfl_xor_sync(0xffffffffu, acc[g][d], o) * a2;
      m[g] = mm;
    }
    if (sub == 0) {
      float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
      uint4 u;
      __nv_bfloat162 *o2 = (__nv_bfloat162 *)&u;
#pragma unroll
      for (int k2 = 0; k2 < 4; k2++)
        o2[k2] = __floats2bfloat162_rn(acc[g][2 * k2] * inv, acc[g][2 * k2 + 1] * inv);
      *(uint4 *)(out + ((size_t)t * n_heads + kvh * G + g) * HD + part * 8) = u;
    }
  }
}

int cuda_op_attention(struct backend *be, void *out, const void *q, const struct kv_layer *kv,
                      const struct batch *b, const struct attn_params *ap) {
  const int n_heads = ap->n_heads;
  const float scale = ap->scale;
  if (ap->window < 0 || !(ap->softcap >= 0.0f))
    return ERR("cuda attention: window %d and softcap %g must be >= 0", ap->window, (double)ap->softcap);
  if (be->act_dtype != DTYPE_BF16)
    return ERR("cuda attention: activation dtype %s (expected bf16)", dtype_name(be->act_dtype));
  if (kv->dtype != DTYPE_BF16)
    return ERR("cuda attention: kv cache dtype %s is not supported (bf16)", dtype_name(kv->dtype));
  if (kv->head_dim % 8 != 0 || kv->head_dim > ATTN_MAX_HD)
    return ERR("cuda attention: head_dim %d is not supported (a multiple of 8, at most %d)", kv->head_dim,
               ATTN_MAX_HD);
  if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0)
    return ERR("cuda attention: %d query heads over %d kv heads", n_heads, kv->n_kv_heads);
  if (b->num_tokens <= 0 || b->num_seqs <= 0)
    return 0;
  int G = n_heads / kv->n_kv_heads;
  int grouped = (G == 1 || G == 2 || G == 4 || G == 8) &&
                (kv->head_dim == 8 || kv->head_dim == 16 || kv->head_dim == 32 || kv->head_dim == 64 ||
                 kv->head_dim == 128);
  /* warps: one per (token, KV head) for the grouped kernel, else one per (token, query head) */
  int64_t warps = (int64_t)b->num_tokens * (grouped ? kv->n_kv_heads : n_heads);
  int64_t blocks = (warps + ATTN_WARPS - 1) / ATTN_WARPS;
  if (blocks > 0x7fffffff)
    return ERR("cuda attention: batch too large (%d tokens)", b->num_tokens);
  cudaStream_t st = cuda_be(be)->stream;
  int bs = kv->block_size, hd = kv->head_dim;
  if (!cuda_block_size_ok(bs))
    return ERR("--pa-block-size %d is not supported on CUDA (use " CUDA_BLOCK_SIZES ")", bs);
#define ATTN_ARGS                                                                                 \
  (bf16 *)out, (const bf16 *)q, (const bf16 *)kv->k, (const bf16 *)kv->v, b->query_start, b->seq_lens, \
      b->block_tables, b->num_tokens, b->num_seqs, b->max_blocks_per_seq, n_heads, kv->n_kv_heads
#define ATTN_LANES(BS, HD) paged_attention_lanes_kernel<BS, HD><<<(unsigned)blocks, ATTN_WARPS * 32, 0, st>>>(ATTN_ARGS, scale, ap->softcap, ap->window)
#define ATTN_GROUP(BS, HD, G) paged_attention_group_kernel<BS, HD, G><<<(unsigned)blocks, ATTN_WARPS * 32, 0, st>>>(ATTN_ARGS, scale, ap->softcap, ap->window)
#define ATTN_GROUP_G(BS, HD)                                                                      \
  do {                                                                                            \
    if (G == 1)                                                                                   \
      ATTN_GROUP(BS, HD, 1);                                                                      \
    else if (G == 2)                                                                              \
      ATTN_GROUP(BS, HD, 2);                                                                      \
    else if (G == 4)                                                                              \
      ATTN_GROUP(BS, HD, 4);                                                                      \
    else                                                                                          \
      ATTN_GROUP(BS, HD, 8);                                                                      \
  } while (0)
#define ATTN_BS(BS)                                                                               \
  do {                                                                                            \
    if (grouped) {                                                                                \
      switch (hd) {                                                                               \
      case 8: ATTN_GROUP_G(BS, 8); break;                                                         \
      case 16: ATTN_GROUP_G(BS, 16); break;                                                       \
      case 32: ATTN_GROUP_G(BS, 32); break;                                                       \
      case 64: ATTN_GROUP_G(BS, 64); break;                                                       \
      default: ATTN_GROUP_G(BS, 128); break;                                                      \
      }                                                                                           \
      break;                                                                                      \
    }                                                                                             \
    switch (hd) {                                                                                 \
    case 8: ATTN_LANES(BS, 8); break;                                                             \
    case 16: ATTN_LANES(BS, 16); break;                                                           \
    case 32: ATTN_LANES(BS, 32); break;                                                           \
    case 64: ATTN_LANES(BS, 64); break;                                                           \
    case 128: ATTN_LANES(BS, 128); break;                                                         \
    default: /* other head sizes: the generic kernel */                                           \
      paged_attention_kernel<BS><<<(unsigned)blocks, ATTN_WARPS * 32, 0, st>>>(ATTN_ARGS, hd, scale, ap->softcap, ap->window); \
    }                                                                                             \
  } while (0)
  if (bs == 8)
    ATTN_BS(8);
  else if (bs == 16)
    ATTN_BS(16);
  else
    ATTN_BS(32);
#undef ATTN_BS
#undef ATTN_GROUP_G
#undef ATTN_GROUP
#undef ATTN_LANES
#undef ATTN_ARGS
  CUDA_LAUNCH_CHECK();
  return 0;
}
