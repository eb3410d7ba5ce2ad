/* cuda_preload.cu - loads pagoda's own kernels on a background thread while the weights go up,
 * when CUDA loads kernels lazily.
 *
 * Why: with lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA's default since 12.2, or whenever the
 * program started CUDA before pagoda, as torch does) a kernel is loaded on its first launch, and
 * that launch waits for it. pagoda has hundreds of kernel instances (one per block size, head dim,
 * batch size, dtype), most of which a server first meets mid-run: first-request TTFT was 206-283 ms
 * against 18-22 ms, and 1B 64 x (512, 256) 54-56k against 74-75k tok/s (bench/RESULTS.md, session
 * 19). Eager loading (CUDA_MODULE_LOADING=EAGER, set by the pagoda command) removes the stalls but
 * loads every kernel of every library in the process at context creation, cuBLAS's thousands
 * included (2-3 s, about 0.48 GiB of device memory), and a program embedding pagoda may not be able
 * to choose it. This loads only pagoda's modules, off the critical path.
 *
 * How: every .cu file of the backend with kernels ends with CUDA_PRELOAD_ANCHOR(name) (an empty
 * kernel and a function returning its address; the list is CUDA_PRELOAD_MODULES in
 * cuda_backend.h). Without separable compilation each file is one module, so the thread maps each
 * anchor to its module (cudaGetFuncBySymbol, cuFuncGetModule) and loads every function of the
 * module (cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuFuncLoad; CUDA 12.4 driver
 * entry points, reached through the runtime so that nothing links libcuda).
 *
 * Rules: the thread starts at the end of cuda_init (the context exists, the weights are not up yet)
 * and only under lazy loading; cuda_preload_join waits for it, from cuda_reserve (before the
 * profiling step measures free memory, so the modules' memory is counted before the KV pool is
 * sized, and before any graph capture) and from cuda_destroy. Preloading is an optimization: any
 * failure leaves the kernels to load on first use, as without it, and is logged at debug level.
 * PAGODA_CUDA_PRELOAD=0 turns it off (for measuring it). */
#include "backend/cuda/cuda_backend.h"

#include <cuda.h> /* CUfunction, CUmodule, CUmoduleLoadingMode: types only (entry points via the runtime) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct cuda_preload {
  pthread_t thread;
  int device;
  int num_modules, num_kernels; /* loaded by the thread */
  double ms;                    /* the thread's time */
  char err[192];                /* the first failure, or empty */
};

#if CUDART_VERSION >= 12050
#define DECLARE_ANCHOR(name) extern "C" const void *cuda_preload_anchor_##name(void);
CUDA_PRELOAD_MODULES(DECLARE_ANCHOR)
#define LIST_ANCHOR(name) {#name, cuda_preload_anchor_##name},
static const struct {
  const char *name;
  const void *(*anchor)(void);
} preload_modules[] = {CUDA_PRELOAD_MODULES(LIST_ANCHOR)};
#define NUM_PRELOAD_MODULES (int)(sizeof preload_modules / sizeof preload_modules[0])

/* A driver entry point of at least CUDA 12.4 through the runtime, or NULL. */
static void *driver_fn(const char *name) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12040, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return fn;
}

extern "C" int cuda_loading_lazy(void) {
  typedef CUresult (*get_mode_fn)(CUmoduleLoadingMode *);
  get_mode_fn get_mode = (get_mode_fn)driver_fn("cuModuleGetLoadingMode");
  CUmoduleLoadingMode mode;
  if (!get_mode || get_mode(&mode) != CUDA_SUCCESS)
    return -1;
  return mode == CU_MODULE_LAZY_LOADING;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *preload_main(void *arg) {
  struct cuda_preload *pl = (struct cuda_preload *)arg;
  const double t0 = now_ms();
  typedef CUresult (*get_module_fn)(CUmodule *, CUfunction);
  typedef CUresult (*count_fn)(unsigned *, CUmodule);
  typedef CUresult (*enumerate_fn)(CUfunction *, unsigned, CUmodule);
  typedef CUresult (*load_fn)(CUfunction);
  get_module_fn get_module = (get_module_fn)driver_fn("cuFuncGetModule");
  count_fn count = (count_fn)driver_fn("cuModuleGetFunctionCount");
  enumerate_fn enumerate = (enumerate_fn)driver_fn("cuModuleEnumerateFunctions");
  load_fn load = (load_fn)driver_fn("cuFuncLoad");
  if (!get_module || !count || !enumerate || !load) {
    snprintf(pl->err, sizeof pl->err, "the driver lacks cuModuleEnumerateFunctions / cuFuncLoad (CUDA 12.4)");
    return NULL;
  }
  cudaError_t e = cudaSetDevice(pl->device);
  for (int i = 0; e == cudaSuccess && i < NUM_PRELOAD_MODULES; i++) {
    cudaFunction_t anchor;
    CUmodule mod;
    unsigned n = 0;
    if ((e = cudaGetFuncBySymbol(&anchor, preload_modules[i].anchor())) != cudaSuccess) {
      /* no image for this device (the sm_90a-only module elsewhere): nothing of it will run */
      cudaGetLastError();
      e = cudaSuccess;
      continue;
    }
    CUresult r = get_module(&mod, (CUfunction)anchor);
    if (r == CUDA_SUCCESS)
      r = count(&n, mod);
    CUfunction *fns = r == CUDA_SUCCESS ? (CUfunction *)malloc(sizeof(CUfunction) * (n ? n : 1)) : NULL;
    if (fns && (r = enumerate(fns, n, mod)) == CUDA_SUCCESS)
      for (unsigned f = 0; f < n && r == CUDA_SUCCESS; f++)
        r = load(fns[f]);
    free(fns);
    if (r != CUDA_SUCCESS || !fns) {
      snprintf(pl->err, sizeof pl->err, "module %s: driver error %d", preload_modules[i].name, (int)r);
      break;
    }
    pl->num_modules++;
    pl->num_kernels += (int)n;
  }
  if (e != cudaSuccess) {
    snprintf(pl->err, sizeof pl->err, "%s", cudaGetErrorString(e));
    cudaGetLastError();
  }
  pl->ms = now_ms() - t0;
  return NULL;
}

extern "C" void cuda_preload_start(struct cuda_backend *cb) {
  const char *v = getenv("PAGODA_CUDA_PRELOAD");
  if ((v && !strcmp(v, "0")) || cuda_loading_lazy() != 1)
    return;
  struct cuda_preload *pl = (struct cuda_preload *)calloc(1, sizeof *pl);
  if (!pl)
    return;
  pl->device = cb->device;
  if (pthread_create(&pl->thread, NULL, preload_main, pl) != 0) {
    free(pl);
    return;
  }
  cb->preload = pl;
}

extern "C" void cuda_preload_join(struct cuda_backend *cb) {
  struct cuda_preload *pl = cb->preload;
  if (!pl)
    return;
  const double t0 = now_ms();
  pthread_join(pl->thread, NULL);
  cb->preload = NULL;
  if (pl->err[0])
    log_debug("cuda: preloading kernels stopped (%s): the rest load on first use", pl->err);
  log_debug("cuda: %d kernels of %d modules loaded in the background in %.0f ms (%.0f ms of it waited for)",
            pl->num_kernels, pl->num_modules, pl->ms, now_ms() - t0);
  free(pl);
}
#else
extern "C" int cuda_loading_lazy(void) { return -1; }
extern "C" void cuda_preload_start(struct cuda_backend *cb) { (void)cb; }
extern "C" void cuda_preload_join(struct cuda_backend *cb) { (void)cb; }
#endif
