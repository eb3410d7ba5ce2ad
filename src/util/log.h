/* log.h - logging to stderr and the per-thread "last error" used by status returns. */
#ifndef PAGODA_LOG_H
#define PAGODA_LOG_H

#include <stdarg.h>

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* Messages below this level are dropped (default INFO; PAGODA_LOG=debug|info|warn|error). */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vmsg(enum log_level level, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)

/* Records a human-readable error for this thread (prefixed by file:line) and returns -1, so
 * request-path code can `return ERR("bad token id %d", id);`. err_last() reads it back. */
int err_set(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int err_vset(const char *file, int line, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
#define ERR(...) err_set(__FILE__, __LINE__, __VA_ARGS__)
/* TRY(call): returns -1 from the enclosing function when CALL returns nonzero (CALL has set the
 * error), e.g. the chain of backend ops of a forward pass. */
#define TRY(call)  \
  do {             \
    if ((call))    \
      return -1;   \
  } while (0)
/* The message without the file:line prefix (for users), and with it (for logs). */
const char *err_last(void);
const char *err_last_where(void);
void err_clear(void);

#endif
