/* cuda_pdl.cuh - programmatic dependent launch (Hopper PDL) for the kernels of a decode step.
 *
 * A kernel launched with cuda_pdl_launch (cudaLaunchAttributeProgrammaticStreamSerialization,
 * when cb->pdl is on) may start while the kernel before it on the stream is still running: as
 * soon as every block of that earlier kernel has executed pdl_trigger() (or exited). Its blocks
 * then do what depends on no earlier kernel (a GEMV loads its first weight steps into registers,
 * L2 or shared memory: the weights never change during a step) and call pdl_wait(), which returns once the earlier
 * kernel has completed and its writes are visible. This hides the launch, the ramp-up and the
 * first loads of each kernel behind the tail of the one before. It works inside CUDA-graph
 * capture (the edges become programmatic).
 *
 * INVARIANT (every kernel launched through cuda_pdl_launch keeps it):
 *   1. a thread calls pdl_wait() before it reads anything an earlier kernel (or copy) of the
 *      stream may have written (activations, the KV cache, batch metadata, sampled ids) and
 *      before its first global or shared-with-other-kernels write; before the wait it may read
 *      only memory no kernel writes during a step (weights, norm weights, rope frequencies);
 *   2. at least one thread of every launched grid calls pdl_wait() (threads with nothing to do
 *      may exit without it; every other one waits);
 *   3. the batch metadata (query starts, sequence lengths, positions, slots, block tables) and the
 *      KV cache of earlier steps may also be read before the wait, by every kernel but a step's
 *      first: the host copies the metadata before that first kernel, which waits for the copy in
 *      full (a copy is no kernel, so no early launch), and a kernel starts only after the one
 *      before it started, so every later kernel starts after the copy completed. Within a step
 *      no kernel writes them but the q/k/v kernels (this step's keys and values, which a kernel
 *      may only prefetch into L2 before the wait: L2 is where every SM's writes land, so the
 *      load after the wait sees them); the copy-on-write block copies are device-to-device
 *      copies issued before the metadata's, so waited for in full the same way.
 * So a kernel completes only after its predecessor completed; ordering stays transitive, and a
 * kernel launched the ordinary way (cuBLAS, NCCL, a kernel not converted yet, a copy) after a
 * PDL kernel waits for it as usual. pdl_trigger() only lets the next kernel be scheduled (it
 * says nothing about this kernel's writes); it comes right AFTER the kernel's pdl_wait(), so at
 * most one kernel runs ahead: triggering first thing let a chain of kernels (norm, GEMV, rope,
 * attention, the next GEMV...) launch at once and sit on the SMs, prefetching and waiting, which
 * made the 1B step 3% slower than no PDL at all (bench/RESULTS.md, "Programmatic dependent
 * launch"). The exception is pdl_enter(1), for a short kernel of little DRAM traffic just before a
 * GEMV (the integer-dot GEMV's x quantization, decode attention): it triggers first, so the GEMV's
 * first weight loads overlap the drain of the kernel before (bench/RESULTS.md, "Batch-1 decode:
 * early triggers ...").
 *
 * Both instructions are no-ops when the kernel was launched without the attribute (PAGODA_PDL=0,
 * or a GPU below compute capability 9.0), so the arithmetic, and the output, is the same either
 * way.
 *
 * Applying it to a kernel: call pdl_wait() per the invariant and pdl_trigger() right after it
 * (PDL_ENTER() does both, first thing, for kernels with nothing to prefetch), and replace
 * `k<<<grid, block, smem, stream>>>(args...)` by
 * `CUDA_CHECK(cuda_pdl_launch(cb, k, grid, block, smem, args...))`. */
#ifndef PAGODA_CUDA_PDL_CUH
#define PAGODA_CUDA_PDL_CUH

#include <utility>

#include "backend/cuda/cuda_backend.h"

/* Lets the next kernel on the stream start once every block of this one has called it. */
__device__ __forceinline__ void pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Returns once every earlier kernel of the stream has completed and its writes are visible. */
__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* For kernels that have nothing to do before the wait: wait, then let the next kernel launch. */
#define PDL_ENTER() \
  do {              \
    pdl_wait();     \
    pdl_trigger();  \
  } while (0)

/* PDL_ENTER with the order chosen at run time: EARLY triggers before the wait, so the next kernel
 * (a GEMV) launches as soon as this one has, and its blocks take the SMs as the kernel before this
 * one drains, their weight loads (issued before their own wait) overlapping that tail. For short
 * kernels whose own DRAM traffic is small (the x quantization of the integer-dot GEMV, decode
 * attention; cb->qx_early, cb->attn_early). Then two kernels run ahead of the one that streams,
 * not one (three with PAGODA_ATTN_EARLY=1 on quantized weights: attention, the early x
 * quantization, its GEMV): the GEMV still triggers after its wait, so the chain stops there. */
__device__ __forceinline__ void pdl_enter(int early) {
  if (early)
    pdl_trigger();
  pdl_wait();
  if (!early)
    pdl_trigger();
}

/* KERNEL<<<GRID, BLOCK, SMEM, cb->stream>>>(ARGS...), with the programmatic-serialization
 * attribute when cb->pdl is on, in thread block clusters of (1, CLUSTER_Y, 1) blocks when
 * CLUSTER_Y > 1 (GRID.y a multiple of it; compute capability 9.0; sizes above 8 need the kernel's
 * non-portable cluster size attribute). Returns the launch's error (check it with CUDA_CHECK). */
template <typename... KArgs, typename... Args>
static inline cudaError_t cuda_pdl_launch_cluster(const struct cuda_backend *cb, void (*kernel)(KArgs...), dim3 grid,
                                                  dim3 block, size_t smem, int cluster_y, Args &&...args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cb->pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = (unsigned)cluster_y;
    attr[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = cb->stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t cuda_pdl_launch(const struct cuda_backend *cb, void (*kernel)(KArgs...), dim3 grid,
                                          dim3 block, size_t smem, Args &&...args) {
  return cuda_pdl_launch_cluster(cb, kernel, grid, block, smem, 1, std::forward<Args>(args)...);
}

#endif
