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
  return 0;
}

int cuda_all_reduce_sum(struct backend *be, void *x, size_t n) {
  struct cuda_backend *cb = cuda_be(be);
  if (!cb->nccl_comm)
    return ERR("all_reduce_sum before comm_init");
  ncclDataType_t t = be->act_dtype == DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
  NCCL_CHECK(ncclAllReduce(x, x, n, t, ncclSum, (ncclComm_t)cb->nccl_comm, cb->stream));
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
  if (cb->nccl_comm)
    ncclCommAbort((ncclComm_t)cb->nccl_comm);
  cb->nccl_comm = NULL;
}

void cuda_comm_free(struct cuda_backend *cb) {
  if (cb->nccl_comm)
    ncclCommDestroy((ncclComm_t)cb->nccl_comm);
  cb->nccl_comm = NULL;
}
#else
void cuda_comm_free(struct cuda_backend *cb) { (void)cb; }
#endif
