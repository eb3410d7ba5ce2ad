/* cuda_module.c - the entry point of libpagoda-cuda.so and the host services its code reaches
 * through util/log.h: err_set/log_msg here forward to the host's functions (given at init), so
 * an error inside the module lands in the host's thread-local last error. Only
 * pagoda_backend_module_init is exported; the module is built with -fvisibility=hidden. */
#include <stdarg.h>

#include "backend/backend.h"
#include "util/log.h"

int cuda_backend_available(void);
struct backend *cuda_backend_create(const struct backend_params *p);

static const struct backend_host *g_host;

int err_vset(const char *file, int line, const char *fmt, va_list ap) { return g_host->err_vset(file, line, fmt, ap); }

int err_set(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  g_host->err_vset(file, line, fmt, ap);
  va_end(ap);
  return -1;
}

enum log_level log_get_level(void) { return g_host->log_get_level(); }

void log_vmsg(enum log_level level, const char *fmt, va_list ap) { g_host->log_vmsg(level, fmt, ap); }

void log_msg(enum log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  g_host->log_vmsg(level, fmt, ap);
  va_end(ap);
}

static const struct backend_module g_module = {
    .abi_version = BACKEND_ABI_VERSION,
    .ops_size = sizeof(struct backend_ops),
    .name = "cuda",
    .available = cuda_backend_available,
    .create = cuda_backend_create,
};

__attribute__((visibility("default"))) const struct backend_module *
pagoda_backend_module_init(const struct backend_host *host) {
  if (!host || host->abi_version != BACKEND_ABI_VERSION || host->ops_size != sizeof(struct backend_ops))
    return NULL;
  g_host = host;
  return &g_module;
}
