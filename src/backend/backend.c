/* backend.c - picks the backend for a device name; loads device backends (cuda) as modules with
 * dlopen on first use, so libpagoda and the CLI run on machines without the CUDA libraries. */
#include "backend/backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"

static const struct backend_host g_host = {
    .abi_version = BACKEND_ABI_VERSION,
    .ops_size = sizeof(struct backend_ops),
    .err_vset = err_vset,
    .log_vmsg = log_vmsg,
    .log_get_level = log_get_level,
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct backend_module *g_cuda; /* loaded once, never unloaded */

/* Appends FMT (two string arguments) to the NUL-terminated BUF of SIZE bytes, cut when full. */
static void append(char *buf, size_t size, const char *fmt, const char *a, const char *b) {
  size_t n = strlen(buf);
  if (n + 1 < size)
    snprintf(buf + n, size - n, fmt, a, b);
}

static void dir_of(char *path) {
  char *slash = strrchr(path, '/');
  if (slash)
    *slash = 0;
}

/* Tries one candidate file; on success sets *MOD. TRIED collects "path (why)" for the error. */
static int try_module(const char *file, const struct backend_module **mod, char *tried, size_t size) {
  if (access(file, F_OK) != 0) {
    append(tried, size, "%s%s (not found)", tried[0] ? ", " : "", file);
    return -1;
  }
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    append(tried, size, "%s%s", tried[0] ? ", " : "", file);
    append(tried, size, " (%s%s)", why ? why : "dlopen failed",
           why && strstr(why, "libcu") ? ": the CUDA runtime libraries are not installed or not on the "
                                         "library path"
                                       : "");
    return -1;
  }
  backend_module_init_fn init = (backend_module_init_fn)(uintptr_t)dlsym(h, BACKEND_MODULE_INIT);
  const struct backend_module *m = init ? init(&g_host) : NULL;
  if (!m || m->abi_version != BACKEND_ABI_VERSION || m->ops_size != sizeof(struct backend_ops)) {
    append(tried, size, "%s%s", tried[0] ? ", " : "", file);
    append(tried, size, " (%s%s)", init ? "built from another version of pagoda" : "no entry point ",
           init ? "" : BACKEND_MODULE_INIT);
    dlclose(h);
    return -1;
  }
  *mod = m;
  return 0;
}

/* Finds and loads libpagoda-NAME.so (search order in backend.h). NULL with err_last() set. */
static const struct backend_module *load_module(const char *name) {
  char file[PATH_MAX + 128], dir[PATH_MAX], tried[900] = "";
  const struct backend_module *m = NULL;
  char base[64];
  snprintf(base, sizeof base, "libpagoda-%s.so", name);
  /* 1. next to the executable */
  ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
  char exe_dir[PATH_MAX] = "";
  if (n > 0) {
    dir[n] = 0;
    dir_of(dir);
    snprintf(exe_dir, sizeof exe_dir, "%s", dir);
    snprintf(file, sizeof file, "%s/%s", dir, base);
    if (try_module(file, &m, tried, sizeof tried) == 0)
      return m;
  }
  /* 2. next to libpagoda.so, when this code lives there */
  Dl_info info;
  if (dladdr((void *)(uintptr_t)backend_create, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    char lib[PATH_MAX];
    if (realpath(info.dli_fname, lib)) {
      dir_of(lib);
      if (strcmp(lib, exe_dir) != 0) {
        snprintf(file, sizeof file, "%s/%s", lib, base);
        if (try_module(file, &m, tried, sizeof tried) == 0)
          return m;
      }
    }
  }
  /* 3. the install layout: PREFIX/bin/pagoda with PREFIX/lib/libpagoda-NAME.so */
  if (exe_dir[0]) {
    snprintf(file, sizeof file, "%s/../lib/%s", exe_dir, base);
    if (try_module(file, &m, tried, sizeof tried) == 0)
      return m;
  }
  /* 4. PAGODA_BACKEND_PATH: directories or files, colon-separated */
  const char *env = getenv("PAGODA_BACKEND_PATH");
  for (const char *p = env; p && *p;) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len > 0 && len < sizeof dir) {
      memcpy(dir, p, len);
      dir[len] = 0;
      size_t bl = strlen(base);
      if (len >= bl && strcmp(dir + len - bl, base) == 0)
        snprintf(file, sizeof file, "%s", dir);
      else
        snprintf(file, sizeof file, "%s/%s", dir, base);
      if (try_module(file, &m, tried, sizeof tried) == 0)
        return m;
    }
    p = end ? end + 1 : p + len;
  }
  ERR("cannot load %s: tried %s; PAGODA_BACKEND_PATH (directories holding it) %s%s", base, tried,
      env ? "is " : "is not set", env ? env : "");
  return NULL;
}

static const struct backend_module *cuda_module(void) {
  pthread_mutex_lock(&g_lock);
  const struct backend_module *m = g_cuda ? g_cuda : (g_cuda = load_module("cuda"));
  pthread_mutex_unlock(&g_lock);
  return m;
}

int backend_device_available(const char *device) {
  if (!strcmp(device, "cpu"))
    return 1;
  if (strcmp(device, "cuda") != 0)
    return ERR("unknown device '%s' (use cpu or cuda)", device), 0;
  const struct backend_module *m = cuda_module();
  return m && m->available();
}

/* err_last() with "--device cuda: " and a hint in front; the message is copied first since
 * err_set writes the buffer err_last() reads. */
static void err_device(const char *what) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", err_last());
  ERR("--device cuda: %s: %s; use --device cpu", what, msg);
}

struct backend *backend_create(const struct backend_params *p) {
  const char *dev = p && p->device ? p->device : NULL;
  if (!dev) {
    dev = backend_device_available("cuda") ? "cuda" : "cpu";
    if (!strcmp(dev, "cpu"))
      log_debug("device: cpu (no cuda: %s)", err_last());
  }
  if (!strcmp(dev, "cuda")) {
    const struct backend_module *m = cuda_module();
    if (!m) {
#ifdef PAGODA_HAVE_CUDA
      err_device("the CUDA backend cannot be loaded");
#else
      err_device("this build of pagoda has no CUDA backend (nvcc was not found at build time)");
#endif
      return NULL;
    }
    if (!m->available()) {
      err_device("no usable GPU");
      return NULL;
    }
    return m->create(p);
  }
  if (!strcmp(dev, "cpu"))
    return backend_cpu_create(p ? p->num_threads : 0);
  ERR("--device %s: unknown device (use cpu or cuda)", dev);
  return NULL;
}
