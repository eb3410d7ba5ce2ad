/* log.c - stderr logging with a level filter, and a thread-local last-error buffer. */
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

static void init_level(void) {
  const char *e = getenv("PAGODA_LOG");
  g_level = LOG_LEVEL_INFO;
  if (!e)
    return;
  if (!strcmp(e, "debug"))
    g_level = LOG_LEVEL_DEBUG;
  else if (!strcmp(e, "warn"))
    g_level = LOG_LEVEL_WARN;
  else if (!strcmp(e, "error"))
    g_level = LOG_LEVEL_ERROR;
}

void log_set_level(enum log_level level) { g_level = (int)level; }

enum log_level log_get_level(void) {
  if (g_level < 0)
    init_level();
  return (enum log_level)g_level;
}

void log_vmsg(enum log_level level, const char *fmt, va_list ap) {
  if ((int)level < (int)log_get_level())
    return;
  static const char *names[] = {"debug", "info", "warn", "error"};
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  fprintf(stderr, "[pagoda %s] %s\n", names[level], buf);
}

void log_msg(enum log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vmsg(level, fmt, ap);
  va_end(ap);
}

static _Thread_local char t_msg[1024];
static _Thread_local char t_where[1280];

int err_vset(const char *file, int line, const char *fmt, va_list ap) {
  vsnprintf(t_msg, sizeof t_msg, fmt, ap);
  const char *base = strrchr(file, '/');
  snprintf(t_where, sizeof t_where, "%s:%d: %s", base ? base + 1 : file, line, t_msg);
  return -1;
}

int err_set(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  err_vset(file, line, fmt, ap);
  va_end(ap);
  return -1;
}

const char *err_last(void) { return t_msg[0] ? t_msg : "unknown error"; }
const char *err_last_where(void) { return t_where[0] ? t_where : "unknown error"; }

void err_clear(void) {
  t_msg[0] = 0;
  t_where[0] = 0;
}
