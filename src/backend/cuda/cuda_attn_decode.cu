/* cuda_attn_decode.cu - decode attention (every sequence has at most one query: the batch's
 * max_query_len is 1), split along the context (FlashDecoding) and GQA-grouped.
 *
 * Grid (num_seqs * n_kv_heads, num_parts). The thread block of (sequence b, KV head kvh,
 * partition p) serves the G = n_heads / n_kv_heads query heads of kvh over the keys
 * first + p * L .. first + (p + 1) * L - 1 (clipped to the context; L = dec_part_len of the
 * sequence's own key count), so each K/V
 * row is read once per group. A row is split over LPR = head_dim / N lanes, each loading 16 bytes
 * (N = 8 bf16 or 16 e4m3 values), so a warp's load covers KPW = 32 / LPR consecutive rows of one
 * block; each lane group issues the loads of U keys before using any of them, and keeps its own
 * online softmax (max, sum, its N output dims per head) updated once per U keys. The groups
 * and the DEC_WARPS warps are merged at the end (butterfly, then shared memory). A sequence whose
 * keys fit one partition writes its output directly; otherwise each partition writes its
 * unnormalized output and (max, sum), and the partitions are combined (dec_comb_max /
 * dec_comb_dim, one arithmetic for every way) by the partition blocks themselves through
 * distributed shared memory when the kernel runs in thread block clusters and the sequence has at
 * most a cluster's partitions (the cluster fold, dec_cfold, below: the default on compute
 * capability 9.0), else from the split-K scratch either by the last partition block of the
 * (sequence, KV head) to finish (the fold, dec_fold) or, with PAGODA_ATTN_FOLD=0 (cb->attn_fold,
 * read at create; no clusters then) or when a captured batch has more sequences than there are
 * counters, by attn_decode_reduce_kernel, a second launch. The output is the same bits every way.
 *
 * The fold (a semaphore, as CUTLASS's split-K "serial reduction" counts its tiles): every partition
 * block writes its partials, meets at a barrier, and its thread 0 counts the block on its (sequence,
 * KV head) counter with one atomic add of acq_rel order at GPU scope (it releases the block's
 * partials, which the barrier ordered before it; no per-thread fence.sc, which took 0.2% of the 8B
 * step, bench/RESULTS.md, session 16); the block that draws nparts - 1 is the last (its add also
 * acquires the others' partials, which its threads read after a second barrier), reads the
 * others' partials through L2 (__ldcg: never the non-coherent path, which may hold stale lines),
 * combines the G heads' partitions in order p = 0 .. nparts - 1 and writes the output.
 * INVARIANT: the counters (the first attn_cnt_n ints of the scratch) are 0 between launches:
 * zeroed (cudaMemsetAsync) when the scratch is (re)allocated, outside any capture, and reset to 0
 * by the last block of each (sequence, KV head) that counted (every partition of a split sequence
 * counts, exactly once; partitions past its end and unsplit sequences never touch it), so the
 * next launch and every CUDA-graph replay start from 0.
 *
 * CUDA-graph safety: the launch shape depends only on num_seqs and the host bound max_seq_len
 * (which may be loose), never on device data; the real context comes from seq_lens, and
 * partitions past a sequence's end exit at once. The scratch is allocated outside any capture,
 * on the first attention call of the shape (the profiling step), at its largest size for up to
 * max(cuda_attention_reserve's max_seqs, that call's num_seqs) sequences and any context; a
 * captured launch that would need more than exists uses fewer, longer partitions instead. */
#include <type_traits>

#include "backend/cuda/cuda_attn_common.cuh"
#include "backend/cuda/cuda_pdl.cuh"

#define DEC_WARPS 4
#define DEC_MIN_PART 64      /* keys: partitions shorter than this are not worth a reduction */
/* Aim for this many thread blocks per SM before splitting stops (dec_ctas_per_sm). bf16: 2, the
 * tensor-core kernel's residency at head_dim 128 (194 registers), so the split is one wave; with 6
 * (three waves of shorter partitions) the 8B shape's step took 0.1-1.0% longer at batch 1 x 640
 * keys, 20% longer at batch 1 x 16K keys and 6-7% longer at 64 x (512, 128) (bench/RESULTS.md,
 * session 13).
 * e4m3 at head_dim 128: 2 as well, the residency of its 5-stage pipeline (80 KiB of shared memory
 * per block): at 64 x 4096 it took 0.146-0.148 ms at block 16 against 0.157-0.161 for 3 stages at
 * 8 per SM (3 resident blocks, partitions in 3.9 waves), and 4 per SM (two partitions) was slower
 * (bench/RESULTS.md, session 14). Other e4m3 head_dims: 8, measured at 64 x 4096 against 6, 12,
 * 16, 24 and 32 for the 3-stage kernel. */
#define DEC_CTAS_PER_SM_BF16 2
#define DEC_CTAS_PER_SM_F8 8
#define DEC_CTAS_PER_SM_F8_HD128 2
/* cp.async stages of the e4m3 tensor-core kernel: 5 at head_dim 128 (4 warp steps in flight; with
 * the partitions aimed at 2 per SM, at 64 x 4096, block 16: 3 stages 0.174 ms (3 blocks resident,
 * so 1.3 waves), 5 stages 0.146-0.148, 6 0.151-0.152, 7 0.148-0.149; at 8 per SM 3 and 4 stages
 * 0.157-0.159, 5 stages 0.164-0.166; bench/RESULTS.md, session 14); 3 at head_dim 64 (not
 * measured otherwise) */
__host__ __device__ static constexpr int dec_f8_stages(int hd) { return hd == 128 ? 5 : 3; }
/* Consecutive 16-key steps (a power of 2) each warp of the e4m3 pipeline takes before the next
 * warp's keys, in partitions long enough to give every warp that many: see
 * attn_decode_mma_kernel. */
#define DEC_F8_CHUNK 4
__host__ __device__ static constexpr int dec_log2(int x) { return x > 1 ? 1 + dec_log2(x / 2) : 0; }

/* The shared memory of attn_decode_mma_kernel<BS, HD, KV> for E = KV::elem, for the kernel and its
 * launch: PIPE (e4m3 with whole 16-byte pieces, head_dim <= 128) copies each thread's K/V pieces
 * of a warp step (NPC slots of 16 bytes) into NS stages of dynamic shared memory (SMEM bytes, at
 * least the warps' merge, which reuses them); otherwise the merge is a static array (SMEM 0). */
template <int HD, class E>
struct dec_shm {
  typedef attn_rows<HD, E> L;
  static constexpr bool PIPE = sizeof(E) == 1 && L::TE == 0 && HD <= 128;
  static constexpr int NS = dec_f8_stages(HD);
  static constexpr int NPC = 4 * L::NPT; /* pieces per thread and step: K and V of 2 keys */
  static constexpr int MERGE_BYTES = DEC_WARPS * 8 * HD * 4 + 2 * DEC_WARPS * 8 * 4;
  static constexpr int CLU_BYTES = 8 * HD * 4 + 8 * 8; /* the cluster fold's partials, after the merge */
  static constexpr int STAGE_BYTES = NS * NPC * DEC_WARPS * 32 * 16;
  static constexpr int SMEM =
      PIPE ? (STAGE_BYTES > MERGE_BYTES + CLU_BYTES ? STAGE_BYTES : MERGE_BYTES + CLU_BYTES) : 0;
};

/* The partition length of a sequence with NKEYS keys: its keys spread over the grid's num_parts
 * partitions, rounded up to the granule a.part_len (a whole number of warp steps, at least
 * DEC_MIN_PART keys). Worked out on the device from the sequence's own length, so a launch sized
 * by a loose host bound (a CUDA graph's max_model_len) still splits a short context over many
 * thread blocks; at most num_parts partitions are used. */
__device__ __forceinline__ int dec_part_len(const attn_args &a, int nkeys) {
  int per = (nkeys + a.num_parts - 1) / a.num_parts;
  per = (per + a.part_len - 1) / a.part_len * a.part_len;
  return per > a.part_len ? per : a.part_len;
}

/* The combine of one head's NPARTS partitions, whose partials start at index P0 of the scratch
 * (p0 = (b * n_heads + h) * num_parts): their largest max, then output dim D as the softmax-weighted
 * sum in partition order, normalised. The reduce kernel and the fold's last block both call these
 * two, so the two ways give the same bits (explicit fmaf: no contraction left to the compiler).
 * Loads through L2 (__ldcg): in the fold the partials were written by other blocks of the same
 * grid. Unrolled so that several partitions' loads are in flight at once (the order of the sums
 * stays p = 0, 1, ...). */
template <class ML>
__device__ __forceinline__ float dec_comb_max(ML ml, int nparts) {
  float mm = -INFINITY;
#pragma unroll 4
  for (int p = 0; p < nparts; p++)
    mm = fmaxf(mm, ml(p).x);
  return mm;
}

template <class ML, class ACC>
__device__ __forceinline__ bf16 dec_comb_dim(ML ml, ACC acc, int nparts, float mm) {
  float ls = 0.0f, as = 0.0f;
#pragma unroll 4
  for (int p = 0; p < nparts; p++) {
    float2 m = ml(p);
    float f = __expf(m.x - mm);
    ls = __fmaf_rn(m.y, f, ls);
    as = __fmaf_rn(acc(p), f, as);
  }
  return __float2bfloat16(as / ls);
}

/* The loaders of the split-K scratch: head partials from P0, output dim D. */
struct dec_ml_global {
  const float2 *ml;
  __device__ __forceinline__ float2 operator()(int p) const { return __ldcg(ml + p); }
};
struct dec_acc_global {
  const float *acc;
  int hd;
  __device__ __forceinline__ float operator()(int p) const { return __ldcg(acc + (size_t)p * hd); }
};
__device__ __forceinline__ dec_ml_global dec_ml_of(const attn_args &a, size_t p0) { return {a.part_ml + p0}; }
__device__ __forceinline__ dec_acc_global dec_acc_of(const attn_args &a, size_t p0, int d) {
  return {attn_part_acc(a) + p0 * a.hd + d, a.hd};
}

/* The fold (see the top of the file): called by every thread of partition block (b, kvh) of a
 * sequence split in NPARTS > 1 partitions once its partials are written (block-uniform: no thread
 * has returned); the last block of the (b, kvh) to get here combines the G heads of kvh into the
 * output row of token TOK and resets the counter. SM: 9 words of the kernel's shared memory,
 * free once every thread is past the partials' writes (the e4m3 kernel at head_dim 128 has no
 * byte of static shared memory left for more). */
template <int HD>
__device__ __forceinline__ void dec_fold(const attn_args &a, int b, int kvh, int G, int tok, int nparts, float *sm) {
  float *s_mm = sm;                           /* [G <= 8]: each head's largest partition max */
  volatile int *s_last = (volatile int *)(sm + 8); /* this block is the last */
  __syncthreads(); /* every thread's partials are written, and every thread is done with SM */
  if (threadIdx.x == 0) {
    int *cnt = a.part_cnt + (size_t)b * a.n_kv + kvh;
    int prev;
    /* acq_rel at GPU scope: releases this block's partials (ordered before it by the barrier) and,
     * in the last block, acquires the others' (its other threads read them after the barrier below) */
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(cnt) : "memory");
    const int last = prev == nparts - 1;
    if (last)
      atomicExch(cnt, 0); /* every partition has counted: 0 again for the next launch / replay */
    *s_last = last;
  }
  __syncthreads();
  if (!*s_last)
    return;
  if ((int)threadIdx.x < G)
    s_mm[threadIdx.x] = dec_comb_max(dec_ml_of(a, ((size_t)b * a.n_heads + kvh * G + threadIdx.x) * a.num_parts), nparts);
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD, h = kvh * G + g;
    const size_t p0 = ((size_t)b * a.n_heads + h) * a.num_parts;
    a.out[((size_t)tok * a.n_heads + h) * HD + d] =
        dec_comb_dim(dec_ml_of(a, p0), dec_acc_of(a, p0, d), nparts, s_mm[g]);
  }
}

/* ---- The cluster fold (cb->attn_cluster, PAGODA_ATTN_CLUSTER; on by default from compute
 * capability 9.0): when the grid's P partitions fit one thread block cluster (P <= attn_cluster,
 * 16) and the grid one block per SM (B * n_kv * P <= the SMs: batch 1 of the 8B shape), the kernel
 * is launched in clusters of (1, P, 1), so the partitions of a (sequence, KV head) are co-scheduled
 * in one GPC. Each partition keeps its partials in its block's shared memory; after a cluster
 * barrier partition p combines the outputs i = p, p + nparts, ... of the G heads, reading every
 * partition's partials through distributed shared memory with dec_comb_max / dec_comb_dim (the
 * same arithmetic: the same bits as the fold and the reduce), and a second barrier keeps every
 * block's shared memory alive until the others are done reading it. No global round trip: with
 * the fold, the counter and the last block's L2 reads (queued behind o's weight copies) left about
 * 11 us of a layer of the 8B step from q/k/v's end to o's wait; with the cluster the step is
 * 2.5-2.8% faster (bench/RESULTS.md, session 17). A block that has exited counts as arrived at a
 * cluster barrier (PTX ISA, exit), so the partitions past a sequence's end may leave whenever they
 * like. A CUDA graph is captured for the model length, where P is 33 at batch 1 on the H200: the
 * engine captures decode graphs of contexts up to cuda_attn_graph_short_ctx (16 x 64 keys) apart,
 * with that bound (backend_caps.graph_short_ctx), so those steps take the cluster and longer ones
 * keep the fold. Clusters over more partitions than that, padded, or over more than one block per
 * SM were slower: 1 x 6000 keys +4%, 4 x 2048 keys +2% (session 17). ---- */
__device__ __forceinline__ int dec_cluster_ctas(void) {
  unsigned n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return (int)n;
}
__device__ __forceinline__ void dec_cluster_sync(void) {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t dec_mapa(uint32_t addr, int rank) {
  uint32_t r;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
struct dec_ml_dsmem {
  uint32_t addr; /* this block's shared address of the head's (max, sum); partition q is cluster rank q */
  __device__ __forceinline__ float2 operator()(int q) const {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(dec_mapa(addr, q)));
    return v;
  }
};
struct dec_acc_dsmem {
  uint32_t addr;
  __device__ __forceinline__ float operator()(int q) const {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dec_mapa(addr, q)));
    return v;
  }
};
/* PACC [G][HD] and PML [G]: this block's partials in its shared memory, written by every thread
 * before the call (block-uniform call, every working partition of the cluster calls it). */
template <int HD>
__device__ __forceinline__ void dec_cfold(const attn_args &a, int kvh, int G, int tok, int nparts, int p,
                                          const float *pacc, const float2 *pml) {
  dec_cluster_sync(); /* every partition's partials are in its shared memory */
  const uint32_t sacc = (uint32_t)__cvta_generic_to_shared(pacc), sml = (uint32_t)__cvta_generic_to_shared(pml);
  for (int i = p + nparts * (int)threadIdx.x; i < G * HD; i += nparts * (int)blockDim.x) {
    const dec_ml_dsmem ml{sml + (uint32_t)(i / HD) * 8u};
    const float mm = dec_comb_max(ml, nparts);
    a.out[((size_t)tok * a.n_heads + kvh * G) * HD + i] =
        dec_comb_dim(ml, dec_acc_dsmem{sacc + (uint32_t)i * 4u}, nparts, mm);
  }
  dec_cluster_sync(); /* no block leaves while another may still read its shared memory */
}

template <int BS, int HD, int G, class KV, int U>
__global__ void __launch_bounds__(DEC_WARPS * 32) attn_decode_kernel(const attn_args a) {
  pdl_enter(a.pdl_early); /* cuda_pdl.cuh */
  typedef typename KV::elem E;
  constexpr int N = KV::N;       /* elements per lane per row (one load) */
  constexpr int LPR = HD / N;    /* lanes per key row */
  constexpr int KPW = 32 / LPR;  /* rows per warp load */
  constexpr int TK = U * KPW;    /* keys per warp step */
  __shared__ float sm_acc[DEC_WARPS][G][HD];
  __shared__ float sm_m[DEC_WARPS][G], sm_l[DEC_WARPS][G];

  const int b = blockIdx.x / a.n_kv, kvh = blockIdx.x % a.n_kv, p = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane / LPR, part = lane % LPR;
  const int t = a.query_start[b];
  attn_tok tk = attn_lookup(a.query_start, a.seq_lens, a.B, t, b, a.window);
  if (tk.q_len <= 0)
    return; /* a padded sequence without a query: nothing to write */
  const int nkeys = tk.ctx - tk.first;
  const int plen = dec_part_len(a, nkeys);
  const int nparts = nkeys > 0 ? (nkeys + plen - 1) / plen : 0;
  if (p >= (nparts > 0 ? nparts : 1))
    return; /* past this sequence's end (the grid is sized by the host bound) */
  if (nparts == 0) { /* no keys: zeros, as the general kernels */
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
      a.out[((size_t)t * a.n_heads + kvh * G) * HD + i] = __float2bfloat16(0.0f);
    return;
  }
  const int k0 = tk.first + p * plen;
  const int k1 = min(k0 + plen, tk.ctx);

  /* q of the group's heads: this lane's N dims, scaled */
  float qv[G][N];
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int c = 0; c < N / 8; c++)
      attn_load_q8(qv[g] + c * 8, a.q + ((size_t)t * a.n_heads + kvh * G + g) * HD + part * N + c * 8, a.scale);
  float m[G], l[G], acc[G][N];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < N; d++)
      acc[g][d] = 0.0f;
  }
  const E *kc = (const E *)a.kc, *vc = (const E *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD + (size_t)part * N;
  const size_t block_stride = (size_t)a.n_kv * BS * HD;

  for (int j0 = k0 + warp * TK; j0 < k1; j0 += DEC_WARPS * TK) { /* warp-uniform bounds */
    typename KV::vec ku[U], vu[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int j = j0 + u * KPW + sub;
      if (j < k1) {
        size_t row = (size_t)__ldg(bt + j / BS) * block_stride + head_off + (size_t)(j % BS) * HD;
        ku[u] = __ldg((const typename KV::vec *)(kc + row));
        vu[u] = __ldg((const typename KV::vec *)(vc + row));
      } else {
        ku[u] = vu[u] = typename KV::vec{};
      }
    }
    float s[G][U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[N];
      KV::cvt16(kf, ku[u], a.k_scale);
#pragma unroll
      for (int g = 0; g < G; g++) {
        float x = 0.0f;
#pragma unroll
        for (int d = 0; d < N; d++)
          x += qv[g][d] * kf[d];
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) /* within the aligned group of LPR lanes */
          x += __shfl_xor_sync(0xffffffffu, x, o);
        s[g][u] = j0 + u * KPW + sub < k1 ? attn_cap(x, a.softcap) : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; u++)
        mx = fmaxf(mx, s[g][u]);
      if (mx == -INFINITY) { /* none of this group's keys is valid yet: they add nothing */
#pragma unroll
        for (int u = 0; u < U; u++)
          s[g][u] = 0.0f;
        continue;
      }
      float alpha = __expf(m[g] - mx); /* 0 while m = -inf */
      l[g] *= alpha;
#pragma unroll
      for (int d = 0; d < N; d++)
        acc[g][d] *= alpha;
      m[g] = mx;
#pragma unroll
      for (int u = 0; u < U; u++)
        s[g][u] = __expf(s[g][u] - mx), l[g] += s[g][u]; /* invalid keys: exp(-inf) = 0 */
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      float vf[N];
      KV::cvt16(vf, vu[u], a.v_scale);
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int d = 0; d < N; d++)
          acc[g][d] += s[g][u] * vf[d];
    }
  }
  /* merge the KPW lane groups of the warp (lanes with the same `part` hold the same dims) */
#pragma unroll
  for (int g = 0; g < G; g++) {
#pragma unroll
    for (int o = LPR; o < 32; o <<= 1) {
      float m2 = __shfl_xor_sync(0xffffffffu, m[g], o), l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      float mm = fmaxf(m[g], m2);
      float a1 = mm == -INFINITY ? 0.0f : __expf(m[g] - mm), a2 = mm == -INFINITY ? 0.0f : __expf(m2 - mm);
      l[g] = l[g] * a1 + l2 * a2;
#pragma unroll
      for (int d = 0; d < N; d++)
        acc[g][d] = acc[g][d] * a1 + __shfl_xor_sync(0xffffffffu, acc[g][d], o) * a2;
      m[g] = mm;
    }
    if (sub == 0) {
#pragma unroll
      for (int d = 0; d < N; d++)
        sm_acc[warp][g][part * N + d] = acc[g][d];
      if (part == 0)
        sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
    }
  }
  __syncthreads();
  /* merge the warps: one (head, dim) per thread and step */
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    int g = i / HD, d = i % HD;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++)
      mm = fmaxf(mm, sm_m[w][g]); /* finite: the partition has at least one key */
    float ls = 0.0f, as = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) {
      float f = sm_m[w][g] == -INFINITY ? 0.0f : __expf(sm_m[w][g] - mm);
      ls += sm_l[w][g] * f;
      as += sm_acc[w][g][d] * f;
    }
    int h = kvh * G + g;
    if (nparts == 1) {
      a.out[((size_t)t * a.n_heads + h) * HD + d] = __float2bfloat16(as / ls);
    } else {
      size_t pi = ((size_t)b * a.n_heads + h) * a.num_parts + p;
      attn_part_acc(a)[pi * HD + d] = as;
      if (d == 0)
        a.part_ml[pi] = make_float2(mm, ls);
    }
  }
  if (nparts > 1 && a.part_cnt)
    dec_fold<HD>(a, b, kvh, G, t, nparts, &sm_acc[0][0][0]);
}

/* Asks L2 for the K and V rows of KV head KVH of sequence B's keys K0 .. K1 - 1 (one 128-byte line
 * per thread and request), without waiting for them or holding registers. Issued before the
 * kernel's wait: L2 is where every SM's writes land, so a line the kernel before is still writing
 * (this step's key) is fetched again by the load after the wait, never read stale. */
template <int BS, int HD, class E>
__device__ __forceinline__ void dec_prefetch_kv(const attn_args &a, int b, int kvh, int k0, int k1) {
  constexpr int LPR = (HD * (int)sizeof(E) + 127) / 128; /* lines per row */
  const int32_t *bt = a.block_tables + (size_t)b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD, block_stride = (size_t)a.n_kv * BS * HD;
  for (int i = threadIdx.x; i < (k1 - k0) * 2 * LPR; i += blockDim.x) {
    const int j = k0 + i / (2 * LPR), r = i % (2 * LPR);
    const size_t row = (size_t)__ldg(bt + j / BS) * block_stride + head_off + (size_t)(j % BS) * HD;
    const E *base = (const E *)(r < LPR ? a.kc : a.vc) + row;
    asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)base + (r % LPR) * 128));
  }
}

/* ---- the tensor-core variant (the default): mma.sync m16n8k16 with f32 accumulators, bf16
 * operands for a bf16 cache and f16 for e4m3 (exact: e4m3 -> f16 by cvt; q is rounded to f16).
 * Each warp takes 16 keys per step. QK: S[head][key] = Q (16 rows: the G <= 8 query heads of the
 * KV head, the rest zero) x K^T, one mma per 16 dims and 8 keys, K fed as the B operand straight
 * from 16-byte loads (thread (g, t) loads key g; the dims inside each 16-dim chunk are permuted
 * the same way for Q and K, which a dot product allows; head_dim 80 and 96 end a row with a
 * shorter load: struct attn_rows). The score fragment is the PV mma's A operand as it stands
 * (FlashAttention-2's register reuse); V is loaded as K was and turned into the B operand by
 * movmatrix.trans (8x8 transposes in registers). Online softmax per head row: max over the 4
 * threads of a row group, partial sums per thread. Head_dim 64, 80, 96, 128 and 256 (256: V is
 * loaded after the scores, so that K and V of 16 keys are not in registers at once). */
template <int BS, int HD, class KV>
__global__ void __launch_bounds__(DEC_WARPS * 32) attn_decode_mma_kernel(const attn_args a) {
  typedef typename KV::elem E;
  constexpr bool F8 = sizeof(E) == 1;
  typedef typename std::conditional<F8, __half, bf16>::type MT; /* mma operand type */
  typedef attn_rows<HD, E> L;  /* which dims each thread loads (cuda_attn_common.cuh) */
  constexpr int NT = L::PAIRS; /* PV n-tiles */
  constexpr bool LATE_V = HD > 128; /* registers: V is loaded after the scores (head_dim 256) */
  /* e4m3 at head_dim 64 and 128 (full 16-byte pieces only): the K/V pieces of each warp step are
   * copied by cp.async into this thread's own slots of NS = dec_f8_stages(HD) shared-memory stages
   * (dynamic shared memory: dec_shm), so NS - 1 steps are in flight while one is computed
   * (an e4m3 key is half the bytes of a bf16 one for the same work, so the register-fed loads left
   * too few bytes in flight). Each thread reads back only what it copied: cp.async.wait_group, no
   * barrier. */
  typedef dec_shm<HD, E> SH;
  constexpr bool PIPE = SH::PIPE;
  constexpr int NS = SH::NS, NPC = SH::NPC;
  /* PIPE: the stages in dynamic shared memory (SH::SMEM bytes), else the merge in static; the
   * warps' merge (sm_o, sm_m, sm_l) reuses the stages once every warp is done with them */
  __shared__ __align__(16) unsigned char sm_static[PIPE ? 16 : SH::MERGE_BYTES + SH::CLU_BYTES];
  extern __shared__ __align__(16) unsigned char sm_dyn[];
  unsigned char *const sm_raw = PIPE ? sm_dyn : sm_static;
  float(*sm_o)[8][HD] = (float(*)[8][HD])sm_raw;
  float(*sm_m)[8] = (float(*)[8])(sm_raw + DEC_WARPS * 8 * HD * 4);
  float(*sm_l)[8] = (float(*)[8])(sm_raw + DEC_WARPS * 8 * HD * 4 + DEC_WARPS * 8 * 4);

  const int b = blockIdx.x / a.n_kv, kvh = blockIdx.x % a.n_kv, p = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int G = a.n_heads / a.n_kv;
  const E *kc = (const E *)a.kc, *vc = (const E *)a.vc;
  const int32_t *bt = a.block_tables + (size_t)b * a.max_blocks;
  const size_t head_off = (size_t)kvh * BS * HD;
  const size_t block_stride = (size_t)a.n_kv * BS * HD;
  /* ATTN_KV_EARLY (register-fed K/V only): the warp's first step of K/V in registers before the
   * wait (cuda_pdl.cuh rule 3), but for this step's keys (the q/k/v kernel writes them), loaded after */
  uint4 pkr[2][L::NPT], pvr[2][L::NPT];
  bool pre = false;
  /* PREFETCH: the batch metadata and the K/V rows before the wait (cuda_pdl.cuh, rule 3) */
  if (!a.prefetch)
    pdl_enter(a.pdl_early); /* cuda_pdl.cuh */
  const int tok = a.query_start[b];
  attn_tok tk = attn_lookup(a.query_start, a.seq_lens, a.B, tok, b, a.window);
  const int nkeys = tk.ctx - tk.first;
  const int plen = dec_part_len(a, nkeys);
  const int nparts = nkeys > 0 ? (nkeys + plen - 1) / plen : 0;
  if (a.prefetch) {
    if (tk.q_len > 0 && p < nparts)
      dec_prefetch_kv<BS, HD, E>(a, b, kvh, tk.first + p * plen,
                                 min(tk.first + p * plen + min(plen, a.prefetch), tk.ctx));
    /* A block with nothing to read leaves before the wait (partition 0 always waits: cuda_pdl.cuh
     * rule 2), so the unused partitions of a grid sized by a loose bound (a CUDA graph's
     * max_model_len: 33 per KV head at batch 1 on the H200, of which a 640-key context uses 10)
     * free their slots while the kernel before still runs, and the next kernel's blocks find the
     * multiprocessors as soon as the working partitions have waited (cb->attn_exit_early). */
    if ((a.early & ATTN_EXIT_EARLY) && p > 0 && (tk.q_len <= 0 || p >= nparts))
      return;
    if constexpr (!PIPE && !LATE_V) {
      if ((a.early & ATTN_KV_EARLY) && tk.q_len > 0 && p < nparts) {
        const int k0 = tk.first + p * plen, k1 = min(k0 + plen, tk.ctx), j0 = k0 + warp * 16;
        if (j0 < k1) {
          size_t row[2];
          L::template load_kv16<BS, true>(pkr, pvr, row, kc, vc, bt, block_stride, head_off, j0,
                                          min(k1, tk.ctx - tk.q_len), g, t);
          pre = true;
        }
      }
    }
    pdl_enter(a.pdl_early);
  }
  if (tk.q_len <= 0)
    return;
  if (p >= (nparts > 0 ? nparts : 1))
    return;
  if (nparts == 0) {
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
      a.out[((size_t)tok * a.n_heads + kvh * G) * HD + i] = __float2bfloat16(0.0f);
    return;
  }
  const int k0 = tk.first + p * plen;
  const int k1 = min(k0 + plen, tk.ctx);

  /* Q as the A operand, row g (head kvh * G + g; zero past G), in the permuted dim order:
   * pairs 2c and 2c + 1 are chunk c's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9) */
  uint32_t qa[L::PAIRS];
  L::template q_pairs<MT>(qa, a.q + ((size_t)tok * a.n_heads + kvh * G + (g < G ? g : 0)) * HD, t, g < G);
  float o[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const float sscale = a.scale * (F8 ? a.k_scale : 1.0f);

  /* QK^T of 16 keys (K pieces in KR) into S (row g's scores in [hf][0..1]). PIPE: each half's
   * chunks in two independent accumulator chains (even and odd chunks), added at the end, so the
   * mma of one chain does not wait for the other's (see the pipeline below for what it gained) */
  constexpr int QS = PIPE ? 2 : 1;
  auto qk = [&](const uint4 (&kr)[2][L::NPT], float (&s)[2][4]) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float sp[QS][4];
#pragma unroll
      for (int q = 0; q < QS; q++)
        sp[q][0] = sp[q][1] = sp[q][2] = sp[q][3] = 0.0f;
      uint32_t w[L::PAIRS];
      L::template pairs<MT>(w, kr[hf]);
#pragma unroll
      for (int c = 0; c < L::CHUNKS; c++)
        attn_mma(sp[c % QS], qa[2 * c], qa[2 * c + 1], w[2 * c], w[2 * c + 1], MT());
#pragma unroll
      for (int e = 0; e < 4; e++) {
        s[hf][e] = sp[0][e];
#pragma unroll
        for (int q = 1; q < QS; q++)
          s[hf][e] += sp[q][e];
      }
    }
  };
  /* the online softmax of the 16 keys j0 .. j0 + 15 with scores S, then P V (V pieces in VR) */
  auto softpv = [&](int j0, const float (&s)[2][4], const uint4 (&vr)[2][L::NPT]) {
    /* row g's scores: keys j0 + hf * 8 + 2t + e */
    float x[4], mx = -INFINITY;
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float v = attn_cap(s[hf][e] * sscale, a.softcap);
        v = j0 + hf * 8 + 2 * t + e < k1 ? v : -INFINITY;
        x[hf * 2 + e] = v;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2)); /* finite: key j0 < k1 is valid */
    float mnew = fmaxf(m, mx), alpha = __expf(m - mnew);
    m = mnew;
    l *= alpha;
#pragma unroll
    for (int k = 0; k < 4; k++)
      x[k] = __expf(x[k] - mnew), l += x[k];
    /* a new maximum in the warp (times 1 is exact); PIPE: always, no branch inside the pipelined step */
    if (PIPE || __any_sync(0xffffffffu, alpha != 1.0f))
#pragma unroll
      for (int i = 0; i < NT; i++)
        o[i][0] *= alpha, o[i][1] *= alpha;
    uint32_t pa0 = attn_pack(x[0], x[1], MT()), pa2 = attn_pack(x[2], x[3], MT());
    uint32_t v0[L::PAIRS], v1[L::PAIRS];
    L::template pairs<MT>(v0, vr[0]);
    L::template pairs<MT>(v1, vr[1]);
#pragma unroll
    for (int i = 0; i < NT; i++)
      attn_mma(o[i], pa0, pa2, attn_trans(v0[i]), attn_trans(v1[i]), MT());
  };
  /* one warp step: the 16 keys j0 .. j0 + 15 (K and V pieces in KR, VR; LATE_V: V loaded here from ROW) */
  auto step = [&](int j0, const uint4 (&kr)[2][L::NPT], uint4 (&vr)[2][L::NPT], const size_t (&row)[2]) {
    float s[2][4];
    qk(kr, s);
    if (LATE_V)
      L::load_v16(vr, row, vc, t);
    softpv(j0, s, vr);
  };
  if constexpr (PIPE) {
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm_raw) + threadIdx.x * 16u;
    /* The pipeline for a warp walking its keys in chunks of SC steps (SCC: an integral_constant):
     * chunk c of warp w is the steps at keys k0 + ((c * DEC_WARPS + w) * SC + 0 .. SC - 1) * 16, so
     * with SC = DEC_F8_CHUNK (4) each warp streams 64 consecutive keys (whole blocks of 8, 16 or
     * 32 when k0 is aligned) before the next warp's 64; SC = 1 is every fourth 16-key step, for
     * partitions too short to give each warp a chunk. KEY0(ST): the first of the 16 keys of this
     * warp's step ST, increasing with ST. */
    auto pipe = [&](auto scc) {
      constexpr int SC = decltype(scc)::value;
      const int lsc = dec_log2(SC);
      auto key0 = [&](int st) {
        return k0 + ((((st >> lsc) * DEC_WARPS + warp) << lsc) + (st & ((1 << lsc) - 1))) * 16;
      };
      /* copies step ST's pieces into stage ST % NS (none past the warp's keys), then closes a
       * group; piece q of a stage sits at q * DEC_WARPS * 32 slots: a warp's LDS.128 reads 512
       * bytes in a row. Half 1's block-table lookup waits for half 0's (its index adds min(block
       * of half 0, 0), which is 0: block ids are not negative), so a step's copies go out after
       * two round trips: with both lookups in flight at once (ptxas hoists an independent load),
       * or with the block ids held across the warp's lanes and no lookup here, the kernel was
       * slower at every block size (bench/RESULTS.md, session 15: measured, not explained). */
      auto issue = [&](int st) {
        const int j0 = key0(st);
        if (j0 < k1) {
          const uint32_t dst = sbase + (uint32_t)(st % NS) * (NPC * DEC_WARPS * 32 * 16);
          int prev = 0;
#pragma unroll
          for (int hf = 0; hf < 2; hf++) {
            const int j = j0 + hf * 8 + g;
            const bool valid = j < k1;
            const int blk = valid ? __ldg(bt + j / BS + min(prev, 0)) : 0;
            prev = blk;
            const size_t r = valid ? (size_t)blk * block_stride + head_off + (size_t)(j % BS) * HD : 0;
#pragma unroll
            for (int i = 0; i < L::NPT; i++) {
              const uint32_t qk = (uint32_t)(hf * L::NPT + i), qv = qk + 2 * L::NPT;
              asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + qk * DEC_WARPS * 32 * 16),
                           "l"(kc + r + L::dim0(i, t)), "r"(valid ? 16 : 0));
              asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + qv * DEC_WARPS * 32 * 16),
                           "l"(vc + r + L::dim0(i, t)), "r"(valid ? 16 : 0));
            }
          }
        }
        asm volatile("cp.async.commit_group;\n" ::);
      };
      int nsteps = 0; /* steps ST with key0(ST) < k1: per position r in a chunk, the chunks reaching k1 */
      for (int r = 0; r < SC; r++) {
        const int rel = k1 - key0(r);
        nsteps += rel > 0 ? (rel + (DEC_WARPS * 16 << lsc) - 1) / (DEC_WARPS * 16 << lsc) : 0;
      }
#pragma unroll
      for (int st = 0; st < NS - 1; st++)
        issue(st);
      /* reads step ST's pieces from its stage into KR, VR */
      auto read = [&](int st, uint4 (&kr)[2][L::NPT], uint4 (&vr)[2][L::NPT]) {
        const uint4 *src = (const uint4 *)(sm_raw + (size_t)(st % NS) * (NPC * DEC_WARPS * 32 * 16)) + threadIdx.x;
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
          for (int i = 0; i < L::NPT; i++) {
            kr[hf][i] = src[(hf * L::NPT + i) * DEC_WARPS * 32];
            vr[hf][i] = src[(2 * L::NPT + hf * L::NPT + i) * DEC_WARPS * 32];
          }
      };
      /* Software-pipelined: the QK^T of step st + 1 is issued beside the softmax and P V of step st
       * (one branch-free stretch, so ptxas interleaves two steps' dependency chains). With the two
       * QK^T chains and the branch-free rescale, at 64 x 4096, in three device calls of one session
       * alternated with the one-step-at-a-time loop: blocks 8 / 16 / 32 0.1441-0.1462 / 0.1428-0.1444
       * / 0.1423-0.1433 ms against 0.1468-0.1491 / 0.1434-0.1461 / 0.1426-0.1461 (bench/RESULTS.md,
       * session 21; the kernel is bound by its warps' dependency chains there, not by DRAM: with 2
       * blocks of 4 warps per SM the warps stall a third of their cycles on fixed-latency results) */
      if (nsteps > 0) {
        uint4 kr[2][L::NPT], vr[2][L::NPT];
        float sc[2][4];
        asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 2));
        read(0, kr, vr);
        issue(NS - 1); /* into the last stage, not used yet */
        qk(kr, sc);
        for (int st = 0; st + 1 < nsteps; st++) {
          uint4 kn[2][L::NPT], vn[2][L::NPT];
          float sn[2][4];
          asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 2));
          read(st + 1, kn, vn);
          issue(st + NS); /* into the stage of step st, whose pieces this thread read one step ago */
          qk(kn, sn);
          softpv(key0(st), sc, vr);
#pragma unroll
          for (int hf = 0; hf < 2; hf++) {
#pragma unroll
            for (int e = 0; e < 4; e++)
              sc[hf][e] = sn[hf][e];
#pragma unroll
            for (int i = 0; i < L::NPT; i++)
              vr[hf][i] = vn[hf][i];
          }
        }
        softpv(key0(nsteps - 1), sc, vr);
      }
    };
    /* 4-step chunks where every warp gets at least one: at 64 x 4096, blocks 8 / 16 / 32, in one
     * call, 0.145-0.148 / 0.143-0.144 / 0.143-0.145 ms against 0.152-0.153 / 0.142-0.143 / 0.149
     * with one-step chunks only (bench/RESULTS.md, session 15) */
    if (k1 - k0 >= DEC_WARPS * 16 * DEC_F8_CHUNK)
      pipe(std::integral_constant<int, DEC_F8_CHUNK>());
    else
      pipe(std::integral_constant<int, 1>());
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads(); /* every warp is done with the stages before sm_o reuses them */
  } else {
    /* warp w's steps: keys k0 + w * 16 + s * DEC_WARPS * 16 (warp-uniform bounds) */
    int j0 = k0 + warp * 16;
    if (pre) { /* the first step, loaded before the wait: now this step's keys (if any are in it) */
      const size_t row[2] = {0, 0};
      const int knew = tk.ctx - tk.q_len;
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int j = j0 + hf * 8 + g;
        if (j >= knew && j < k1) {
          const size_t r = (size_t)__ldg(bt + j / BS) * block_stride + head_off + (size_t)(j % BS) * HD;
#pragma unroll
          for (int i = 0; i < L::NPT; i++) {
            pkr[hf][i] = L::load(kc + r, i, t);
            pvr[hf][i] = L::load(vc + r, i, t);
          }
        }
      }
      step(j0, pkr, pvr, row);
      j0 += DEC_WARPS * 16;
    }
    for (; j0 < k1; j0 += DEC_WARPS * 16) {
      uint4 kr[2][L::NPT], vr[2][L::NPT];
      size_t row[2];
      L::template load_kv16<BS, !LATE_V>(kr, vr, row, kc, vc, bt, block_stride, head_off, j0, k1, g, t);
      step(j0, kr, vr, row);
    }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (g < G) {
#pragma unroll
    for (int i = 0; i < NT; i++) {
      const int d = L::dim(i, t);
      sm_o[warp][g][d] = o[i][0];
      sm_o[warp][g][d + 1] = o[i][1];
    }
    if (t == 0)
      sm_m[warp][g] = m, sm_l[warp][g] = l;
  }
  __syncthreads();
  const float vs = F8 ? a.v_scale : 1.0f;
  /* the cluster fold (block-uniform; a launch without clusters has clusters of 1) */
  const bool clu = nparts > 1 && nparts <= dec_cluster_ctas();
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    int gg = i / HD, d = i % HD;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++)
      mm = fmaxf(mm, sm_m[w][gg]);
    float ls = 0.0f, as = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) {
      float f = sm_m[w][gg] == -INFINITY ? 0.0f : __expf(sm_m[w][gg] - mm);
      ls += sm_l[w][gg] * f;
      as += sm_o[w][gg][d] * f;
    }
    as *= vs;
    int h = kvh * G + gg;
    if (nparts == 1) {
      a.out[((size_t)tok * a.n_heads + h) * HD + d] = __float2bfloat16(as / ls);
    } else if (clu) {
      ((float *)(sm_raw + SH::MERGE_BYTES))[i] = as;
      if (d == 0)
        ((float2 *)(sm_raw + SH::MERGE_BYTES + 8 * HD * 4))[gg] = make_float2(mm, ls);
    } else {
      size_t pi = ((size_t)b * a.n_heads + h) * a.num_parts + p;
      attn_part_acc(a)[pi * HD + d] = as;
      if (d == 0)
        a.part_ml[pi] = make_float2(mm, ls);
    }
  }
  if (clu)
    dec_cfold<HD>(a, kvh, G, tok, nparts, p, (const float *)(sm_raw + SH::MERGE_BYTES),
                  (const float2 *)(sm_raw + SH::MERGE_BYTES + 8 * HD * 4));
  else if (nparts > 1 && a.part_cnt)
    dec_fold<HD>(a, b, kvh, G, tok, nparts, (float *)sm_raw);
}

/* Combines the partitions of sequences split in more than one when the kernels above do not
 * (no fold): one block per (sequence, head), one thread per output dim. */
__global__ void attn_decode_reduce_kernel(const attn_args a) {
  PDL_ENTER(); /* cuda_pdl.cuh */
  const int b = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int t = a.query_start[b];
  attn_tok tk = attn_lookup(a.query_start, a.seq_lens, a.B, t, b, a.window);
  const int nkeys = tk.ctx - tk.first;
  const int plen = dec_part_len(a, nkeys);
  const int nparts = nkeys > 0 ? (nkeys + plen - 1) / plen : 0;
  if (tk.q_len <= 0 || nparts <= 1)
    return; /* written by the main kernel */
  const size_t p0 = ((size_t)b * a.n_heads + h) * a.num_parts;
  const float mm = dec_comb_max(dec_ml_of(a, p0), nparts);
  for (int d = threadIdx.x; d < a.hd; d += blockDim.x)
    a.out[((size_t)t * a.n_heads + h) * a.hd + d] = dec_comb_dim(dec_ml_of(a, p0), dec_acc_of(a, p0, d), nparts, mm);
}

/* Keys each lane group loads before using them (U): as many as the registers allow without
 * spilling (q and the accumulators take 2 * G * N registers per lane). An f8e4m3 cache takes
 * 16-byte loads (N = 16) for G <= 2 and 8-byte loads (kv_f8h, N = 8) for larger groups. */
static constexpr int dec_u(int G, int f8) { return f8 && G <= 2 ? 4 : G >= 8 ? 2 : 4; }
static constexpr int dec_n(int G, int f8) { return f8 && G <= 2 ? 16 : 8; }

/* The tensor-core kernel unless PAGODA_ATTN_DECODE=simd (read once) asks for the CUDA-core one. */
static int dec_use_mma(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("PAGODA_ATTN_DECODE");
    v = !(e && !strcmp(e, "simd"));
  }
  return v;
}

/* attn_decode_mma_kernel<BS, HD, KV> with its dynamic shared memory (opted in once per device); CLUSTER
 * > 1: in clusters of GRID.y blocks, the grid's partitions (at most cb->attn_cluster, checked once) */
template <int BS, int HD, class KV>
static cudaError_t dec_mma_launch(const struct cuda_backend *cb, dim3 grid, const attn_args &a, int cluster) {
  static unsigned long long opted = 0, checked = 0, clusters_ok = 0; /* bit d: device d */
  constexpr int smem = dec_shm<HD, typename KV::elem>::SMEM;
  const void *fn = (const void *)attn_decode_mma_kernel<BS, HD, KV>;
  if (smem > 0) {
    const cudaError_t e = cuda_smem_opt_in(cb, fn, &opted);
    if (e != cudaSuccess)
      return e;
  }
  if (cluster > 1) {
    /* once per device: clusters of cb->attn_cluster blocks (the largest launched) must fit the device
     * (above 8 they are non-portable, opted into); if none can be resident the kernel runs without */
    const unsigned long long bit = cb->device >= 0 && cb->device < 64 ? 1ull << cb->device : 0;
    if (!(__atomic_load_n(&checked, __ATOMIC_ACQUIRE) & bit)) {
      cudaLaunchAttribute at;
      at.id = cudaLaunchAttributeClusterDimension;
      at.val.clusterDim.x = 1, at.val.clusterDim.y = (unsigned)cb->attn_cluster, at.val.clusterDim.z = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(1, (unsigned)cb->attn_cluster);
      cfg.blockDim = dim3(DEC_WARPS * 32);
      cfg.dynamicSmemBytes = (size_t)smem;
      cfg.attrs = &at;
      cfg.numAttrs = 1;
      int n = 0;
      if ((cb->attn_cluster <= 8 ||
           cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) &&
          cudaOccupancyMaxActiveClusters(&n, fn, &cfg) == cudaSuccess && n > 0)
        __atomic_fetch_or(&clusters_ok, bit, __ATOMIC_RELEASE);
      (void)cudaGetLastError(); /* a refused size is not an error: no cluster */
      __atomic_fetch_or(&checked, bit, __ATOMIC_RELEASE);
    }
    if (__atomic_load_n(&clusters_ok, __ATOMIC_ACQUIRE) & bit) /* the grid's P partitions, one cluster */
      return cuda_pdl_launch_cluster(cb, attn_decode_mma_kernel<BS, HD, KV>, grid, dim3(DEC_WARPS * 32),
                                     (size_t)smem, (int)grid.y, a);
  }
  return cuda_pdl_launch(cb, attn_decode_mma_kernel<BS, HD, KV>, grid, dim3(DEC_WARPS * 32), (size_t)smem, a);
}

int cuda_attn_graph_short_ctx(const struct cuda_backend *cb) {
  /* the mma kernel's partitions are at least DEC_MIN_PART keys (a multiple of its 64-key warp
   * steps), so a context of attn_cluster * DEC_MIN_PART keys splits in at most attn_cluster */
  return cb->attn_cluster > 1 && dec_use_mma() ? cb->attn_cluster * DEC_MIN_PART : 0;
}

/* Keys per warp step of the instantiation for (HD, G, f8). */
static int dec_tile(int hd, int G, int f8) {
  return dec_use_mma() ? 16 : dec_u(G, f8) * (32 / (hd / dec_n(G, f8)));
}

/* Scratch bytes for B sequences of H heads of HD dims in P partitions. */
static size_t dec_scratch_bytes(int B, int H, int hd, int P) {
  size_t n = (size_t)B * H * P;
  return n * hd * sizeof(float) + n * sizeof(float2);
}


/* Thread blocks per SM the split aims at for a cache of that type and head_dim: the constants
 * above, or PAGODA_ATTN_DECODE_CTAS (1..64, for measuring). */
static int dec_ctas_per_sm(int f8, int hd) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("PAGODA_ATTN_DECODE_CTAS");
    int x = e ? atoi(e) : 0;
    v = x >= 1 && x <= 64 ? x : 0;
  }
  if (v)
    return v;
  return !f8 ? DEC_CTAS_PER_SM_BF16 : hd == 128 && dec_use_mma() ? DEC_CTAS_PER_SM_F8_HD128 : DEC_CTAS_PER_SM_F8;
}

/* Partitions for B sequences x KVH heads over at most MAX_KEYS keys each: enough thread blocks
 * for dec_ctas_per_sm() per SM, none shorter than DEC_MIN_PART keys (nor one warp step per warp). */
static int dec_parts(int sms, int B, int kvh, int max_keys, int tile, int f8, int hd) {
  int64_t work = (int64_t)B * kvh;
  int64_t want = ((int64_t)sms * dec_ctas_per_sm(f8, hd) + work - 1) / work;
  int min_part = DEC_MIN_PART > DEC_WARPS * tile ? DEC_MIN_PART : DEC_WARPS * tile;
  int64_t most = (max_keys + min_part - 1) / min_part;
  if (want > most)
    want = most;
  return want < 1 ? 1 : (int)want;
}

extern "C" int cuda_attention_reserve(struct backend *be, int max_seqs, int max_ctx) {
  struct cuda_backend *cb = cuda_be(be);
  if (max_seqs < 0 || max_ctx < 0)
    return ERR("cuda_attention_reserve: %d sequences of %d tokens", max_seqs, max_ctx);
  cb->attn_reserve_seqs = max_seqs > cb->attn_reserve_seqs ? max_seqs : cb->attn_reserve_seqs;
  cb->attn_reserve_ctx = max_ctx > cb->attn_reserve_ctx ? max_ctx : cb->attn_reserve_ctx; /* not needed for the size */
  return 0;
}

/* Grows the scratch, outside a capture, to hold CNT_N fold counters and PART_BYTES of partials
 * (never less than it holds now); a new allocation's counters are zeroed on the stream (the fold's
 * invariant). The counters' region changes only with a new allocation. 0, or -1 with err_last() set. */
static int dec_scratch_grow(struct cuda_backend *cb, int cnt_n, size_t part_bytes) {
  size_t have = cb->attn_scratch_bytes - cb->attn_cnt_bytes;
  if (cnt_n <= cb->attn_cnt_n && part_bytes <= have)
    return 0;
  if (cnt_n < cb->attn_cnt_n)
    cnt_n = cb->attn_cnt_n;
  if (part_bytes < have)
    part_bytes = have;
  size_t cnt_bytes = ((size_t)cnt_n * sizeof(int) + 255) / 256 * 256, bytes = cnt_bytes + part_bytes;
  if (cb->attn_scratch) {
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    CUDA_CHECK(cudaFree(cb->attn_scratch));
    cb->attn_scratch = NULL;
    cb->attn_scratch_bytes = cb->attn_cnt_bytes = 0;
    cb->attn_cnt_n = 0;
  }
  cudaError_t e = cudaMalloc(&cb->attn_scratch, bytes);
  if (e != cudaSuccess) {
    cb->attn_scratch = NULL;
    return ERR("CUDA out of memory: cannot allocate the %.1f MiB attention split-K scratch (%s); lower "
               "--max-num-seqs", (double)bytes / 1048576.0, cudaGetErrorString(e));
  }
  CUDA_CHECK(cudaMemsetAsync(cb->attn_scratch, 0, cnt_bytes, cb->stream));
  cb->attn_scratch_bytes = bytes;
  cb->attn_cnt_bytes = cnt_bytes;
  cb->attn_cnt_n = (int)(cnt_bytes / sizeof(int));
  return 0;
}

/* KV for groups of 1 or 2 heads, KVL for larger ones (see dec_u). */
template <int BS, class KV, class KVL, int F8>
static cudaError_t dec_launch(const struct cuda_backend *cb, const attn_args &a, int G, dim3 grid) {
  dim3 thr(DEC_WARPS * 32);
#define DEC_G(HD)                                                                                          \
  (G == 1   ? cuda_pdl_launch(cb, attn_decode_kernel<BS, HD, 1, KV, dec_u(1, F8)>, grid, thr, 0, a)         \
   : G == 2 ? cuda_pdl_launch(cb, attn_decode_kernel<BS, HD, 2, KV, dec_u(2, F8)>, grid, thr, 0, a)         \
   : G == 4 ? cuda_pdl_launch(cb, attn_decode_kernel<BS, HD, 4, KVL, dec_u(4, F8)>, grid, thr, 0, a)        \
            : cuda_pdl_launch(cb, attn_decode_kernel<BS, HD, 8, KVL, dec_u(8, F8)>, grid, thr, 0, a))
  return a.hd == 64 ? DEC_G(64) : DEC_G(128);
#undef DEC_G
}

int cuda_attention_decode(struct backend *be, attn_args *a, int bs, int f8, int max_query_len, int max_seq_len) {
  struct cuda_backend *cb = cuda_be(be);
  int G = a->n_heads / a->n_kv;
  int mma = dec_use_mma();
  if (!(mma ? attn_mma_hd(a->hd) && G <= 8 : (a->hd == 64 || a->hd == 128) && (G == 1 || G == 2 || G == 4 || G == 8)))
    return 1; /* a shape these kernels are not compiled for: the general kernels */
  int tile = dec_tile(a->hd, G, f8);
  int sms = cuda_sm_count(cb);
  if (sms < 0)
    return -1;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(cb->stream, &cap));
  if (cap == cudaStreamCaptureStatusNone) {
    /* Outside a capture, on any batch of this shape (the profiling step included, decode or
     * not): size the scratch for every decode batch of up to max(reserved, this) sequences. The
     * partitions of s sequences are at most ceil(sms * dec_ctas_per_sm() / (s * n_kv)) whatever the
     * context, so the size does not depend on it (a few MiB: 8.1 MiB for 256 sequences of
     * Llama-3.1-8B's 32 / 8 heads on 132 SMs), plus one fold counter per (sequence, KV head). */
    int rs = cb->attn_reserve_seqs > a->B ? cb->attn_reserve_seqs : a->B;
    int key[5] = {rs, 0, a->n_heads, a->n_kv, a->hd * 2 + f8};
    if (memcmp(key, cb->attn_sized_for, sizeof key) != 0) {
      size_t need = 0;
      for (int s = 1; s <= rs; s++) {
        size_t by = dec_scratch_bytes(s, a->n_heads, a->hd, dec_parts(sms, s, a->n_kv, 0x3fffffff, tile, f8, a->hd));
        need = by > need ? by : need;
      }
      if ((int64_t)rs * a->n_kv > 0x7fffffff / (int)sizeof(int))
        return ERR("cuda attention: batch too large (%d sequences)", rs);
      if (dec_scratch_grow(cb, rs * a->n_kv, need))
        return -1;
      memcpy(cb->attn_sized_for, key, sizeof key);
    }
  }
  if (max_query_len != 1 || max_seq_len <= 0)
    return 1; /* not a decode batch: the prefill kernels */
  int max_keys = a->window > 0 && a->window < max_seq_len ? a->window : max_seq_len;
  int P = dec_parts(sms, a->B, a->n_kv, max_keys, tile, f8, a->hd);
  while (P > 1 && dec_scratch_bytes(a->B, a->n_heads, a->hd, P) > cb->attn_scratch_bytes - cb->attn_cnt_bytes)
    P--; /* capturing with too small a scratch: fewer, longer partitions */
  int step = DEC_WARPS * tile; /* the granule: whole warp steps, at least DEC_MIN_PART keys */
  /* the fold, unless it is off or a captured batch has more (sequence, KV head) pairs than counters */
  const int fold = P > 1 && cb->attn_fold && (int64_t)a->B * a->n_kv <= cb->attn_cnt_n;
  a->num_parts = P;
  a->pdl_early = a->pdl_early && (P == 1 || fold); /* with the separate reduce, the early trigger would release it */
  a->part_len = (DEC_MIN_PART + step - 1) / step * step;
  a->part_cnt = fold ? (int *)cb->attn_scratch : NULL;
  a->part_ml = (float2 *)((char *)cb->attn_scratch + cb->attn_cnt_bytes);
  /* attn_part_acc: the partial outputs follow the B * n_heads * P (max, sum) pairs */
  if ((int64_t)a->B * a->n_kv > 0x7fffffff)
    return ERR("cuda attention: batch too large (%d sequences)", a->B);
  dim3 grid((unsigned)(a->B * a->n_kv), (unsigned)P);
  /* The cluster fold (with the fold on, mma kernel): when the grid's P partitions fit one cluster,
   * so every sequence's do, and the grid fits one block per SM (beside a running GEMV block; with
   * clusters over more blocks than that, 4 x 2048 keys took 2% longer, bench/RESULTS.md, session 17) */
  const int cluster = fold && mma && P <= cb->attn_cluster && (int64_t)a->B * a->n_kv * P <= sms ? P : 0;
#define DEC_MMA(BS, KV)                                                                            \
  (a->hd == 64    ? dec_mma_launch<BS, 64, KV>(cb, grid, *a, cluster)                              \
   : a->hd == 80  ? dec_mma_launch<BS, 80, KV>(cb, grid, *a, cluster)                              \
   : a->hd == 96  ? dec_mma_launch<BS, 96, KV>(cb, grid, *a, cluster)                              \
   : a->hd == 128 ? dec_mma_launch<BS, 128, KV>(cb, grid, *a, cluster)                             \
                  : dec_mma_launch<BS, 256, KV>(cb, grid, *a, cluster))
#define DEC_BS(BS)                                                                                 \
  (mma ? (f8 ? DEC_MMA(BS, kv_f8) : DEC_MMA(BS, kv_bf16))                                          \
       : (f8 ? dec_launch<BS, kv_f8, kv_f8h, 1>(cb, *a, G, grid) : dec_launch<BS, kv_bf16, kv_bf16, 0>(cb, *a, G, grid)))
  CUDA_CHECK(bs == 8 ? DEC_BS(8) : bs == 16 ? DEC_BS(16) : DEC_BS(32));
#undef DEC_BS
#undef DEC_MMA
  if (P > 1 && !fold)
    CUDA_CHECK(cuda_pdl_launch(cb, attn_decode_reduce_kernel, dim3((unsigned)(a->B * a->n_heads)), dim3(a->hd), 0,
                               *a));
  return 0;
}

CUDA_PRELOAD_ANCHOR(attn_decode)
