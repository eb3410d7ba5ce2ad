/* pagoda.h - the public C API of libpagoda: an LLM inference engine built around PagedAttention.
 * Plain C; opaque handles; every call returns a status (pagoda_status) or a value documented below. */
#ifndef PAGODA_H
#define PAGODA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PAGODA_VERSION "0.1.0"

enum pagoda_status {
  PAGODA_OK = 0,
  PAGODA_ERR_INVALID_ARG = 1,   /* a parameter or request is malformed */
  PAGODA_ERR_IO = 2,            /* a file could not be read */
  PAGODA_ERR_FORMAT = 3,        /* a file is malformed */
  PAGODA_ERR_UNSUPPORTED = 4,   /* valid but not supported (dtype, architecture) */
  PAGODA_ERR_OUT_OF_MEMORY = 5, /* host or device memory */
  PAGODA_ERR_TOO_LONG = 6,      /* a request can never fit (context or pool) */
  PAGODA_ERR_NOT_FOUND = 7,     /* unknown request id */
  PAGODA_ERR_BACKEND = 8,       /* a device call failed */
};

/* The message of the last error on this thread (a human sentence). */
const char *pagoda_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
