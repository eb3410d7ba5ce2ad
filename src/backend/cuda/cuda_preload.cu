/* cuda_preload.cu - loads pagoda's own kernels on a background thread while the weights go up,
 * when CUDA loads kernels lazily.
 *
 * Why: with lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA's default since 12.2, or whenever the
 * program started CUDA before pagoda, as torch does) a kernel is loaded on its first launch, and
 * that launch waits for it. The backend has 974 kernels (template instances over block sizes, head
 * dims, batch sizes, dtypes), most of which a server first meets mid-run: first-request TTFT was
 * 185-288 ms against about 20 ms, and 1B 64 x (512, 256) 53-58k against 73-74k tok/s
 * (bench/RESULTS.md, sessions 19-20). Eager loading (CUDA_MODULE_LOADING=EAGER, which the pagoda
 * command sets) removes the stalls but loads every kernel of every library in the process when the
 * context is created, cuBLAS's thousands included (1.7-4.5 s; the KV pool gets 0.43 GiB less), and a
 * program embedding pagoda may not be able to choose it. This loads only pagoda's kernels (36-37
 * MiB of device memory), off the critical path.
 *
 * How: a module here is one CUmodule per .cu file: the backend is built without separable
 * compilation (CMakeLists.txt, CUDA_SEPARABLE_COMPILATION OFF), so each file's device code is its
 * own fatbinary. Every .cu file with kernels ends with CUDA_PRELOAD_ANCHOR(name) (an empty kernel
 * and a function returning its address), and the names are listed in CUDA_PRELOAD_MODULES
 * (cuda_backend.h; tests/check_preload.sh checks both against the sources). The thread maps each
 * anchor to its module (cudaGetFuncBySymbol, cuFuncGetModule) and loads every function in it
 * (cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuFuncLoad). Those are driver entry points
 * of CUDA 12.4, reached through the runtime (cudaGetDriverEntryPointByVersion, CUDA 12.5), so
 * nothing links libcuda: a build with an older toolkit compiles preloading out, and a driver older
 * than 12.4 leaves it off (the start-up line says which).
 *
 * Rules:
 * - The thread starts at the end of cuda_init (the context exists, the weights are not up yet),
 *   only under lazy loading, with every entry point found, and unless PAGODA_CUDA_PRELOAD=0 (for
 *   measuring it).
 * - A module whose code for this GPU would be compiled from PTX at load (a GPU newer than the
 *   build's architectures) is skipped: loading all its kernels would cost what eager loading
 *   does, while lazy loading compiles only those a run uses.
 * - cuda_preload_join waits for the thread, from cuda_reserve (before the profiling step measures
 *   free memory, so the KV pool is sized with the kernels resident, and before any step runs:
 *   kernels that ran while it loaded took up to 13% longer, bench/RESULTS.md, session 20; so the
 *   benchmarks that drive ops directly call reserve first) and from cuda_destroy. Graph
 *   capture needs no join: it is thread-local (cuda_graph.cu), so the thread's calls cannot
 *   invalidate it.
 * - Preloading is an optimization: a failure leaves the rest of the kernels to load on first use,
 *   as without it, and is logged at debug level with what was loaded. */
#include "backend/cuda/cuda_backend.h"

#include <cuda.h> /* CUfunction, CUmodule, CUmoduleLoadingMode: types only (entry points via the runtime) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if CUDART_VERSION >= 12050
#define DECLARE_ANCHOR(name) extern "C" const void *cuda_preload_anchor_##name(void);
CUDA_PRELOAD_MODULES(DECLARE_ANCHOR)
#define LIST_ANCHOR(name) {#name, cuda_preload_anchor_##name},
static const struct {
  const char *name;
  const void *(*anchor)(void);
} preload_modules[] = {CUDA_PRELOAD_MODULES(LIST_ANCHOR)};
#define NUM_PRELOAD_MODULES (int)(sizeof preload_modules / sizeof preload_modules[0])

typedef CUresult (*get_module_fn)(CUmodule *, CUfunction);
typedef CUresult (*count_fn)(unsigned *, CUmodule);
typedef CUresult (*enumerate_fn)(CUfunction *, unsigned, CUmodule);
typedef CUresult (*load_fn)(CUfunction);

struct cuda_preload {
  pthread_t thread;
  int device, arch;             /* the GPU, and its compute capability as major * 10 + minor */
  get_module_fn get_module;     /* the driver entry points, found before the thread starts */
  count_fn count;
  enumerate_fn enumerate;
  load_fn load;
  int num_modules, num_kernels; /* loaded by the thread */
  int num_jit;                  /* modules skipped: their code would be compiled from PTX */
  double ms;                    /* the thread's time */
  char err[192];                /* the first failure, or empty */
};

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

/* Loads every function of module I (found through its anchor); 0, or -1 with pl->err set. */
static int preload_module(struct cuda_preload *pl, int i) {
  const void *anchor = preload_modules[i].anchor();
  cudaFuncAttributes fa;
  cudaFunction_t fn;
  if (cudaFuncGetAttributes(&fa, anchor) != cudaSuccess || cudaGetFuncBySymbol(&fn, anchor) != cudaSuccess) {
    cudaGetLastError(); /* no code for this GPU (the sm_90a-only module elsewhere): none of it runs */
    return 0;
  }
  if (fa.binaryVersion != pl->arch) { /* compiled from PTX at load: leave it to first use */
    pl->num_jit++;
    return 0;
  }
  CUmodule mod;
  unsigned n = 0;
  CUresult r = pl->get_module(&mod, (CUfunction)fn);
  if (r == CUDA_SUCCESS)
    r = pl->count(&n, mod);
  if (r == CUDA_SUCCESS) {
    CUfunction *fns = (CUfunction *)malloc(sizeof(CUfunction) * (n ? n : 1));
    if (!fns) {
      snprintf(pl->err, sizeof pl->err, "module %s: out of memory", preload_modules[i].name);
      return -1;
    }
    r = pl->enumerate(fns, n, mod);
    for (unsigned f = 0; f < n && r == CUDA_SUCCESS; f++)
      r = pl->load(fns[f]);
    free(fns);
  }
  if (r != CUDA_SUCCESS) {
    snprintf(pl->err, sizeof pl->err, "module %s: driver error %d", preload_modules[i].name, (int)r);
    return -1;
  }
  pl->num_modules++;
  pl->num_kernels += (int)n;
  return 0;
}

static void *preload_main(void *arg) {
  struct cuda_preload *pl = (struct cuda_preload *)arg;
  const double t0 = now_ms();
  cudaError_t e = cudaSetDevice(pl->device);
  if (e != cudaSuccess) {
    snprintf(pl->err, sizeof pl->err, "%s", cudaGetErrorString(e));
    cudaGetLastError();
  }
  for (int i = 0; e == cudaSuccess && i < NUM_PRELOAD_MODULES; i++)
    if (preload_module(pl, i))
      break;
  pl->ms = now_ms() - t0;
  return NULL;
}

extern "C" const char *cuda_preload_start(struct cuda_backend *cb) {
  if (!cb->preload_on)
    return "PAGODA_CUDA_PRELOAD=0";
  if (cuda_loading_lazy() != 1)
    return "kernels not loaded lazily";
  struct cuda_preload *pl = (struct cuda_preload *)calloc(1, sizeof *pl);
  if (!pl)
    return "out of memory";
  pl->get_module = (get_module_fn)driver_fn("cuFuncGetModule");
  pl->count = (count_fn)driver_fn("cuModuleGetFunctionCount");
  pl->enumerate = (enumerate_fn)driver_fn("cuModuleEnumerateFunctions");
  pl->load = (load_fn)driver_fn("cuFuncLoad");
  int major = 0, minor = 0;
  if (!pl->get_module || !pl->count || !pl->enumerate || !pl->load) {
    free(pl);
    return "the NVIDIA driver is older than CUDA 12.4";
  }
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cb->device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cb->device) != cudaSuccess) {
    cudaGetLastError();
    free(pl);
    return "the compute capability is unknown";
  }
  pl->device = cb->device;
  pl->arch = major * 10 + minor;
  if (pthread_create(&pl->thread, NULL, preload_main, pl) != 0) {
    free(pl);
    return "no thread";
  }
  cb->preload = pl;
  return NULL;
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
  log_debug("cuda: %d kernels of %d modules loaded in the background in %.0f ms (%.0f ms of it waited for)%s",
            pl->num_kernels, pl->num_modules, pl->ms, now_ms() - t0,
            pl->num_jit ? "; modules compiled from PTX left to first use" : "");
  free(pl);
}
#else
extern "C" int cuda_loading_lazy(void) { return -1; }
extern "C" const char *cuda_preload_start(struct cuda_backend *cb) {
  (void)cb;
  return "pagoda was built with a CUDA toolkit older than 12.5";
}
extern "C" void cuda_preload_join(struct cuda_backend *cb) { (void)cb; }
#endif
