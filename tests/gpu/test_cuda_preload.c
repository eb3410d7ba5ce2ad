/* test_cuda_preload.c - kernel preloading under lazy loading (src/backend/cuda/cuda_preload.cu),
 * as a user sees it in the log: in a process whose CUDA loads kernels lazily
 * (CUDA_MODULE_LOADING=LAZY, set before CUDA starts), creating the CUDA backend says on its
 * start-up line that pagoda's kernels are loading in the background, and reserve (which waits for
 * the thread) logs at debug level that it loaded the kernels of every module built for this GPU
 * (all 12 on compute capability 9.0, where the sm_90a-only module runs; at least 11 elsewhere)
 * and hundreds of kernels; a second backend created with PAGODA_CUDA_PRELOAD=0 says it did not
 * preload, and why. stderr is captured into a temporary file for the checks. Skipped without a
 * GPU, and when this driver or build cannot preload (the start-up line gives the reason). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "test_util.h"
#include "util/log.h"

/* Creates a CUDA backend, reserves (joining the preloading thread) and destroys it; 0 or -1. */
static int create_reserve_destroy(void) {
  struct backend *be = backend_create(&(struct backend_params){.device = "cuda"});
  if (!be)
    return -1;
  int rc = be->ops->reserve ? be->ops->reserve(be, 16, 4, 8) : 0;
  be->ops->destroy(be);
  return rc;
}

int main(void) {
  setenv("CUDA_MODULE_LOADING", "LAZY", 1); /* before CUDA starts: the backend module is not loaded yet */
  unsetenv("PAGODA_CUDA_PRELOAD");
  log_set_level(LOG_LEVEL_DEBUG);
  char path[] = "/tmp/pagoda_test_preload_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0)
    return test_skip("cannot create a temporary file for stderr");
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  int rc1 = create_reserve_destroy();
  const char *err1 = rc1 ? err_last() : "";
  char why1[512];
  snprintf(why1, sizeof why1, "%s", err1);
  setenv("PAGODA_CUDA_PRELOAD", "0", 1);
  int rc2 = rc1 ? -1 : create_reserve_destroy();
  unsetenv("PAGODA_CUDA_PRELOAD");
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  size_t len = 0;
  char *log = test_read_file(path, &len);
  unlink(path);
  if (!log)
    return test_skip("cannot read the captured stderr back");
  fputs(log, stderr); /* what the backends said, for the test's own log */
  if (rc1) {
    free(log);
    return test_skip(why1[0] ? why1 : "no CUDA backend");
  }
  const char *bg = strstr(log, "pagoda's kernels loading in the background");
  const char *off = strstr(log, "not preloaded: ");
  if (!bg && off && strncmp(off + strlen("not preloaded: "), "PAGODA_CUDA_PRELOAD=0", 21) != 0) {
    /* the first backend could not preload (driver or toolkit): nothing to check here */
    free(log);
    return test_skip("this driver or build cannot preload kernels (see the start-up line above)");
  }
  CHECK(bg != NULL, "the first backend's start-up line does not say its kernels load in the background");
  const char *done = strstr(log, " modules loaded in the background in ");
  int kernels = 0, modules = 0;
  if (done) {
    const char *p = done;
    while (p > log && p[-1] != '\n' && p[-1] != ']')
      p--;
    CHECK(sscanf(p, " cuda: %d kernels of %d modules", &kernels, &modules) == 2, "cannot read the preload line");
  }
  CHECK(done != NULL, "reserve did not log the end of preloading");
  CHECK(!strstr(log, "preloading kernels stopped"), "preloading stopped on an error");
  CHECK(modules >= 11 && modules <= 12, "%d modules preloaded, expected 12 (11 without the sm_90a one)", modules);
  CHECK(kernels >= 500, "only %d kernels preloaded", kernels);
  CHECK(rc2 == 0, "the backend with PAGODA_CUDA_PRELOAD=0 failed");
  CHECK(strstr(log, "not preloaded: PAGODA_CUDA_PRELOAD=0") != NULL,
        "the backend with PAGODA_CUDA_PRELOAD=0 does not say so on its start-up line");
  printf("preloaded %d kernels of %d modules\n", kernels, modules);
  free(log);
  return test_finish("test_cuda_preload");
}
