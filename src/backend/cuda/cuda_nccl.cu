/* cuda_nccl.cu - tensor parallelism's collectives on the CUDA backend: one NCCL communicator
 * per backend (one per GPU), collectives enqueued on the backend's stream. Built with NCCL when
 * CMake found it (PAGODA_HAVE_NCCL); without it only cuda_comm_free exists and the ops table
 * leaves the collective ops NULL, so --tp > 1 is refused (docs/distributed.md). */
#include "cuda_backend.h"

#ifdef PAGODA_HAVE_NCCL
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == BACKEND_COMM_ID_BYTES, "BACKEND_COMM_ID_BYTES is NCCL's unique id size");

#define NCCL_CHECK(call)                                                                         \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess)                                                                       \
      return ERR("NCCL error %s (%s) in %s", ncclGetErrorString(r_), ncclGetLastError(NULL), #call); \
  } while (0)

int cuda_comm_id(struct backend *be, void *id) {
  (void)be;
  ncclUniqueId u;
  NCCL_CHECK(ncclGetUniqueId(&u));
  memcpy(id, &u, sizeof u);
  return 0;
}

int cuda_comm_init(struct backend *be, const void *id, int rank, int world) {
  struct cuda_backend *cb = cuda_be(be);
  if (cb->nccl_comm)
    return ERR("comm_init: this backend already has a communicator");
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  CUDA_CHECK(cudaSetDevice(cb->device));
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, world, u, rank));
  cb->nccl_comm = comm;
  cb->nccl_rank = rank;
  cb->nccl_world = world;
  return 0;
}

int cuda_all_reduce_sum(struct backend *be, void *x, size_t n) {
  struct cuda_backend *cb = cuda_be(be);
  if (cb->comm_aborted)
    return ERR("GPU %d: tensor parallelism was stopped (comm_abort): no more all-reduces", cb->device);
  if (cuda_peer_ar_usable(cb, x, n)) /* single process, small enough: the peer kernel */
    return cuda_peer_all_reduce(cb, x, n);
  if (!cb->nccl_comm)
    return ERR("all_reduce_sum before comm_init");
  /* NCCL captured into the ranks' CUDA graphs hung on 2 x H200 (one process, each rank capturing
   * on its own thread): a capture with an all-reduce beyond the peer all-reduce fails here instead,
   * before NCCL sees it, and the step runs directly (cuda_graph.cu) on every rank alike (the same
   * sizes on all of them) */
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(cb->stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) {
    log_info("cuda: GPU %d: an all-reduce of %zu bytes would take NCCL, which is never captured (the peer all-reduce "
             "takes up to %zu bytes: PAGODA_TP_CUSTOM_AR): this decode step runs without a CUDA graph", cb->device,
             n * (size_t)dtype_row_bytes(be->act_dtype, 1), cb->peer_ar.max_bytes);
    return ERR("all-reduce of %zu elements inside a CUDA graph capture: NCCL is not captured", n);
  }
  ncclDataType_t t = be->act_dtype == DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
  NCCL_CHECK(ncclAllReduce(x, x, n, t, ncclSum, (ncclComm_t)cb->nccl_comm, cb->stream));
  return 0;
}

/* out(rows, W * cols): column block k of row t from part k, part 0 = rank 0's own IN, part k > 0
 * = rank k's IN as received into SRC + k * rows * cols. */
__global__ void gather_cols_kernel(float *out, const float *in0, const float *src, int rows, int cols, int W) {
  size_t n = (size_t)rows * W * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / ((size_t)W * cols), rem = i % ((size_t)W * cols);
    int k = (int)(rem / cols);
    size_t j = rem % cols;
    out[i] = k == 0 ? in0[t * cols + j] : src[(size_t)k * rows * cols + t * cols + j];
  }
}

/* Rank 0 receives every other rank's block into SCRATCH (one ncclRecv each, grouped), then one
 * kernel interleaves the blocks into OUT; the other ranks ncclSend theirs. All on the stream. */
int cuda_gather_cols(struct backend *be, float *out, const float *in, float *scratch, int rows, int cols) {
  struct cuda_backend *cb = cuda_be(be);
  if (!cb->nccl_comm)
    return ERR("gather_cols before comm_init");
  if (rows < 0 || cols < 1)
    return ERR("gather_cols: %d rows of %d columns", rows, cols);
  if (rows == 0)
    return 0;
  ncclComm_t comm = (ncclComm_t)cb->nccl_comm;
  size_t n = (size_t)rows * cols;
  int W = cb->nccl_world;
  if (cb->nccl_rank != 0) {
    NCCL_CHECK(ncclSend(in, n, ncclFloat32, 0, comm, cb->stream));
    return 0;
  }
  if (!out || !scratch)
    return ERR("gather_cols: rank 0 needs its output and scratch buffers");
  NCCL_CHECK(ncclGroupStart());
  for (int k = 1; k < W; k++) {
    ncclResult_t r = ncclRecv(scratch + (size_t)k * n, n, ncclFloat32, k, comm, cb->stream);
    if (r != ncclSuccess) {
      ncclGroupEnd();
      NCCL_CHECK(r);
    }
  }
  NCCL_CHECK(ncclGroupEnd());
  size_t total = n * (size_t)W;
  unsigned blocks = (unsigned)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
  gather_cols_kernel<<<blocks, 256, 0, cb->stream>>>(out, in, scratch, rows, cols, W);
  CUDA_CHECK(cudaGetLastError());
  return 0;
}

int cuda_comm_check(struct backend *be) {
  struct cuda_backend *cb = cuda_be(be);
  if (!cb->nccl_comm)
    return 0;
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError((ncclComm_t)cb->nccl_comm, &async));
  if (async != ncclSuccess && async != ncclInProgress)
    return ERR("NCCL communicator of GPU %d failed: %s (%s)", cb->device, ncclGetErrorString(async),
               ncclGetLastError((ncclComm_t)cb->nccl_comm));
  return 0;
}

void cuda_comm_abort(struct backend *be) {
  struct cuda_backend *cb = cuda_be(be);
  /* no more collectives of any kind: the captured graphs hold peer all-reduces, so they are not
   * replayed either, and all_reduce_sum fails from now on (a peer kernel already running still
   * waits for its peers until its timeout: cuda_allreduce.cu) */
  cb->comm_aborted = 1;
  cb->graphs_on = 0;
  cb->peer_ar.max_bytes = 0;
  if (cb->nccl_comm)
    ncclCommAbort((ncclComm_t)cb->nccl_comm);
  cb->nccl_comm = NULL;
}

void cuda_comm_free(struct cuda_backend *cb) {
  if (cb->nccl_comm)
    ncclCommDestroy((ncclComm_t)cb->nccl_comm);
  cb->nccl_comm = NULL;
  cuda_peer_ar_free(cb);
}
#else
void cuda_comm_free(struct cuda_backend *cb) { cuda_peer_ar_free(cb); }
#endif

CUDA_PRELOAD_ANCHOR(nccl)
