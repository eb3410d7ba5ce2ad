/* cuda_attention.cu - paged attention over the block-table KV cache, for any mix of decode tokens
 * and prompt chunks (varlen queries, causal, GQA), with an online softmax in f32; the entry point
 * cuda_op_attention and the general (CUDA-core) kernels.
 *
 * Query token t of sequence b (query_start[b] <= t < query_start[b+1]) sees keys 0 .. ctx-1
 * with ctx = seq_lens[b] - q_len + (t - query_start[b]) + 1, i.e. its own position and everything
 * before it. The block size is a template parameter, so the logical -> physical slot split is a
 * shift and mask. With a sliding window (struct attn_params) the walk starts at key
 * ctx - window; with softcapping each score s becomes softcap * tanh(s / softcap). The cache is
 * bf16 or f8e4m3 (per-layer scales; struct kv_bf16 / kv_f8 in cuda_attn_common.cuh).
 * Which kernel runs:
 * - a decode batch (max_query_len 1), head_dim 64, 80, 96, 128 or 256 (attn_mma_hd), G <= 8:
 *   the split-context decode kernel on tensor cores (cuda_attn_decode.cu);
 * - any other batch with such a head_dim: the tensor-core prefill kernels
 *   (cuda_attn_prefill.cu; PAGODA_ATTN_PREFILL=simd sends it to the kernels below instead);
 * - otherwise the part-1 kernels here, chosen by shape:
 *   - paged_attention_group_kernel: one warp per (token, KV head) for all its query heads, for
 *     n_heads / n_kv_heads in {1, 2, 4, 8} and head_dim in {8, 16, 32, 64, 128};
 *   - paged_attention_lanes_kernel: one warp per (token, query head), other group sizes;
 *   - paged_attention_kernel: any other head_dim (a multiple of 8 up to 256). */
#include "backend/cuda/cuda_attn_common.cuh"

#define ATTN_WARPS 4      /* warps (query heads) per thread block */
#define ATTN_MAX_HD 256   /* head_dim limit: q in shared memory and head_dim/32 accumulators per lane */

/* q . k for one key row k(hd) (8-element loads, hd a multiple of 8), q(hd) in shared f32. */
template <class KV>
__device__ __forceinline__ float attn_dot(const float *qs, const typename KV::elem *k, int hd, float ks) {
  float s = 0.0f;
  for (int c = 0; c < hd / 8; c++) {
    float f[8];
    KV::load8(f, k + c * 8, ks);
#pragma unroll
    for (int j = 0; j < 8; j++)
      s += qs[c * 8 + j] * f[j];
  }
  return s;
}

/* The generic kernel (any head_dim, a multiple of 8 up to 256): the warp walks the keys in chunks
 * of 32, one key per lane for the scores (q . k, q scaled in shared memory), then folds the
 * chunk into the running max / sum / output, each lane owning head_dim/32 output dims. */
template <int BS, class KV>
__global__ void __launch_bounds__(ATTN_WARPS * 32) paged_attention_kernel(const attn_args a) {
  typedef typename KV::elem E;
  __shared__ float q_sh[ATTN_WARPS][ATTN_MAX_HD];
  const int hd = a.hd;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t gw = (int64_t)blockIdx.x * ATTN_WARPS + warp;
  if (gw >= (int64_t)a.T * a.n_heads)
    return; /* whole warp leaves together; no block-wide barrier follows */
  int t = (int)(gw / a.n_heads), h = (int)(gw % a.n_heads);
  attn_tok tk = attn_lookup(a.query_start, a.seq_lens, a.B, t, -1, a.window);
  int kvh = h / (a.n_heads / a.n_kv);
  const bf16 *qrow = a.q + ((size_t)t * a.n_heads + h) * hd;
  float *qs = q_sh[warp];
  for (int d = lane; d < hd; d += 32)
    qs[d] = __bfloat162float(qrow[d]) * a.scale;
  __syncwarp();

  const E *kc = (const E *)a.kc, *vc = (const E *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)tk.b * a.max_blocks;
  const size_t head_stride = (size_t)BS * hd; /* one kv head of one block */
  const size_t block_stride = (size_t)a.n_kv * head_stride;
  float m = -INFINITY, l = 0.0f;
  float acc[ATTN_MAX_HD / 32];
#pragma unroll
  for (int i = 0; i < ATTN_MAX_HD / 32; i++)
    acc[i] = 0.0f;

  for (int base = tk.first; base < tk.ctx; base += 32) {
    int j = base + lane;
    float s = -INFINITY;
    size_t row = 0; /* element offset of key j's row in kc / vc */
    if (j < tk.ctx) {
      int blk = bt[j / BS];
      row = (size_t)blk * block_stride + (size_t)kvh * head_stride + (size_t)(j % BS) * hd;
      s = attn_cap(attn_dot<KV>(qs, kc + row, hd, a.k_scale), a.softcap);
    }
    float m_new = fmaxf(m, attn_warp_max(s)); /* finite: key `base` < ctx is always valid */
    float alpha = __expf(m - m_new);
    float p = j < tk.ctx ? __expf(s - m_new) : 0.0f;
    l = l * alpha + attn_warp_sum(p);
#pragma unroll
    for (int i = 0; i < ATTN_MAX_HD / 32; i++)
      acc[i] *= alpha;
    int nvalid = tk.ctx - base < 32 ? tk.ctx - base : 32;
    for (int jj = 0; jj < nvalid; jj++) {
      float pj = __shfl_sync(0xffffffffu, p, jj);
      size_t rj = __shfl_sync(0xffffffffu, row, jj);
      const E *vrow = vc + rj;
#pragma unroll
      for (int i = 0; i < ATTN_MAX_HD / 32; i++) {
        int d = lane + 32 * i;
        if (d < hd)
          acc[i] += pj * KV::at(vrow, d, a.v_scale);
      }
    }
    m = m_new;
  }
  bf16 *orow = a.out + ((size_t)t * a.n_heads + h) * hd;
  float inv = tk.ctx > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < ATTN_MAX_HD / 32; i++) {
    int d = lane + 32 * i;
    if (d < hd)
      orow[d] = __float2bfloat16(acc[i] * inv);
  }
}

/* One warp per (token, query head), for head_dim HD in {8, 16, 32, 64, 128} when the group size
 * is not one the grouped kernel is compiled for: lanes own keys for the whole walk.
 * Lane i takes keys i, i + 32, ...: it computes q . k for its key, and adds p * v of its key
 * into its own full-length accumulator acc[HD] (registers), so a chunk's K and V rows are read
 * by 32 independent loads with no per-key dependency chain. The running max is shared by the
 * warp (one warp max per chunk); each lane keeps its own partial sum of p. At the end the
 * lanes' accumulators and sums are added across the warp. */
template <int BS, int HD, class KV>
__global__ void __launch_bounds__(ATTN_WARPS * 32) paged_attention_lanes_kernel(const attn_args a) {
  typedef typename KV::elem E;
  __shared__ float q_sh[ATTN_WARPS][HD];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t gw = (int64_t)blockIdx.x * ATTN_WARPS + warp;
  if (gw >= (int64_t)a.T * a.n_heads)
    return; /* whole warp leaves together; no block-wide barrier follows */
  int t = (int)(gw / a.n_heads), h = (int)(gw % a.n_heads);
  attn_tok tk = attn_lookup(a.query_start, a.seq_lens, a.B, t, -1, a.window);
  int kvh = h / (a.n_heads / a.n_kv);
  const bf16 *qrow = a.q + ((size_t)t * a.n_heads + h) * HD;
  float *qs = q_sh[warp];
  for (int d = lane; d < HD; d += 32)
    qs[d] = __bfloat162float(qrow[d]) * a.scale;
  __syncwarp();

  const E *kc = (const E *)a.kc, *vc = (const E *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)tk.b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD;
  const size_t block_stride = (size_t)a.n_kv * BS * HD;
  float acc[HD];
#pragma unroll
  for (int d = 0; d < HD; d++)
    acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f; /* m: warp-wide running max; l: this lane's sum of p */
  for (int base = tk.first; base < tk.ctx; base += 32) {
    int j = base + lane;
    bool valid = j < tk.ctx;
    float s = -INFINITY;
    size_t row = 0;
    if (valid) {
      row = (size_t)bt[j / BS] * block_stride + head_off + (size_t)(j % BS) * HD;
      s = attn_cap(attn_dot<KV>(qs, kc + row, HD, a.k_scale), a.softcap);
    }
    float m_new = fmaxf(m, attn_warp_max(s)); /* finite: key `base` < ctx is always valid */
    float alpha = __expf(m - m_new);
    float p = valid ? __expf(s - m_new) : 0.0f;
    l = l * alpha + p;
    m = m_new;
#pragma unroll
    for (int c = 0; c < HD / 8; c++) {
      float f[8];
      if (valid)
        KV::load8(f, vc + row + c * 8, a.v_scale);
#pragma unroll
      for (int k = 0; k < 8; k++)
        acc[c * 8 + k] = acc[c * 8 + k] * alpha + (valid ? p * f[k] : 0.0f);
    }
  }
  l = attn_warp_sum(l);
  float inv = tk.ctx > 0 ? 1.0f / l : 0.0f;
  bf16 *orow = a.out + ((size_t)t * a.n_heads + h) * HD;
#pragma unroll
  for (int d = 0; d < HD; d++) {
    float v = attn_warp_sum(acc[d]);
    if ((d & 31) == lane)
      orow[d] = __float2bfloat16(v * inv);
  }
}

/* The main prefill kernel, for G = n_heads / n_kv_heads in {1, 2, 4, 8} and head_dim HD in
 * {8, 16, 32, 64, 128}: one warp per (query token, KV head) serves the G query heads that share
 * the KV head, so each K/V row is read once for all of them. A key's row is split over
 * LPR = HD / 8 lanes (8 elements each, so a warp's loads of KPW = 32 / LPR consecutive rows are
 * coalesced); lane group `sub` walks keys j = sub, sub + KPW, ... with its own online softmax
 * (max m, sum l, and the 8 output dims of its slice in acc, per head), a dot product being LPR
 * partial sums added by shuffles within the group. At the end the KPW groups' states are merged
 * (rescaled to the larger max and added) by a butterfly over the warp. */
template <int BS, int HD, int G, class KV>
__global__ void __launch_bounds__(ATTN_WARPS * 32) paged_attention_group_kernel(const attn_args a) {
  typedef typename KV::elem E;
  constexpr int LPR = HD / 8;   /* lanes per key row */
  constexpr int KPW = 32 / LPR; /* keys per warp step */
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t gw = (int64_t)blockIdx.x * ATTN_WARPS + warp;
  if (gw >= (int64_t)a.T * a.n_kv)
    return; /* whole warp leaves together; no block-wide barrier follows */
  int t = (int)(gw / a.n_kv), kvh = (int)(gw % a.n_kv);
  attn_tok tk = attn_lookup(a.query_start, a.seq_lens, a.B, t, -1, a.window);
  int sub = lane / LPR, part = lane % LPR;

  float qv[G][8];
#pragma unroll
  for (int g = 0; g < G; g++)
    attn_load_q8(qv[g], a.q + ((size_t)t * a.n_heads + kvh * G + g) * HD + part * 8, a.scale);
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; d++)
      acc[g][d] = 0.0f;
  }
  const E *kc = (const E *)a.kc, *vc = (const E *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)tk.b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD + (size_t)part * 8;
  const size_t block_stride = (size_t)a.n_kv * BS * HD;
  /* warp-uniform bounds (the shuffles need every lane); unrolled so that the loads of the next
   * steps are issued before this step's arithmetic waits on its own */
#pragma unroll 4
  for (int j0 = tk.first; j0 < tk.ctx; j0 += KPW) {
    int j = j0 + sub;
    bool valid = j < tk.ctx;
    float kf[8], vf[8];
#pragma unroll
    for (int d = 0; d < 8; d++)
      kf[d] = vf[d] = 0.0f;
    if (valid) {
      size_t row = (size_t)bt[j / BS] * block_stride + head_off + (size_t)(j % BS) * HD;
      KV::load8(kf, kc + row, a.k_scale);
      KV::load8(vf, vc + row, a.v_scale);
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
      s = attn_cap(s, a.softcap);
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
      *(uint4 *)(a.out + ((size_t)t * a.n_heads + kvh * G + g) * HD + part * 8) = u;
    }
  }
}

/* Launches the general kernels for KV type KV and block size BS. */
template <int BS, class KV>
static void attn_launch_general(const attn_args &a, int G, int grouped, unsigned blocks, cudaStream_t st) {
  dim3 grid(blocks), thr(ATTN_WARPS * 32);
#define ATTN_GROUP(HD)                                                                            \
  do {                                                                                            \
    if (G == 1)                                                                                   \
      paged_attention_group_kernel<BS, HD, 1, KV><<<grid, thr, 0, st>>>(a);                       \
    else if (G == 2)                                                                              \
      paged_attention_group_kernel<BS, HD, 2, KV><<<grid, thr, 0, st>>>(a);                       \
    else if (G == 4)                                                                              \
      paged_attention_group_kernel<BS, HD, 4, KV><<<grid, thr, 0, st>>>(a);                       \
    else                                                                                          \
      paged_attention_group_kernel<BS, HD, 8, KV><<<grid, thr, 0, st>>>(a);                       \
  } while (0)
  if (grouped) {
    switch (a.hd) {
    case 8: ATTN_GROUP(8); break;
    case 16: ATTN_GROUP(16); break;
    case 32: ATTN_GROUP(32); break;
    case 64: ATTN_GROUP(64); break;
    default: ATTN_GROUP(128); break;
    }
    return;
  }
#undef ATTN_GROUP
  switch (a.hd) {
  case 8: paged_attention_lanes_kernel<BS, 8, KV><<<grid, thr, 0, st>>>(a); break;
  case 16: paged_attention_lanes_kernel<BS, 16, KV><<<grid, thr, 0, st>>>(a); break;
  case 32: paged_attention_lanes_kernel<BS, 32, KV><<<grid, thr, 0, st>>>(a); break;
  case 64: paged_attention_lanes_kernel<BS, 64, KV><<<grid, thr, 0, st>>>(a); break;
  case 128: paged_attention_lanes_kernel<BS, 128, KV><<<grid, thr, 0, st>>>(a); break;
  default: paged_attention_kernel<BS, KV><<<grid, thr, 0, st>>>(a); /* other head sizes */
  }
}

int cuda_op_attention(struct backend *be, void *out, const void *q, const struct kv_layer *kv,
                      const struct batch *b, const struct attn_params *ap) {
  const int n_heads = ap->n_heads;
  if (ap->window < 0 || !(ap->softcap >= 0.0f))
    return ERR("cuda attention: window %d and softcap %g must be >= 0", ap->window, (double)ap->softcap);
  if (be->act_dtype != DTYPE_BF16)
    return ERR("cuda attention: activation dtype %s (expected bf16)", dtype_name(be->act_dtype));
  if (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3)
    return ERR("cuda attention: kv cache dtype %s is not supported (bf16 or f8e4m3)", dtype_name(kv->dtype));
  if (kv->head_dim % 8 != 0 || kv->head_dim > ATTN_MAX_HD)
    return ERR("cuda attention: head_dim %d is not supported (a multiple of 8, at most %d)", kv->head_dim,
               ATTN_MAX_HD);
  if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0)
    return ERR("cuda attention: %d query heads over %d kv heads", n_heads, kv->n_kv_heads);
  if (!cuda_block_size_ok(kv->block_size))
    return ERR("--pa-block-size %d is not supported on CUDA (use " CUDA_BLOCK_SIZES ")", kv->block_size);
  if (b->num_tokens <= 0 || b->num_seqs <= 0)
    return 0;
  const int f8 = kv->dtype == DTYPE_F8E4M3;
  attn_args a = {};
  a.out = (bf16 *)out;
  a.q = (const bf16 *)q;
  a.kc = kv->k;
  a.vc = kv->v;
  a.query_start = b->query_start;
  a.seq_lens = b->seq_lens;
  a.block_tables = b->block_tables;
  a.T = b->num_tokens;
  a.B = b->num_seqs;
  a.max_blocks = b->max_blocks_per_seq;
  a.n_heads = n_heads;
  a.n_kv = kv->n_kv_heads;
  a.hd = kv->head_dim;
  a.scale = ap->scale;
  a.softcap = ap->softcap;
  a.window = ap->window;
  a.k_scale = f8 ? kv->k_scale : 1.0f;
  a.v_scale = f8 ? kv->v_scale : 1.0f;
  a.pdl_early = (unsigned char)cuda_be(be)->attn_early;
  a.prefetch = (unsigned short)cuda_be(be)->attn_prefetch; /* at most 65535 (cuda_init) */
  a.early = (unsigned char)((cuda_be(be)->attn_exit_early ? ATTN_EXIT_EARLY : 0) |
                             (cuda_be(be)->attn_kv_early ? ATTN_KV_EARLY : 0));
  if (f8 && !(a.k_scale > 0.0f && a.v_scale > 0.0f))
    return ERR("cuda attention: f8e4m3 KV scales %g / %g must be > 0", (double)a.k_scale, (double)a.v_scale);
  int rc = cuda_attention_decode(be, &a, kv->block_size, f8, b->max_query_len, b->max_seq_len);
  if (rc <= 0)
    return rc; /* launched (0) or failed (-1) */
  rc = cuda_attention_prefill(be, &a, kv->block_size, f8, b->max_query_len);
  if (rc <= 0)
    return rc;
  int G = n_heads / kv->n_kv_heads;
  int grouped = (G == 1 || G == 2 || G == 4 || G == 8) &&
                (a.hd == 8 || a.hd == 16 || a.hd == 32 || a.hd == 64 || a.hd == 128);
  /* warps: one per (token, KV head) for the grouped kernel, else one per (token, query head) */
  int64_t warps = (int64_t)b->num_tokens * (grouped ? kv->n_kv_heads : n_heads);
  int64_t blocks = (warps + ATTN_WARPS - 1) / ATTN_WARPS;
  if (blocks > 0x7fffffff)
    return ERR("cuda attention: batch too large (%d tokens)", b->num_tokens);
  cudaStream_t st = cuda_be(be)->stream;
#define ATTN_BS(BS)                                                                               \
  (f8 ? attn_launch_general<BS, kv_f8>(a, G, grouped, (unsigned)blocks, st)                       \
      : attn_launch_general<BS, kv_bf16>(a, G, grouped, (unsigned)blocks, st))
  if (kv->block_size == 8)
    ATTN_BS(8);
  else if (kv->block_size == 16)
    ATTN_BS(16);
  else
    ATTN_BS(32);
#undef ATTN_BS
  CUDA_LAUNCH_CHECK();
  return 0;
}

CUDA_PRELOAD_ANCHOR(attention)
