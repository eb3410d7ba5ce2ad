/* cuda_attn_prefill.cu - prefill and chunked-prefill attention over the paged cache on tensor
 * cores (any batch the decode kernel does not take, head_dim 64, 80, 96, 128 or 256): causal, varlen, GQA,
 * sliding window and softcap, decode rows mixed in. Two kernels: the shared-memory tile kernel
 * (attn_prefill_tile_kernel, below: a bf16 cache) and the per-warp kernel (an e4m3 cache, or
 * PAGODA_ATTN_PREFILL=warp).
 *
 * Per-warp kernel: grid (num_seqs x ceil(max_query_len / 64), n_heads): the thread block of
 * (sequence b, query tile qt, head h) takes the queries qt * 64 .. qt * 64 + 63 of b, 16 per warp; tiles past the
 * sequence's queries exit at once (max_query_len is a host bound and may be loose). Each warp is
 * a FlashAttention-2 loop on its own: Q's 16 rows are the A operand of mma.sync m16n8k16 (f32
 * accumulators), K and V come from 16-byte loads as in the decode kernel (struct attn_rows: K as
 * the B operand with the dims inside each 16-dim chunk permuted alike for Q and K; V transposed in
 * registers by movmatrix; head_dim 256 loads V after the scores), 16 keys per step from the first key any of its rows sees to the last, with the
 * causal and window masks per row and an online softmax per row (max over the 4 threads of a
 * row group, partial sums per thread). */
#include <type_traits>

#include "backend/cuda/cuda_attn_common.cuh"

#define PRE_WARPS 4
#define PRE_ROWS (PRE_WARPS * 16) /* queries per thread block */

template <int BS, int HD, class KV>
__global__ void __launch_bounds__(PRE_WARPS * 32) attn_prefill_mma_kernel(const attn_args a, int num_qt) {
  typedef typename KV::elem E;
  constexpr bool F8 = sizeof(E) == 1;
  typedef typename std::conditional<F8, __half, bf16>::type MT; /* mma operand type */
  typedef attn_rows<HD, E> L;  /* which dims each thread loads (cuda_attn_common.cuh) */
  constexpr int NT = L::PAIRS; /* PV n-tiles */
  constexpr bool LATE_V = HD > 128; /* registers: V is loaded after the scores (head_dim 256) */

  const int b = blockIdx.x / num_qt, qt = blockIdx.x % num_qt, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kvh = h / (a.n_heads / a.n_kv);
  const int t0 = a.query_start[b], q_len = a.query_start[b + 1] - t0;
  const int row0 = qt * PRE_ROWS + warp * 16;
  if (row0 >= q_len)
    return; /* warp-level: no block-wide barrier in this kernel */
  const int past = a.seq_lens[b] - q_len; /* keys before the first query */
  /* this thread's rows: r[0] = row0 + g, r[1] = row0 + g + 8 (clamped to the last query for the
   * loads; rows past q_len are computed and not written) */
  int ctx[2], first[2];
  bool live[2];
#pragma unroll
  for (int k = 0; k < 2; k++) {
    int r = row0 + g + 8 * k;
    live[k] = r < q_len;
    r = live[k] ? r : q_len - 1;
    ctx[k] = past + r + 1;
    first[k] = attn_first_key(ctx[k], a.window);
  }
  const int last_row = min(row0 + 15, q_len - 1);
  const int kbeg = attn_first_key(past + row0 + 1, a.window), kend = past + last_row + 1;

  /* Q as the A operand: chunk c is regs {row g, row g + 8} x {pair 2c, pair 2c + 1} */
  uint32_t qa[L::CHUNKS][4];
#pragma unroll
  for (int k = 0; k < 2; k++) {
    int r = live[k] ? row0 + g + 8 * k : q_len - 1;
    uint32_t w[L::PAIRS];
    L::template q_pairs<MT>(w, a.q + ((size_t)(t0 + r) * a.n_heads + h) * HD, t, true);
#pragma unroll
    for (int c = 0; c < L::CHUNKS; c++) /* A: reg 0 / 2 = row g, reg 1 / 3 = row g + 8 */
      qa[c][k] = w[2 * c], qa[c][2 + k] = w[2 * c + 1];
  }
  float o[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sscale = a.scale * (F8 ? a.k_scale : 1.0f);
  const E *kc = (const E *)a.kc, *vc = (const E *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD;
  const size_t block_stride = (size_t)a.n_kv * BS * HD;

  for (int j0 = kbeg; j0 < kend; j0 += 16) {
    uint4 kr[2][L::NPT], vr[2][L::NPT];
    size_t row[2];
    L::template load_kv16<BS, !LATE_V>(kr, vr, row, kc, vc, bt, block_stride, head_off, j0, kend, g, t);
    float s[2][4];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      s[hf][0] = s[hf][1] = s[hf][2] = s[hf][3] = 0.0f;
      uint32_t w[L::PAIRS];
      L::template pairs<MT>(w, kr[hf]);
#pragma unroll
      for (int c = 0; c < L::CHUNKS; c++)
        attn_mma4(s[hf], qa[c], w[2 * c], w[2 * c + 1], MT());
    }
    if (LATE_V)
      L::load_v16(vr, row, vc, t);
    /* masks and the online softmax, per row k: C regs 2k, 2k + 1 of each half */
    uint32_t pa[4];
#pragma unroll
    for (int k = 0; k < 2; k++) {
      float x[4], mx = -INFINITY;
#pragma unroll
      for (int hf = 0; hf < 2; hf++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          int key = j0 + hf * 8 + 2 * t + e;
          float v = attn_cap(s[hf][2 * k + e] * sscale, a.softcap);
          v = key >= first[k] && key < ctx[k] ? v : -INFINITY;
          x[hf * 2 + e] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float mnew = fmaxf(m[k], mx);
      float mref = mnew == -INFINITY ? 0.0f : mnew; /* a row with no key yet adds nothing */
      float alpha = __expf(m[k] - mref);
      m[k] = mnew;
      l[k] *= alpha;
#pragma unroll
      for (int q = 0; q < 4; q++)
        x[q] = __expf(x[q] - mref), l[k] += x[q];
#pragma unroll
      for (int i = 0; i < NT; i++)
        o[i][2 * k] *= alpha, o[i][2 * k + 1] *= alpha;
      pa[k] = attn_pack(x[0], x[1], MT());     /* keys 2t, 2t + 1 of the first 8 */
      pa[2 + k] = attn_pack(x[2], x[3], MT()); /* keys 8 + 2t, 9 + 2t */
    }
    uint32_t v0[L::PAIRS], v1[L::PAIRS];
    L::template pairs<MT>(v0, vr[0]);
    L::template pairs<MT>(v1, vr[1]);
#pragma unroll
    for (int i = 0; i < NT; i++)
      attn_mma4(o[i], pa, attn_trans(v0[i]), attn_trans(v1[i]), MT());
  }
  const float vs = F8 ? a.v_scale : 1.0f;
#pragma unroll
  for (int k = 0; k < 2; k++) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
    if (!live[k])
      continue;
    float inv = l[k] > 0.0f ? vs / l[k] : 0.0f;
    bf16 *orow = a.out + ((size_t)(t0 + row0 + g + 8 * k) * a.n_heads + h) * HD;
#pragma unroll
    for (int i = 0; i < NT; i++)
      *(__nv_bfloat162 *)(orow + L::dim(i, t)) = __floats2bfloat162_rn(o[i][2 * k] * inv, o[i][2 * k + 1] * inv);
  }
}

/* ---- the shared-memory tile kernel (bf16 cache, head_dim 64, 80, 96, 128, 256) ----
 * Grid (n_heads, ceil(max_query_len / (64 MI)), num_seqs), query tiles in reverse order so the
 * long causal rows start first, heads of one KV group side by side (their K/V tiles meet in L2).
 * A thread block of 4 warps takes 64 MI queries of one sequence and head, 16 MI per warp (MI
 * 16-row mma blocks, so each K/V fragment read from shared memory feeds MI mma; launched with
 * MI = 2, or 1 for head_dim 256), and walks the keys they see in tiles of TK (64; 32 for head_dim
 * 256): every thread copies 16-byte pieces
 * of Q (once) and of the tile's K and V rows (gathered through the block table) into shared
 * memory with cp.async, two stages so tile
 * i + 1 is in flight while tile i is computed. Rows are stored with their 16-byte chunks
 * XOR-swizzled by (row % 8), or padded to an odd number of chunks where a row is not a multiple
 * of 8 chunks (tile_off), so the ldmatrix reads (K as the QK^T B operand, V transposed by
 * ldmatrix.trans as the PV B operand) hit 8 different bank groups. The running max is kept
 * on the raw scores and exp2(s * scale * log2(e) - m) is one FMA and one ex2 (softcap: the
 * capped score times log2(e)); masks are applied only on tiles that cross a
 * row's causal or window edge, and a warp skips the tiles none of its rows sees. Keys outside
 * the block's range are zero-filled (cp.async with source size 0), so padding never feeds
 * NaN into the PV product. */

__device__ __forceinline__ void tile_cp16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void tile_ldsm4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void tile_ldsm4t(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Shared-memory row layout of the tile kernel: a row of NC 16-byte chunks. When NC is a multiple
 * of 8 (head_dim 64, 128, 256) rows are packed and chunk c of row r sits at c ^ (r % 8); otherwise
 * (80, 96) rows are padded by one chunk to an odd stride (11, 13), so the 8 rows of one ldmatrix
 * phase also land in 8 different bank groups. Offset in bytes of chunk C of row R: */
template <int NC>
__device__ __forceinline__ uint32_t tile_off(int r, int c) {
  constexpr bool SW = NC % 8 == 0;
  constexpr int RS = SW ? NC : NC + 1;
  return (uint32_t)(r * RS + (SW ? c ^ (r & 7) : c)) * 16u;
}
template <int HD>
__host__ __device__ constexpr int tile_row_chunks() { return HD / 8 % 8 == 0 ? HD / 8 : HD / 8 + 1; }

template <int BS, int HD, int MI, int TK>
__global__ void __launch_bounds__(128) attn_prefill_tile_kernel(const attn_args a) {
  constexpr int NC = HD / 8;            /* 16-byte chunks per row */
  constexpr int TILE = TK * tile_row_chunks<HD>() * 8; /* elements of one K (or V) tile (padded rows) */
  constexpr int NT = HD / 8;            /* PV n-tiles */
  constexpr int KC = HD / 16;           /* QK^T k-chunks */
  constexpr int WR = 16 * MI;           /* query rows per warp */
  constexpr int BQ = 4 * WR;            /* query rows per thread block */
  static_assert(HD % 16 == 0 && BQ * NC % 128 == 0 && TK * NC % 128 == 0 && TK % 16 == 0, "tile shape");
  extern __shared__ __align__(128) bf16 tile_smem[]; /* [stage][K, V][TK][HD], then Q [BQ][HD]; swizzled */

  const int h = blockIdx.x, b = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int t0 = a.query_start[b], q_len = a.query_start[b + 1] - t0;
  const int crow0 = qt * BQ;
  if (crow0 >= q_len)
    return; /* whole block */
  const int kvh = h / (a.n_heads / a.n_kv);
  const int past = a.seq_lens[b] - q_len;
  const int clast = min(crow0 + BQ - 1, q_len - 1);
  const int kbeg = attn_first_key(past + crow0 + 1, a.window), kend = past + clast + 1;
  const int ntiles = (kend - kbeg + TK - 1) / TK;

  /* this warp's rows (row0 .. row0 + WR - 1) and the keys they see */
  const int row0 = crow0 + warp * WR;
  const bool wlive = row0 < q_len;
  const int wlast = min(row0 + WR - 1, q_len - 1);
  const int wbeg = attn_first_key(past + row0 + 1, a.window), wend = past + wlast + 1;
  const int ctx_min = past + row0 + 1, first_max = attn_first_key(wend, a.window);
  /* thread rows: row0 + 16 mi + g + 8 k (clamped to the last query for the masks, which are
   * worked out on the tiles that need them; rows past q_len are computed and not written) */
  float o[MI][NT][4];
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int i = 0; i < NT; i++)
      o[mi][i][0] = o[mi][i][1] = o[mi][i][2] = o[mi][i][3] = 0.0f;
  float m[MI][2], l[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
    m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;
  const float LOG2E = 1.4426950408889634f;
  const float sl = a.scale * LOG2E, cap = a.softcap, capin = cap > 0.0f ? a.scale / cap : 0.0f,
              capout = cap * LOG2E, es = cap > 0.0f ? 1.0f : sl;

  const bf16 *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD, block_stride = (size_t)a.n_kv * BS * HD;
  const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(tile_smem);
  const uint32_t qs = sbase + (uint32_t)(4 * TILE) * 2u;

  /* Q's rows of this block (zero past q_len), in the first copy group */
#pragma unroll
  for (int i = 0; i < BQ * NC / 128; i++) {
    const int idx = tid + i * 128, r = idx / NC, c = idx % NC;
    const bool valid = crow0 + r < q_len;
    const bf16 *src = valid ? a.q + ((size_t)(t0 + crow0 + r) * a.n_heads + h) * HD + c * 8 : a.q;
    tile_cp16(qs + tile_off<NC>(r, c), src, valid);
  }

  /* copy tile IT's K and V rows into stage IT & 1 */
  auto load_tile = [&](int it) {
    const int j0 = kbeg + it * TK;
    const uint32_t ks = sbase + (uint32_t)((it & 1) * 2 * TILE) * 2u, vs = ks + (uint32_t)TILE * 2u;
#pragma unroll
    for (int i = 0; i < TK * NC / 128; i++) {
      const int idx = tid + i * 128, r = idx / NC, c = idx % NC, j = j0 + r;
      const bool valid = j < kend;
      size_t off = 0;
      if (valid)
        off = (size_t)__ldg(bt + j / BS) * block_stride + head_off + (size_t)(j % BS) * HD + c * 8;
      const uint32_t so = tile_off<NC>(r, c);
      tile_cp16(ks + so, kc + off, valid);
      tile_cp16(vs + so, vc + off, valid);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  if (ntiles > 0)
    load_tile(0);
  else /* cannot happen (a query sees its own key); no copy left in flight at exit */
    asm volatile("cp.async.wait_all;\n" ::);
  for (int it = 0; it < ntiles; it++) {
    if (it + 1 < ntiles) {
      load_tile(it + 1);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    const int j0 = kbeg + it * TK;
    if (wlive && j0 < wend && j0 + TK > wbeg) {
      const uint32_t ks = sbase + (uint32_t)((it & 1) * 2 * TILE) * 2u, vs = ks + (uint32_t)TILE * 2u;
      float s[MI][TK / 8][4];
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int nt = 0; nt < TK / 8; nt++)
          s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
      for (int c16 = 0; c16 < KC; c16++) {
        uint32_t qa[MI][4]; /* A: rows 0-7 / 8-15 x dims 0-7 / 8-15 of the chunk */
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
          const int r = warp * WR + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = c16 * 2 + (lane >> 4);
          tile_ldsm4(qa[mi], qs + tile_off<NC>(r, c));
        }
#pragma unroll
        for (int np = 0; np < TK / 16; np++) { /* keys np * 16 .. + 15: two n-tiles */
          uint32_t kb[4]; /* b0, b1 of n-tile 2np, then of 2np + 1 */
          const int r = np * 16 + (lane & 7) + (lane >> 4) * 8, c = c16 * 2 + ((lane >> 3) & 1);
          tile_ldsm4(kb, ks + tile_off<NC>(r, c));
#pragma unroll
          for (int mi = 0; mi < MI; mi++) {
            attn_mma4(s[mi][2 * np], qa[mi], kb[0], kb[1], bf16());
            attn_mma4(s[mi][2 * np + 1], qa[mi], kb[2], kb[3], bf16());
          }
        }
      }
      const bool need_mask = j0 + TK > ctx_min || j0 < first_max;
      uint32_t pa[MI][TK / 16][4];
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int k = 0; k < 2; k++) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < TK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              float v = s[mi][nt][2 * k + e];
              if (cap > 0.0f)
                v = capout * tanhf(v * capin); /* else scaled in the exponent */
              if (need_mask) {
                const int key = j0 + nt * 8 + 2 * t + e;
                const int ctx = past + min(row0 + 16 * mi + g + 8 * k, q_len - 1) + 1;
                v = key >= attn_first_key(ctx, a.window) && key < ctx ? v : -INFINITY;
              }
              s[mi][nt][2 * k + e] = v;
              mx = fmaxf(mx, v);
            }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          /* m, mx: maxima of the raw scores (times sl in the log2 domain) or of the capped ones */
          const float mnew = fmaxf(m[mi][k], mx);
          const float mref = mnew == -INFINITY ? 0.0f : mnew * es; /* a row with no key yet adds nothing */
          const float alpha = exp2f(m[mi][k] * es - mref);
          m[mi][k] = mnew;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < TK / 8; nt++) {
            const float p0 = exp2f(fmaf(s[mi][nt][2 * k], es, -mref)), p1 = exp2f(fmaf(s[mi][nt][2 * k + 1], es, -mref));
            sum += p0 + p1;
            pa[mi][nt >> 1][(nt & 1) * 2 + k] = attn_pack(p0, p1, bf16());
          }
          l[mi][k] = l[mi][k] * alpha + sum;
#pragma unroll
          for (int i = 0; i < NT; i++)
            o[mi][i][2 * k] *= alpha, o[mi][i][2 * k + 1] *= alpha;
        }
#pragma unroll
      for (int kc2 = 0; kc2 < TK / 16; kc2++) {
        const int r = kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int dp = 0; dp < NT / 2; dp++) {
          uint32_t vb[4];
          const int c = dp * 2 + (lane >> 4);
          tile_ldsm4t(vb, vs + tile_off<NC>(r, c));
#pragma unroll
          for (int mi = 0; mi < MI; mi++) {
            attn_mma4(o[mi][2 * dp], pa[mi][kc2], vb[0], vb[1], bf16());
            attn_mma4(o[mi][2 * dp + 1], pa[mi][kc2], vb[2], vb[3], bf16());
          }
        }
      }
    }
    __syncthreads(); /* the stage is refilled by the next iteration's copy */
  }
  if (!wlive)
    return;
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int k = 0; k < 2; k++) {
      float lk = l[mi][k];
      lk += __shfl_xor_sync(0xffffffffu, lk, 1);
      lk += __shfl_xor_sync(0xffffffffu, lk, 2);
      const int r = row0 + 16 * mi + g + 8 * k;
      if (r >= q_len)
        continue;
      const float inv = lk > 0.0f ? 1.0f / lk : 0.0f;
      bf16 *orow = a.out + ((size_t)(t0 + r) * a.n_heads + h) * HD;
#pragma unroll
      for (int i = 0; i < NT; i++)
        *(__nv_bfloat162 *)(orow + i * 8 + 2 * t) =
            __floats2bfloat162_rn(o[mi][i][2 * k] * inv, o[mi][i][2 * k + 1] * inv);
    }
}

/* Launches the tile kernel for A on stream ST of the current DEVICE: 0, or 1 when it cannot (the
 * caller takes the per-warp kernel). The shared-memory size above 48 KiB is opted into once per
 * device (a per-device attribute: tensor-parallel backends run on several; device < 0 or >= 64:
 * on every launch). */
template <int BS, int HD, int MI, int TK>
static int attn_prefill_tile_launch(const attn_args *a, int max_query_len, int device, cudaStream_t st) {
  const int smem = (4 * TK + 4 * 16 * MI) * tile_row_chunks<HD>() * 16;
  const int num_qt = (max_query_len + 64 * MI - 1) / (64 * MI);
  static unsigned long long opted = 0; /* bit d: device d has the attribute */
  if (num_qt > 65535)
    return 1;
  const unsigned long long bit = device >= 0 && device < 64 ? 1ull << device : 0;
  if (!bit || !(__atomic_load_n(&opted, __ATOMIC_ACQUIRE) & bit)) {
    if (cudaFuncSetAttribute(attn_prefill_tile_kernel<BS, HD, MI, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem) != cudaSuccess) {
      (void)cudaGetLastError(); /* not sticky; the per-warp kernel runs instead */
      return 1;
    }
    __atomic_fetch_or(&opted, bit, __ATOMIC_RELEASE);
  }
  dim3 grid((unsigned)a->n_heads, (unsigned)num_qt, (unsigned)a->B);
  attn_prefill_tile_kernel<BS, HD, MI, TK><<<grid, 128, smem, st>>>(*a);
  return 0;
}

/* 0 launched, -1 error, 1 not applicable (head_dim, bounds, or PAGODA_ATTN_PREFILL=simd).
 * A bf16 cache takes the wgmma kernel (cuda_attn_wgmma.cu: head_dim 128 on compute capability
 * 9.0), else the shared-memory tile kernel; an e4m3 cache (or PAGODA_ATTN_PREFILL=warp) the
 * per-warp kernel. PAGODA_ATTN_PREFILL=tile skips the wgmma kernel (for comparison). */
int cuda_attention_prefill(struct backend *be, const attn_args *a, int bs, int f8, int max_query_len) {
  static int mode = -1; /* 0 default, 1 simd, 2 warp, 3 tile */
  if (mode < 0) {
    const char *e = getenv("PAGODA_ATTN_PREFILL");
    mode = e && !strcmp(e, "simd") ? 1 : e && !strcmp(e, "warp") ? 2 : e && !strcmp(e, "tile") ? 3 : 0;
  }
  if (mode == 1 || !attn_mma_hd(a->hd) || max_query_len <= 0)
    return 1;
  cudaStream_t st = cuda_be(be)->stream;
  if (!f8 && (mode == 0 || mode == 3) && a->B <= 65535 && a->n_heads <= 65535) {
    int dev = -1; /* the current device: the one cudaFuncSetAttribute sets */
    if (cudaGetDevice(&dev) != cudaSuccess)
      dev = -1, (void)cudaGetLastError();
#ifdef PAGODA_HAVE_WGMMA
    if (mode == 0 && cuda_attention_prefill_wgmma(a, bs, max_query_len, dev, st) == 0) {
      CUDA_LAUNCH_CHECK();
      return 0;
    }
#endif
/* head_dim 256: one 16-row block per warp (MI 1: the accumulators of 32 rows would not fit the
 * registers) and 32-key tiles (98 KiB of shared memory, two thread blocks per SM) */
#define TILE_HD(BS)                                                                                \
  (a->hd == 64    ? attn_prefill_tile_launch<BS, 64, 2, 64>(a, max_query_len, dev, st)                 \
   : a->hd == 80  ? attn_prefill_tile_launch<BS, 80, 2, 64>(a, max_query_len, dev, st)                 \
   : a->hd == 96  ? attn_prefill_tile_launch<BS, 96, 2, 64>(a, max_query_len, dev, st)                 \
   : a->hd == 128 ? attn_prefill_tile_launch<BS, 128, 2, 64>(a, max_query_len, dev, st)                \
                  : attn_prefill_tile_launch<BS, 256, 1, 32>(a, max_query_len, dev, st))
    int r = bs == 8 ? TILE_HD(8) : bs == 16 ? TILE_HD(16) : TILE_HD(32);
#undef TILE_HD
    if (r == 0) {
      CUDA_LAUNCH_CHECK();
      return 0;
    }
  }
  int num_qt = (max_query_len + PRE_ROWS - 1) / PRE_ROWS;
  if ((int64_t)a->B * num_qt > 0x7fffffff || a->n_heads > 65535)
    return 1;
  dim3 grid((unsigned)(a->B * num_qt), (unsigned)a->n_heads), thr(PRE_WARPS * 32);
#define PRE_HD(BS, KV)                                                                             \
  (a->hd == 64    ? attn_prefill_mma_kernel<BS, 64, KV><<<grid, thr, 0, st>>>(*a, num_qt)             \
   : a->hd == 80  ? attn_prefill_mma_kernel<BS, 80, KV><<<grid, thr, 0, st>>>(*a, num_qt)             \
   : a->hd == 96  ? attn_prefill_mma_kernel<BS, 96, KV><<<grid, thr, 0, st>>>(*a, num_qt)             \
   : a->hd == 128 ? attn_prefill_mma_kernel<BS, 128, KV><<<grid, thr, 0, st>>>(*a, num_qt)            \
                  : attn_prefill_mma_kernel<BS, 256, KV><<<grid, thr, 0, st>>>(*a, num_qt))
#define PRE_BS(BS) (f8 ? PRE_HD(BS, kv_f8) : PRE_HD(BS, kv_bf16))
  if (bs == 8)
    PRE_BS(8);
  else if (bs == 16)
    PRE_BS(16);
  else
    PRE_BS(32);
#undef PRE_BS
#undef PRE_HD
  CUDA_LAUNCH_CHECK();
  return 0;
}

CUDA_PRELOAD_ANCHOR(attn_prefill)
