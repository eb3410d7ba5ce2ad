/* cuda_allreduce.cu - single-process tensor parallelism's peer all-reduce: the ranks' GPUs read
 * each other's memory over NVLink (cudaDeviceEnablePeerAccess) instead of going through NCCL,
 * for the small bf16 all-reduces of decode steps, where NCCL's ~10-20 us latency per call
 * dominates (docs/distributed.md, "Peer all-reduce").
 *
 * One kernel per all-reduce, on the rank's stream, safe to capture in a CUDA graph:
 *  1. every block copies its part of x into this rank's staging buffer of parity p = N & 1,
 *     where N is the all-reduce's sequence number, read from device memory (so a graph replay
 *     sees the next number, never a captured constant);
 *  2. the block's threads 0..W-1 store N into flag [p][block][rank] of every rank (release, system
 *     scope), then wait until their own flags [p][block][k] of every rank k reach N (acquire);
 *  3. every element is the sum of the W ranks' staged values, in rank order 0..W-1, in f32,
 *     rounded once to bf16: every rank gets bit-identical results (for 2 ranks exactly what
 *     NCCL's bf16 sum gives);
 *  4. the last block to finish advances N.
 * Invariants: every rank runs the same all-reduces in the same order with the same n (so the
 * same grid), as with NCCL. A rank rewrites its staging of parity p at all-reduce N + 2 only
 * after passing all-reduce N + 1's wait, which every peer signals only once its all-reduce N
 * (the last reader of that staging) has completed; so two buffers suffice. A flag only moves
 * forward, and a peer is never two all-reduces ahead, so the wait compares the 32-bit numbers by
 * their signed difference, which stays exact when the sequence number wraps (2^32 all-reduces,
 * days of decoding). The grid is at most PEER_AR_MAX_BLOCKS blocks of PEER_AR_THREADS threads,
 * which fit on the GPUs that peer access joins (Hopper: 132 SMs), so the blocks are resident
 * together and the waits cannot starve. A wait longer than PEER_AR_TIMEOUT_NS (a peer that never
 * arrives) traps: the process's CUDA context on that GPU is then unusable (a trap is sticky), so
 * the engine ends with that error instead of hanging. */
#include "backend/cuda/cuda_backend.h"

#include <stdlib.h>

#define PEER_AR_THREADS 512
#define PEER_AR_TIMEOUT_NS 20000000000ull /* 20 s */

__device__ static inline uint32_t ld_acquire_sys(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ static inline void st_release_sys(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ static inline uint64_t global_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct peer_ptrs {
  uint4 *stage[PEER_AR_MAX_RANKS];    /* each rank's staging: 2 x PEER_AR_STAGE_BYTES */
  uint32_t *flags[PEER_AR_MAX_RANKS]; /* each rank's flags: [2][PEER_AR_MAX_BLOCKS][PEER_AR_MAX_RANKS] */
};

__device__ static inline void acc8(float *s, uint4 v) {
  const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 f = __bfloat1622float2(h[j]);
    s[2 * j] += f.x;
    s[2 * j + 1] += f.y;
  }
}

/* x: n8 uint4 (8 bf16 each) of this rank, summed in place over the W ranks of P. */
__global__ void __launch_bounds__(PEER_AR_THREADS)
    peer_all_reduce_kernel(uint4 *x, size_t n8, struct peer_ptrs p, int rank, int W, uint32_t *counter) {
  __shared__ uint32_t s_n;
  if (threadIdx.x == 0)
    s_n = *(volatile uint32_t *)counter + 1;
  __syncthreads();
  const uint32_t N = s_n;
  const size_t par = N & 1, stage_u4 = PEER_AR_STAGE_BYTES / sizeof(uint4);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  uint4 *mine = p.stage[rank] + par * stage_u4;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += stride)
    mine[i] = x[i];
  __syncthreads();
  const size_t slot = (par * PEER_AR_MAX_BLOCKS + blockIdx.x) * PEER_AR_MAX_RANKS;
  if (threadIdx.x < W) {
    st_release_sys(p.flags[threadIdx.x] + slot + rank, N);
    const uint32_t *f = p.flags[rank] + slot + threadIdx.x;
    uint64_t t0 = 0;
    for (int spins = 0; (int32_t)(ld_acquire_sys(f) - N) < 0; spins++) /* wraps at 2^32 all-reduces */
      if ((spins & 1023) == 1023) {
        uint64_t t = global_ns();
        if (!t0)
          t0 = t;
        else if (t - t0 > PEER_AR_TIMEOUT_NS)
          __trap(); /* a peer never arrived: fail the step rather than hang */
      }
  }
  __syncthreads();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += stride) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < W; k++)
      acc8(s, __ldcg(p.stage[k] + par * stage_u4 + i)); /* L2, never a stale L1 line of a peer */
    uint4 o;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&o;
#pragma unroll
    for (int j = 0; j < 4; j++)
      h[j] = __floats2bfloat162_rn(s[2 * j], s[2 * j + 1]);
    x[i] = o;
  }
  /* the last block out advances the sequence number for the next all-reduce */
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
      counter[1] = 0;
      *(volatile uint32_t *)counter = N;
      __threadfence();
    }
  }
}

int cuda_peer_ar_alloc(struct backend *be, int world) {
  struct cuda_backend *cb = cuda_be(be);
  if (world < 2 || world > PEER_AR_MAX_RANKS)
    return ERR("peer all-reduce: %d ranks (2 .. %d)", world, PEER_AR_MAX_RANKS);
  if (cb->peer_ar.stage && cb->peer_ar.flags)
    return 0;
  size_t flag_bytes = sizeof(uint32_t) * 2 * PEER_AR_MAX_BLOCKS * PEER_AR_MAX_RANKS;
  CUDA_CHECK(cudaSetDevice(cb->device));
  if (!cb->peer_ar.stage)
    CUDA_CHECK(cudaMalloc(&cb->peer_ar.stage, 2 * (size_t)PEER_AR_STAGE_BYTES));
  CUDA_CHECK(cudaMalloc(&cb->peer_ar.flags, flag_bytes + 2 * sizeof(uint32_t)));
  cb->peer_ar.counter = (uint32_t *)((char *)cb->peer_ar.flags + flag_bytes);
  CUDA_CHECK(cudaMemset(cb->peer_ar.flags, 0, flag_bytes + 2 * sizeof(uint32_t)));
  CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}

int cuda_peer_ar_connect(struct backend *be, struct backend *const *group, int rank, int world, size_t max_bytes) {
  struct cuda_backend *cb = cuda_be(be);
  if (world < 2 || world > PEER_AR_MAX_RANKS || rank < 0 || rank >= world || group[rank] != be)
    return ERR("peer all-reduce: rank %d of %d", rank, world);
  cb->peer_ar.max_bytes = 0;
  cb->peer_ar.ids_src = NULL;
  CUDA_CHECK(cudaSetDevice(cb->device)); /* peer access is enabled from the current device */
  if (max_bytes > PEER_AR_STAGE_BYTES)
    max_bytes = PEER_AR_STAGE_BYTES;
  for (int k = 0; k < world; k++) {
    struct cuda_backend *pk = cuda_be(group[k]);
    if (!pk->peer_ar.stage)
      return ERR("peer all-reduce: rank %d has no staging (peer_ar_alloc first)", k);
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
  }
  cb->peer_ar.rank = rank;
  cb->peer_ar.world = world;
  cb->peer_ar.max_bytes = max_bytes;
  cb->peer_ar.ids_src = rank > 0 ? cuda_be(group[0]) : NULL;
  if (rank == 0 && max_bytes)
    log_info("cuda: all-reduces of up to %zu bytes read the other GPUs' memory directly (peer all-reduce, %d "
             "GPUs), NCCL above; PAGODA_TP_CUSTOM_AR=0 turns it off", max_bytes, world);
  return 0;
}

int cuda_peer_all_reduce(struct cuda_backend *cb, void *x, size_t n) {
  size_t n8 = n / 8;
  struct peer_ptrs p;
  memset(&p, 0, sizeof p);
  for (int k = 0; k < cb->peer_ar.world; k++) {
    p.stage[k] = (uint4 *)cb->peer_ar.peer_stage[k];
    p.flags[k] = (uint32_t *)cb->peer_ar.peer_flags[k];
  }
  size_t blocks = (n8 + PEER_AR_THREADS - 1) / PEER_AR_THREADS;
  if (blocks > PEER_AR_MAX_BLOCKS)
    blocks = PEER_AR_MAX_BLOCKS;
  if (blocks < 1)
    blocks = 1;
  peer_all_reduce_kernel<<<(unsigned)blocks, PEER_AR_THREADS, 0, cb->stream>>>((uint4 *)x, n8, p, cb->peer_ar.rank,
                                                                               cb->peer_ar.world, cb->peer_ar.counter);
  CUDA_CHECK(cudaGetLastError());
  return 0;
}

int cuda_peer_ar_usable(const struct cuda_backend *cb, const void *x, size_t n) {
  return cb->peer_ar.max_bytes && cb->base.act_dtype == DTYPE_BF16 && n % 8 == 0 && ((uintptr_t)x & 15) == 0 &&
         n * 2 <= cb->peer_ar.max_bytes;
}

void cuda_peer_ar_free(struct cuda_backend *cb) {
  cudaFree(cb->peer_ar.stage);
  cudaFree(cb->peer_ar.flags);
  memset(&cb->peer_ar, 0, sizeof cb->peer_ar);
}

CUDA_PRELOAD_ANCHOR(allreduce)
