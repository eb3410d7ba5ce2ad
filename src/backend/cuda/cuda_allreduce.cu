/* cuda_allreduce.cu - single-process tensor parallelism's peer all-reduce: the ranks' GPUs reach
 * each other's memory over NVLink (cudaDeviceEnablePeerAccess) instead of going through NCCL,
 * for the small bf16 all-reduces of decode steps, where NCCL's ~10-20 us latency per call
 * dominates (docs/distributed.md, "Peer all-reduce").
 *
 * One kernel per all-reduce, on the rank's stream, safe to capture in a CUDA graph, in one of two
 * variants ($PAGODA_TP_AR, read at peer_ar_connect; every rank of the process reads the same):
 *
 * pull (the default): every block
 *  1. copies its part of x into this rank's staging buffer of parity p = N & 1, where N is the
 *     all-reduce's sequence number, read from device memory (so a graph replay sees the next
 *     number, never a captured constant);
 *  2. its threads 0..W-1 store N into flag [p][block][rank] of every rank (release, system scope),
 *     then wait until their own flags [p][block][k] of every rank k reach N (acquire);
 *  3. reads the W ranks' staged values (the peers' over NVLink: a round trip on the critical path).
 *
 * push (up to PEER_AR_LL_BYTES; pull above): every thread writes its bf16 values straight into
 * every peer's receive buffer [p][rank] with 16-byte stores over NVLink, as "LL" lines: 4 bytes of
 * data and a 4-byte flag, twice (an 8-byte store is seen whole, so a line half whose flag is set
 * carries its data: no fence, no separate flag). It then polls ITS OWN buffers [p][k] of every
 * peer k (local reads) until both flags of each line are set, and empties each line (zeros) after
 * reading it. The data crosses NVLink once, one way, with no round trip on the critical path.
 * Invariant: a line's flags are non-zero exactly while it holds a value not yet read (each line
 * written in an all-reduce is read and emptied by the same all-reduce on its receiver, which has
 * the same n): so the flag needs no sequence number and nothing aliases when N wraps.
 *
 * Both then sum every element over the W ranks in rank order 0..W-1 in f32 (from 0) and round
 * once to bf16: every rank, and both variants, get bit-identical results (for 2 ranks exactly
 * what NCCL's bf16 sum gives). all_reduce_add (RESID given) then adds the sum into the residual,
 * resid = bf16(float(sum) + float(resid)), rmsnorm_kernel's residual add (cuda_ops.cu), so the
 * result is bitwise all_reduce_sum followed by that add; x receives the sum in both ops. Any n and
 * any alignment of x / resid: the kernels work in units of 8 elements, a 16-byte access when the
 * pointers allow it, element by element at a tail or an unaligned pointer (same values).
 * Finally the last block out advances N.
 *
 * Invariants: every rank runs the same all-reduces in the same order with the same n (so the
 * same variant and grid), as with NCCL. A rank rewrites a buffer of parity p (its staging, or a
 * peer's receive lines) at all-reduce N + 2 only after its all-reduce N + 1 received every peer's
 * flag or data of N + 1, which a peer sends only once its all-reduce N (the last reader of the
 * parity-p buffers) has completed (stream order; a kernel launched early by programmatic
 * dependent launch sends nothing before its pdl_wait); so two buffers suffice, whichever variant
 * each all-reduce takes. The pull flags only move forward and a peer is never two all-reduces
 * ahead, so the wait compares the 32-bit numbers by their signed difference, exact when the
 * sequence number wraps (2^32 all-reduces, days of decoding). The grid is at most
 * PEER_AR_MAX_BLOCKS blocks, which fit on the GPUs that peer access joins (Hopper: 132 SMs), so
 * the blocks are resident together and the waits cannot starve (with PDL: a kernel is resident
 * before the next one may start, each block calling pdl_trigger first thing). A wait longer than
 * PEER_AR_TIMEOUT_NS (a peer that never arrives) traps: the process's CUDA context on that GPU is
 * then unusable (a trap is sticky), so the engine ends with that error instead of hanging.
 *
 * Programmatic dependent launch (cuda_pdl.cuh, when cb->pdl and $PAGODA_TP_AR_PDL is not 0): the
 * kernel is launched while the o / down GEMV before it finishes, and the kernel after it (the
 * next sub-block's GEMV) may start prefetching its weights while this one waits for its peers. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_pdl.cuh"

#include <stdlib.h>

#define PEER_AR_THREADS 512      /* pull */
#define PEER_AR_PUSH_THREADS 256 /* push: 8 KiB (a batch-1 row of 4096) is 2 blocks */
#define PEER_AR_TIMEOUT_NS 20000000000ull /* 20 s */
#define PEER_LL_FULL 1u          /* an LL line half's flag: it holds a value not yet read */

typedef __nv_bfloat16 bf16;

__device__ static inline uint32_t ld_acquire_sys(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ static inline void st_release_sys(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* LL lines: one 16-byte volatile access (each 8-byte half is seen whole by the other GPU). */
__device__ static inline void st_ll(uint4 *p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ static inline uint4 ld_ll(const uint4 *p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ static inline uint64_t global_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Called every spin of a wait: traps once SPINS spins took longer than PEER_AR_TIMEOUT_NS. */
__device__ static inline void wait_tick(int spins, uint64_t *t0) {
  if ((spins & 1023) != 1023)
    return;
  uint64_t t = global_ns();
  if (!*t0)
    *t0 = t;
  else if (t - *t0 > PEER_AR_TIMEOUT_NS)
    __trap(); /* a peer never arrived: fail the step rather than hang */
}

struct peer_ptrs {
  uint4 *stage[PEER_AR_MAX_RANKS];    /* each rank's staging: 2 x PEER_AR_STAGE_BYTES */
  uint32_t *flags[PEER_AR_MAX_RANKS]; /* each rank's flags: [2][PEER_AR_MAX_BLOCKS][PEER_AR_MAX_RANKS] */
  uint4 *ll[PEER_AR_MAX_RANKS];       /* each rank's LL receive lines: [2][world][PEER_AR_LL_LINES] */
};

/* Unit U of X: elements 8U .. 8U + 7, those at or past N read as 0; one 16-byte load when VEC
 * (X 16-byte aligned) and the unit is whole, else element by element. */
__device__ static inline uint4 load_unit(const bf16 *x, size_t n, size_t u, int vec) {
  if (vec && 8 * u + 8 <= n)
    return *(const uint4 *)(x + 8 * u);
  uint4 v = make_uint4(0, 0, 0, 0);
  unsigned short *h = (unsigned short *)&v;
  const unsigned short *xs = (const unsigned short *)x + 8 * u;
#pragma unroll
  for (int j = 0; j < 8; j++) /* unrolled: h stays in registers */
    if (8 * u + j < n)
      h[j] = xs[j];
  return v;
}

/* Stores unit U of X (its elements below N), as load_unit reads it. */
__device__ static inline void store_unit(bf16 *x, size_t n, size_t u, uint4 v, int vec) {
  if (vec && 8 * u + 8 <= n) {
    *(uint4 *)(x + 8 * u) = v;
    return;
  }
  const unsigned short *h = (const unsigned short *)&v;
  unsigned short *xs = (unsigned short *)x + 8 * u;
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (8 * u + j < n)
      xs[j] = h[j];
}

__device__ static inline void acc8(float *s, uint4 v) {
  const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 f = __bfloat1622float2(h[j]);
    s[2 * j] += f.x;
    s[2 * j + 1] += f.y;
  }
}

/* The sum S rounded once to bf16 into unit U of X; with RESID, also resid = bf16(float(sum) +
 * float(resid)), element by element as rmsnorm_kernel's residual add. */
__device__ static inline void finish_unit(bf16 *x, bf16 *resid, size_t n, size_t u, int vec, const float *s) {
  uint4 o;
  __nv_bfloat162 *h = (__nv_bfloat162 *)&o;
#pragma unroll
  for (int j = 0; j < 4; j++)
    h[j] = __floats2bfloat162_rn(s[2 * j], s[2 * j + 1]);
  store_unit(x, n, u, o, vec);
  if (!resid)
    return;
  uint4 r = load_unit(resid, n, u, vec);
  __nv_bfloat162 *rh = (__nv_bfloat162 *)&r;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 a = __bfloat1622float2(h[j]), b = __bfloat1622float2(rh[j]);
    rh[j] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
  }
  store_unit(resid, n, u, r, vec);
}

/* The sequence number of this all-reduce (every thread gets it): one past the last completed. */
__device__ static inline uint32_t ar_begin(const uint32_t *counter) {
  __shared__ uint32_t s_n;
  if (threadIdx.x == 0)
    s_n = *(volatile const uint32_t *)counter + 1;
  __syncthreads();
  return s_n;
}

/* The last block out records N as completed (counter[1] counts the blocks done). */
__device__ static inline void ar_end(uint32_t *counter, uint32_t N) {
  __syncthreads();
  if (threadIdx.x != 0)
    return;
  if (gridDim.x == 1) { /* no other block read the counter: no count needed */
    *(volatile uint32_t *)counter = N;
    return;
  }
  __threadfence();
  if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
    counter[1] = 0;
    *(volatile uint32_t *)counter = N;
    __threadfence();
  }
}

/* x: n bf16 of this rank, summed in place over the W ranks of P through the staging buffers;
 * RESID (or NULL) then gets the sum added. VEC: x and resid are 16-byte aligned. */
__global__ void __launch_bounds__(PEER_AR_THREADS)
    peer_pull_kernel(bf16 *x, bf16 *resid, size_t n, int vec, struct peer_ptrs p, int rank, int W,
                     uint32_t *counter) {
  PDL_ENTER(); /* x, resid and the counter are earlier kernels' */
  const uint32_t N = ar_begin(counter);
  const size_t par = N & 1, stage_u4 = PEER_AR_STAGE_BYTES / sizeof(uint4), nu = (n + 7) / 8;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  uint4 *mine = p.stage[rank] + par * stage_u4;
  for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < nu; u += stride)
    mine[u] = load_unit(x, n, u, vec);
  __syncthreads();
  const size_t slot = (par * PEER_AR_MAX_BLOCKS + blockIdx.x) * PEER_AR_MAX_RANKS;
  if (threadIdx.x < W) {
    st_release_sys(p.flags[threadIdx.x] + slot + rank, N);
    const uint32_t *f = p.flags[rank] + slot + threadIdx.x;
    uint64_t t0 = 0;
    for (int spins = 0; (int32_t)(ld_acquire_sys(f) - N) < 0; spins++) /* wraps at 2^32 all-reduces */
      wait_tick(spins, &t0);
  }
  __syncthreads();
  for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < nu; u += stride) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < W; k++)
      acc8(s, __ldcg(p.stage[k] + par * stage_u4 + u)); /* L2, never a stale L1 line of a peer */
    finish_unit(x, resid, n, u, vec, s);
  }
  ar_end(counter, N);
}

/* As peer_pull_kernel, through the peers' LL receive lines (n <= PEER_AR_LL_BYTES / 2). */
__global__ void __launch_bounds__(PEER_AR_PUSH_THREADS)
    peer_push_kernel(bf16 *x, bf16 *resid, size_t n, int vec, struct peer_ptrs p, int rank, int W,
                     uint32_t *counter) {
  PDL_ENTER(); /* x, resid and the counter are earlier kernels'; nothing is sent before this */
  const uint32_t N = ar_begin(counter);
  const size_t par = N & 1, nu = (n + 7) / 8;
  const size_t stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  /* send: unit u is lines 2u, 2u + 1 of this rank's buffer [par][rank] in every peer */
  for (size_t u = first; u < nu; u += stride) {
    uint4 v = load_unit(x, n, u, vec);
    uint4 l0 = make_uint4(v.x, PEER_LL_FULL, v.y, PEER_LL_FULL), l1 = make_uint4(v.z, PEER_LL_FULL, v.w, PEER_LL_FULL);
    for (int d = 1; d < W; d++) {
      int k = (rank + d) % W;
      uint4 *dst = p.ll[k] + (par * W + rank) * PEER_AR_LL_LINES + 2 * u;
      st_ll(dst, l0);
      st_ll(dst + 1, l1);
    }
  }
  /* receive and sum in rank order: this rank's own values from x, the peers' from the lines
   * they sent into this GPU's memory */
  for (size_t u = first; u < nu; u += stride) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < W; k++) {
      if (k == rank) {
        acc8(s, load_unit(x, n, u, vec));
        continue;
      }
      uint4 *src = p.ll[rank] + (par * W + k) * PEER_AR_LL_LINES + 2 * u;
      uint4 a = ld_ll(src), b = ld_ll(src + 1);
      uint64_t t0 = 0;
      for (int spins = 0; !a.y || !a.w || !b.y || !b.w; spins++) {
        wait_tick(spins, &t0);
        if (!a.y || !a.w)
          a = ld_ll(src);
        if (!b.y || !b.w)
          b = ld_ll(src + 1);
      }
      st_ll(src, make_uint4(0, 0, 0, 0)); /* read: empty again for all-reduce N + 2 */
      st_ll(src + 1, make_uint4(0, 0, 0, 0));
      acc8(s, make_uint4(a.x, a.z, b.x, b.z));
    }
    finish_unit(x, resid, n, u, vec, s);
  }
  ar_end(counter, N);
}

int cuda_peer_ar_alloc(struct backend *be, int world) {
  struct cuda_backend *cb = cuda_be(be);
  if (world < 2 || world > PEER_AR_MAX_RANKS)
    return ERR("peer all-reduce: %d ranks (2 .. %d)", world, PEER_AR_MAX_RANKS);
  if (cb->peer_ar.stage && cb->peer_ar.flags && cb->peer_ar.ll && cb->peer_ar.ll_world >= world)
    return 0;
  size_t flag_bytes = sizeof(uint32_t) * 2 * PEER_AR_MAX_BLOCKS * PEER_AR_MAX_RANKS;
  size_t ll_bytes = (size_t)2 * world * PEER_AR_LL_LINES * sizeof(uint4);
  CUDA_CHECK(cudaSetDevice(cb->device));
  if (!cb->peer_ar.stage)
    CUDA_CHECK(cudaMalloc(&cb->peer_ar.stage, 2 * (size_t)PEER_AR_STAGE_BYTES));
  if (!cb->peer_ar.flags) {
    CUDA_CHECK(cudaMalloc(&cb->peer_ar.flags, flag_bytes + 2 * sizeof(uint32_t)));
    cb->peer_ar.counter = (uint32_t *)((char *)cb->peer_ar.flags + flag_bytes);
    CUDA_CHECK(cudaMemset(cb->peer_ar.flags, 0, flag_bytes + 2 * sizeof(uint32_t)));
  }
  if (cb->peer_ar.ll) { /* allocated for fewer ranks: again, larger (no kernel uses it yet) */
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(cb->peer_ar.ll);
    cb->peer_ar.ll = NULL;
  }
  CUDA_CHECK(cudaMalloc(&cb->peer_ar.ll, ll_bytes));
  CUDA_CHECK(cudaMemset(cb->peer_ar.ll, 0, ll_bytes)); /* every line empty */
  cb->peer_ar.ll_world = world;
  CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}

/* $NAME as one of the words WORDS (NULL-terminated): its index; DEF when unset or empty; -1 with
 * err_last() naming the variable and the words otherwise. */
static int env_choice(const char *name, const char *const *words, int def) {
  const char *v = getenv(name);
  if (!v || !*v)
    return def;
  for (int i = 0; words[i]; i++)
    if (!strcmp(v, words[i]))
      return i;
  return ERR("%s=%s: %s or %s", name, v, words[0], words[1]);
}

int cuda_peer_ar_connect(struct backend *be, struct backend *const *group, int rank, int world, size_t max_bytes) {
  struct cuda_backend *cb = cuda_be(be);
  if (world < 2 || world > PEER_AR_MAX_RANKS || rank < 0 || rank >= world || group[rank] != be)
    return ERR("peer all-reduce: rank %d of %d", rank, world);
  static const char *const variants[] = {"pull", "push", NULL}, *const off_on[] = {"0", "1", NULL};
  int push = env_choice("PAGODA_TP_AR", variants, 0), add = env_choice("PAGODA_TP_AR_ADD", off_on, 1),
      pdl = env_choice("PAGODA_TP_AR_PDL", off_on, 1);
  if (push < 0 || add < 0 || pdl < 0)
    return -1;
  cb->peer_ar.max_bytes = 0;
  cb->peer_ar.ids_src = NULL;
  CUDA_CHECK(cudaSetDevice(cb->device)); /* peer access is enabled from the current device */
  if (max_bytes > PEER_AR_STAGE_BYTES)
    max_bytes = PEER_AR_STAGE_BYTES;
  for (int k = 0; k < world; k++) {
    struct cuda_backend *pk = cuda_be(group[k]);
    if (!pk->peer_ar.stage || !pk->peer_ar.ll || pk->peer_ar.ll_world < world)
      return ERR("peer all-reduce: rank %d has no staging for %d ranks (peer_ar_alloc first)", k, world);
    if (k == rank)
      continue;
    int can = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&can, cb->device, pk->device));
    if (!can) {
      log_info("cuda: GPU %d cannot access GPU %d's memory directly: the all-reduces go through NCCL", cb->device,
               pk->device);
      return 1;
    }
    cudaError_t e = cudaDeviceEnablePeerAccess(pk->device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled)
      cudaGetLastError();
    else if (e != cudaSuccess)
      return ERR("cudaDeviceEnablePeerAccess(GPU %d -> GPU %d): %s", cb->device, pk->device, cudaGetErrorString(e));
  }
  for (int k = 0; k < world; k++) {
    cb->peer_ar.peer_stage[k] = cuda_be(group[k])->peer_ar.stage;
    cb->peer_ar.peer_flags[k] = cuda_be(group[k])->peer_ar.flags;
    cb->peer_ar.peer_ll[k] = cuda_be(group[k])->peer_ar.ll;
  }
  cb->peer_ar.rank = rank;
  cb->peer_ar.world = world;
  cb->peer_ar.push = push;
  cb->peer_ar.add = add;
  cb->peer_ar.pdl = pdl;
  cb->peer_ar.max_bytes = max_bytes;
  cb->peer_ar.ids_src = rank > 0 ? cuda_be(group[0]) : NULL;
  if (rank == 0 && max_bytes)
    log_info("cuda: all-reduces of up to %zu bytes reach the other GPUs' memory directly (peer all-reduce, %d GPUs, "
             "%s%s%s), NCCL above; PAGODA_TP_CUSTOM_AR=0 turns it off", max_bytes, world,
             push ? "push up to 1 MiB, pull above" : "pull", add ? ", residual add fused" : "",
             pdl && cb->pdl ? ", programmatic dependent launch" : "");
  return 0;
}

int cuda_peer_all_reduce(struct cuda_backend *cb, void *x, void *resid, size_t n) {
  if (n == 0) /* every rank alike: nothing to exchange, the sequence number stays */
    return 0;
  struct peer_ptrs p;
  memset(&p, 0, sizeof p);
  for (int k = 0; k < cb->peer_ar.world; k++) {
    p.stage[k] = (uint4 *)cb->peer_ar.peer_stage[k];
    p.flags[k] = (uint32_t *)cb->peer_ar.peer_flags[k];
    p.ll[k] = (uint4 *)cb->peer_ar.peer_ll[k];
  }
  const size_t nu = (n + 7) / 8;
  const int vec = ((uintptr_t)x & 15) == 0 && ((uintptr_t)resid & 15) == 0;
  const int push = cb->peer_ar.push && n * sizeof(bf16) <= PEER_AR_LL_BYTES;
  const int threads = push ? PEER_AR_PUSH_THREADS : PEER_AR_THREADS;
  size_t blocks = (nu + threads - 1) / threads;
  if (blocks > PEER_AR_MAX_BLOCKS)
    blocks = PEER_AR_MAX_BLOCKS;
  /* as cuda_pdl_launch, with PDL only when the backend uses it and PAGODA_TP_AR_PDL is not 0 */
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.stream = cb->stream;
  cfg.attrs = attr;
  cfg.numAttrs = cb->pdl && cb->peer_ar.pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, push ? peer_push_kernel : peer_pull_kernel, (bf16 *)x, (bf16 *)resid, n, vec,
                                p, cb->peer_ar.rank, cb->peer_ar.world, cb->peer_ar.counter));
  return 0;
}

int cuda_peer_ar_usable(const struct cuda_backend *cb, size_t n) {
  return cb->peer_ar.max_bytes && cb->base.act_dtype == DTYPE_BF16 && n * sizeof(bf16) <= cb->peer_ar.max_bytes;
}

void cuda_peer_ar_free(struct cuda_backend *cb) {
  cudaFree(cb->peer_ar.stage);
  cudaFree(cb->peer_ar.flags);
  cudaFree(cb->peer_ar.ll);
  memset(&cb->peer_ar, 0, sizeof cb->peer_ar);
}
