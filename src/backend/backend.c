/* backend.c - picks the backend for a device name. */
#include "backend/backend.h"

#include <string.h>

#include "util/log.h"

struct backend *backend_create(const struct backend_params *p) {
  const char *dev = p && p->device ? p->device : NULL;
#ifdef PAGODA_HAVE_CUDA
  if (!dev)
    dev = backend_cuda_available() ? "cuda" : "cpu";
  if (strcmp(dev, "cuda") == 0)
    return backend_cuda_create();
#else
  if (!dev)
    dev = "cpu";
  if (strcmp(dev, "cuda") == 0) {
    ERR("--device cuda: this build of pagoda has no CUDA backend (nvcc was not found at build time)");
    return NULL;
  }
#endif
  if (strcmp(dev, "cpu") == 0)
    return backend_cpu_create(p ? p->n_threads : 0);
  ERR("--device %s: unknown device (use cpu or cuda)", dev);
  return NULL;
}
