/* cuda_attn_wgmma.cu - causal prefill and chunked-prefill attention over the paged bf16 cache
 * on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), head_dim 128: what
 * cuda_attn_prefill.cu launches first on a compute capability 9.0 GPU. This file is compiled for
 * sm_90a only (CMakeLists.txt: its own object library); on other GPUs, for other head_dims and for
 * an e4m3 cache the mma.sync kernels of cuda_attn_prefill.cu run.
 *
 * Grid (n_heads, ceil(max_query_len / (64 NWG)), num_seqs), query tiles in reverse order (the long
 * causal rows start first), heads of one KV group side by side (their K/V tiles meet in L2). A
 * thread block of NWG warpgroups (default 3: 384 threads, 158 registers each, one block per SM)
 * takes 64 NWG queries of one sequence and head, 64 per warpgroup, and walks the keys they see in
 * tiles of TK (default 64): every thread copies 16-byte pieces of Q (once) and of the tile's K and
 * V rows (gathered through the block table) into shared memory with cp.async, NST stages (default
 * 3: tiles i + 1 and i + 2 are in flight while tile i is computed; one barrier per tile). Each
 * warpgroup then computes S = Q K^T (64 x TK, f32) with 8 wgmma m64nTKk16 reading Q and K from
 * shared memory, the masks (only on tiles that cross a row's causal or window edge), softcap and
 * the online softmax on S in registers (the running max on the raw scores, exp2 by one FMA; O is
 * rescaled only when a row of the warp has a new maximum), and O += P V with TK / 16 wgmma
 * m64n128k16 whose A operand is P, converted to bf16 in the registers that held S (the
 * accumulator fragment of a wgmma is the A fragment of the next), and whose B operand is V read
 * from shared memory as an MN-major (transposed) matrix.
 *
 * Shared-memory layout (the wgmma "128-byte swizzle" canonical layout): a tile of R rows of 128
 * bf16 is two column blocks of 64 dims, [2][R][128 bytes], and chunk c (16 bytes) of row r of a
 * block sits at chunk c ^ (r % 8) of that row; every tile starts 1024-byte aligned, as the
 * swizzle (applied by the hardware on address bits 4-6 from bits 7-9) requires. Descriptors:
 * Q and K (K-major): 8-row groups 1024 bytes apart (SBO), k-step kk at + (kk / 4) column block
 * + (kk % 4) * 32 bytes; V (MN-major, transposed B): 64-dim blocks R * 128 bytes apart (LBO),
 * 8-key groups 1024 bytes apart (SBO), k-step kk (16 keys) at + kk * 2048 bytes (R = TK for K and V, 64 NWG for Q). Keys past the
 * block's range are zero-filled (cp.async with source size 0), so padding never feeds NaN into
 * the PV product. */
#include "backend/cuda/cuda_attn_common.cuh"

#define WG_HD 128
/* shared memory of a block of NWG warpgroups: Q, NST stages of K and V tiles of TK keys, the
 * 1024-byte alignment */
#define WG_SMEM(NWG, NST, TK) ((NWG) * 64 * WG_HD * 2 + 2 * (NST) * (TK) * WG_HD * 2 + 1024)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cuda_attn_wgmma.cu is compiled for sm_90a only"
#endif

/* byte offset of chunk C (0..15) of row R in a tile of ROWS rows (the swizzled layout above) */
__device__ __forceinline__ uint32_t wg_off(int r, int c, int rows) {
  return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
/* a wgmma shared-memory descriptor: start address, leading and stride byte offsets, 128-byte swizzle */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void wg_cp16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
/* keeps the compiler from moving reads or writes of an accumulator across the wgmma fences and waits */
template <int N>
__device__ __forceinline__ void wg_hold(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile("" : "+f"(x[i])::"memory");
}
__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit_wait(void) {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

/* D (m64 x nN, f32; N = 64, 128 keys) += A (64 x 16 bf16, descriptor) x B (N x 16 bf16, K-major descriptor) */
__device__ __forceinline__ void wg_mma_qk(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_mma_qk(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(1));
}

/* D (m64 x n128, f32) += A (64 x 16 bf16, registers) x B (16 x 128 bf16, MN-major descriptor) */
__device__ __forceinline__ void wg_mma_pv(float d[64], const uint32_t a[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* What the kernel reads of attn_args, passed on its own. When attn_args had grown to 152 bytes
 * (9fcb9b7 to 7bd426c), nvcc addressed it through a generic pointer (a by-value parameter over
 * 128 bytes) and this kernel ran 16% slower (1.88 against 1.62 ms at 4 x 4096; bench/RESULTS.md,
 * session 14). attn_args is held within 128 bytes now; this struct keeps the kernel off that
 * boundary whatever the decode kernels add. */
struct wg_args {
  bf16 *out;
  const bf16 *q;
  const void *kc, *vc;
  const int32_t *query_start, *seq_lens, *block_tables;
  int max_blocks, n_heads, n_kv;
  float scale, softcap;
  int window;
};

template <int BS, int NWG, int NST, int TK>
__global__ void __launch_bounds__(NWG * 128, 1) attn_prefill_wgmma_kernel(const wg_args a) {
  constexpr int WG_BQ = NWG * 64, NTH = NWG * 128, WG_Q_BYTES = WG_BQ * WG_HD * 2, WG_TK = TK;
  constexpr int WG_KV_BYTES = TK * WG_HD * 2;
  extern __shared__ __align__(1024) uint8_t wg_smem[];
  const int h = blockIdx.x, b = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int t0 = a.query_start[b], q_len = a.query_start[b + 1] - t0;
  const int crow0 = qt * WG_BQ;
  if (crow0 >= q_len)
    return; /* whole block */
  const int kvh = h / (a.n_heads / a.n_kv);
  const int past = a.seq_lens[b] - q_len; /* keys before the first query */
  const int clast = min(crow0 + WG_BQ - 1, q_len - 1);
  const int kbeg = attn_first_key(past + crow0 + 1, a.window), kend = past + clast + 1;
  const int ntiles = (kend - kbeg + WG_TK - 1) / WG_TK;

  /* this warpgroup's rows (row0 .. row0 + 63) and the keys they see; this thread's rows are
   * row0 + 16 warp + g + 8 k (clamped to the last query for the masks; rows past q_len are
   * computed and not written) */
  const int row0 = crow0 + wg * 64;
  const bool wlive = row0 < q_len;
  const int wlast = min(row0 + 63, q_len - 1);
  const int wbeg = attn_first_key(past + row0 + 1, a.window), wend = past + wlast + 1;
  const int ctx_min = past + row0 + 1, first_max = attn_first_key(wend, a.window);
  int rctx[2];
#pragma unroll
  for (int k = 0; k < 2; k++)
    rctx[k] = past + min(row0 + 16 * warp + g + 8 * k, q_len - 1) + 1;

  float o[64]; /* O fragment: o[nt * 4 + 2 k + e] = row g + 8 k, dim nt * 8 + 2 t + e */
#pragma unroll
  for (int i = 0; i < 64; i++)
    o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float LOG2E = 1.4426950408889634f;
  const float sl = a.scale * LOG2E, cap = a.softcap, capin = cap > 0.0f ? a.scale / cap : 0.0f,
              capout = cap * LOG2E, es = cap > 0.0f ? 1.0f : sl;

  const bf16 *kc = (const bf16 *)a.kc, *vc = (const bf16 *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * WG_HD, block_stride = (size_t)a.n_kv * BS * WG_HD;
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(wg_smem) + 1023u) & ~1023u;
  const uint32_t qs = base, kvs = base + WG_Q_BYTES;

  /* Q's rows of this block (zero past q_len), in the first copy group */
#pragma unroll
  for (int i = 0; i < WG_BQ * 16 / NTH; i++) {
    const int idx = tid + i * NTH, r = idx >> 4, c = idx & 15;
    const bool valid = crow0 + r < q_len;
    const bf16 *src = valid ? a.q + ((size_t)(t0 + crow0 + r) * a.n_heads + h) * WG_HD + c * 8 : a.q;
    wg_cp16(qs + wg_off(r, c, WG_BQ), src, valid);
  }
  /* copy tile IT's K and V rows into stage IT % NST (when IT < ntiles), then close a copy group */
  auto load_tile = [&](int it) {
    const int j0 = kbeg + it * WG_TK;
    const uint32_t ks = kvs + (uint32_t)(it % NST) * 2u * WG_KV_BYTES, vs = ks + WG_KV_BYTES;
#pragma unroll
    for (int i = 0; i < (WG_TK * 16 + NTH - 1) / NTH && it < ntiles; i++) {
      const int idx = tid + i * NTH, r = idx >> 4, c = idx & 15, j = j0 + r;
      if (WG_TK * 16 % NTH != 0 && idx >= WG_TK * 16)
        break;
      const bool valid = j < kend;
      size_t off = 0;
      if (valid)
        off = (size_t)__ldg(bt + j / BS) * block_stride + head_off + (size_t)(j % BS) * WG_HD + c * 8;
      const uint32_t so = wg_off(r, c, WG_TK);
      wg_cp16(ks + so, kc + off, valid);
      wg_cp16(vs + so, vc + off, valid);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  /* tiles 0 .. NST - 2 (Q with tile 0), one copy group each; then iteration IT waits for tile IT
   * (the NST - 2 groups after it may still be in flight), and after the barrier (every warp is done
   * with iteration IT - 1) refills the stage IT - 1 used with tile IT + NST - 1: one barrier per
   * tile, NST - 1 tiles in flight while one is computed */
#pragma unroll
  for (int it = 0; it < NST - 1; it++)
    load_tile(it);
  for (int it = 0; it < ntiles; it++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(NST - 2));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async's writes -> wgmma's reads */
    __syncthreads();
    load_tile(it + NST - 1);
    const int j0 = kbeg + it * WG_TK;
    if (wlive && j0 < wend && j0 + WG_TK > wbeg) { /* warpgroup-uniform */
      const uint32_t ks = kvs + (uint32_t)(it % NST) * 2u * WG_KV_BYTES, vs = ks + WG_KV_BYTES;
      float s[TK / 2]; /* S fragment: s[nt * 4 + 2 k + e] = row g + 8 k, key j0 + nt * 8 + 2 t + e */
#pragma unroll
      for (int i = 0; i < TK / 2; i++)
        s[i] = 0.0f;
      wg_hold(s);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < WG_HD / 16; kk++)
        wg_mma_qk(s, wg_desc(qs + (uint32_t)(wg * 64 * 128 + (kk >> 2) * WG_BQ * 128 + (kk & 3) * 32), 16, 1024),
                  wg_desc(ks + (uint32_t)((kk >> 2) * WG_TK * 128 + (kk & 3) * 32), 16, 1024));
      wg_commit_wait();
      wg_hold(s);
      const bool need_mask = j0 + WG_TK > ctx_min || j0 < first_max;
      uint32_t pa[WG_TK / 16][4]; /* P as the A fragments of the PV k-steps */
      float alpha[2];
#pragma unroll
      for (int k = 0; k < 2; k++) {
        const int first = attn_first_key(rctx[k], a.window);
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < WG_TK / 8; nt++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            float v = s[nt * 4 + 2 * k + e];
            if (cap > 0.0f)
              v = capout * tanhf(v * capin); /* else scaled in the exponent */
            if (need_mask) {
              const int key = j0 + nt * 8 + 2 * t + e;
              v = key >= first && key < rctx[k] ? v : -INFINITY;
            }
            s[nt * 4 + 2 * k + e] = v;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* m, mx: maxima of the raw scores (times sl in the log2 domain) or of the capped ones */
        const float mnew = fmaxf(m[k], mx);
        const float mref = mnew == -INFINITY ? 0.0f : mnew * es; /* a row with no key yet adds nothing */
        alpha[k] = exp2f(m[k] * es - mref);
        m[k] = mnew;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < WG_TK / 8; nt++) {
          const float p0 = exp2f(fmaf(s[nt * 4 + 2 * k], es, -mref)), p1 = exp2f(fmaf(s[nt * 4 + 2 * k + 1], es, -mref));
          sum += p0 + p1;
          pa[nt >> 1][(nt & 1) * 2 + k] = attn_pack(p0, p1, bf16());
        }
        l[k] = l[k] * alpha[k] + sum;
      }
      /* O rescaled only when a row of the warp has a new maximum (times 1 is exact: skipping it
       * changes nothing; late in a long row the maximum rarely moves) */
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int nt = 0; nt < WG_HD / 8; nt++)
          o[nt * 4] *= alpha[0], o[nt * 4 + 1] *= alpha[0], o[nt * 4 + 2] *= alpha[1], o[nt * 4 + 3] *= alpha[1];
      }
      wg_hold(o);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < WG_TK / 16; kk++)
        wg_mma_pv(o, pa[kk], wg_desc(vs + (uint32_t)(kk * 16 * 128), WG_TK * 128, 1024));
      wg_commit_wait();
      wg_hold(o);
    }
  }
  asm volatile("cp.async.wait_all;\n" ::); /* the empty groups of the last iterations */
  if (!wlive)
    return;
#pragma unroll
  for (int k = 0; k < 2; k++) {
    float lk = l[k];
    lk += __shfl_xor_sync(0xffffffffu, lk, 1);
    lk += __shfl_xor_sync(0xffffffffu, lk, 2);
    const int r = row0 + 16 * warp + g + 8 * k;
    if (r >= q_len)
      continue;
    const float inv = lk > 0.0f ? 1.0f / lk : 0.0f;
    bf16 *orow = a.out + ((size_t)(t0 + r) * a.n_heads + h) * WG_HD;
#pragma unroll
    for (int nt = 0; nt < WG_HD / 8; nt++)
      *(__nv_bfloat162 *)(orow + nt * 8 + 2 * t) = __floats2bfloat162_rn(o[nt * 4 + 2 * k] * inv, o[nt * 4 + 2 * k + 1] * inv);
  }
}

template <int NWG, int NST, int TK>
static int wg_opt_in(void) {
  return cudaFuncSetAttribute(attn_prefill_wgmma_kernel<8, NWG, NST, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              WG_SMEM(NWG, NST, TK)) == cudaSuccess &&
         cudaFuncSetAttribute(attn_prefill_wgmma_kernel<16, NWG, NST, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              WG_SMEM(NWG, NST, TK)) == cudaSuccess &&
         cudaFuncSetAttribute(attn_prefill_wgmma_kernel<32, NWG, NST, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              WG_SMEM(NWG, NST, TK)) == cudaSuccess;
}

template <int NWG, int NST, int TK>
static void wg_launch(const attn_args *a, int bs, int max_query_len, cudaStream_t st) {
  dim3 grid((unsigned)a->n_heads, (unsigned)((max_query_len + NWG * 64 - 1) / (NWG * 64)), (unsigned)a->B);
  const int smem = WG_SMEM(NWG, NST, TK);
  const wg_args w = {a->out,        a->q,       a->kc,    a->vc,    a->query_start, a->seq_lens, a->block_tables,
                     a->max_blocks, a->n_heads, a->n_kv,  a->scale, a->softcap,     a->window};
  if (bs == 8)
    attn_prefill_wgmma_kernel<8, NWG, NST, TK><<<grid, NWG * 128, smem, st>>>(w);
  else if (bs == 16)
    attn_prefill_wgmma_kernel<16, NWG, NST, TK><<<grid, NWG * 128, smem, st>>>(w);
  else
    attn_prefill_wgmma_kernel<32, NWG, NST, TK><<<grid, NWG * 128, smem, st>>>(w);
}

/* 0 launched, 1 not applicable: head_dim other than 128, a GPU other than compute capability 9.0
 * (the sm_90a code runs there only), grid bounds, or the shared memory cannot be had. The
 * capability check and the opt-in to more than 48 KiB of shared memory are done once per device
 * (a per-device attribute: tensor-parallel backends run on several; device < 0 or >= 64: on
 * every call). Three warpgroups per block (192 queries), 3 stages of 64-key tiles by default;
 * PAGODA_ATTN_WGMMA_CFG=2x128 (read once) takes 2 warpgroups, 2 stages of 128-key tiles (S of
 * 64 x 128 per warpgroup, up to 255 registers), for measuring. */
int cuda_attention_prefill_wgmma(const attn_args *a, int bs, int max_query_len, int device, cudaStream_t st) {
  static unsigned long long checked = 0, usable = 0; /* bit d: device d checked / usable */
  static int cfg = -1; /* 0: 3 warpgroups x 64-key tiles, 1: 2 x 128 */
  if (cfg < 0) {
    const char *e = getenv("PAGODA_ATTN_WGMMA_CFG");
    cfg = e && !strcmp(e, "2x128") ? 1 : 0;
  }
  if (a->hd != WG_HD || max_query_len <= 0 || (max_query_len + 127) / 128 > 65535 || a->B > 65535 ||
      a->n_heads > 65535)
    return 1;
  const unsigned long long bit = device >= 0 && device < 64 ? 1ull << device : 0;
  if (!bit || !(__atomic_load_n(&checked, __ATOMIC_ACQUIRE) & bit)) {
    int major = 0, minor = 0, ok = device >= 0;
    if (ok && (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
               cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess))
      ok = 0;
    ok = ok && major == 9 && minor == 0 && wg_opt_in<3, 3, 64>() && wg_opt_in<2, 2, 128>();
    (void)cudaGetLastError(); /* none of these errors is sticky; the mma.sync kernels run instead */
    if (ok)
      __atomic_fetch_or(&usable, bit, __ATOMIC_RELEASE);
    __atomic_fetch_or(&checked, bit, __ATOMIC_RELEASE);
    if (!bit && !ok)
      return 1;
  }
  if (bit && !(__atomic_load_n(&usable, __ATOMIC_ACQUIRE) & bit))
    return 1;
  if (cfg == 1)
    wg_launch<2, 2, 128>(a, bs, max_query_len, st);
  else
    wg_launch<3, 3, 64>(a, bs, max_query_len, st);
  return 0;
}

CUDA_PRELOAD_ANCHOR(attn_wgmma)
